//! kiln's forward pass against Hugging Face transformers (float32, CPU, eager attention).
//!
//! The fixtures in `tests/golden/` were generated with `scripts/gen-golden.py` (its header has
//! the exact pip command); nothing in kiln produced them. Each test opens a model with
//! `ModelFiles::open`, builds the CPU runner with `build_runner`, and runs `kiln probe`'s exact
//! path (`kiln::tools::probe::probe`):
//! - logits rows: max |Δ| ≤ [`LOGITS_TOL`];
//! - greedy continuations: equal until the first step where the reference's top-2 logits are
//!   within [`TIE_GAP`] of each other (from there a different argmax is float noise).
//!
//! The real model is `models/SmolLM2-135M-Instruct.Q4_1.gguf` (or env `KILN_TEST_MODEL`); it is
//! required, not optional: CI fetches it first (`kiln model fetch-default`). Run with
//! `cargo test --test golden -- --nocapture` to see the measured max |Δ| of every fixture.

use std::path::{Path, PathBuf};

use kiln::engine::{Device, EngineConfig};
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner;
use kiln::model::step::ModelRunner;
use kiln::tools::probe::{probe, Positions};
use serde::Deserialize;

/// Largest allowed |kiln − transformers| over every compared logit.
const LOGITS_TOL: f32 = 1e-3;
/// Top-2 reference logits closer than this make the argmax a tie for comparison purposes.
const TIE_GAP: f32 = 0.01;

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The real default model; panics (fails the test) when it is missing.
fn smollm2_path() -> PathBuf {
    let path = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run `kiln model fetch-default` (or set KILN_TEST_MODEL)",
        path.display()
    );
    path
}

fn read_json<T: serde::de::DeserializeOwned>(rel: &str) -> T {
    let path = crate_root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn runner_for(path: &Path) -> Box<dyn ModelRunner> {
    let files = ModelFiles::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let engine = EngineConfig {
        device: Device::Cpu,
        kv_cache_mib: 64,
        ..EngineConfig::default()
    };
    build_runner(&files, &engine.runner_options())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logits row lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits of `token_ids` at `positions` against the reference rows; returns the max |Δ|.
fn compare_logits(
    runner: &mut dyn ModelRunner,
    name: &str,
    token_ids: &[u32],
    positions: &[usize],
    want: &[Vec<f32>],
) -> f32 {
    let got = probe(runner, token_ids, &Positions::List(positions.to_vec()), 0).unwrap();
    let mut worst = 0.0f32;
    for ((pos, row), want) in got.logits.iter().zip(want) {
        let d = max_abs_diff(row, want);
        assert!(
            d <= LOGITS_TOL,
            "{name}: position {pos}: max |Δ| {d} > {LOGITS_TOL}"
        );
        worst = worst.max(d);
    }
    assert_eq!(got.logits.len(), want.len(), "{name}: rows");
    worst
}

/// Greedy continuation of `prompt` against the reference, up to its first near-tie. Returns
/// how many steps were compared.
fn compare_greedy(
    runner: &mut dyn ModelRunner,
    name: &str,
    prompt: &[u32],
    want: &[u32],
    top2_gap: &[f32],
) -> usize {
    let got = probe(runner, prompt, &Positions::Last, want.len())
        .unwrap()
        .greedy;
    assert_eq!(got.len(), want.len(), "{name}: greedy length");
    for step in 0..want.len() {
        if top2_gap[step] < TIE_GAP {
            return step;
        }
        assert_eq!(
            got[step], want[step],
            "{name}: greedy step {step} (reference gap {}): kiln {:?} vs transformers {:?}",
            top2_gap[step], got, want
        );
    }
    want.len()
}

#[derive(Deserialize)]
struct TinyFixture {
    model_path: String,
    cases: Vec<TinyCase>,
    greedy: Vec<GreedyCase>,
}

#[derive(Deserialize)]
struct TinyCase {
    token_ids: Vec<u32>,
    positions: Vec<usize>,
    logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct GreedyCase {
    #[serde(default)]
    name: Option<String>,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    top2_gap: Vec<f32>,
}

/// One tiny-model fixture: every logits case and every greedy case.
fn check_tiny(fixture: &str) {
    let f: TinyFixture = read_json(&format!("tests/golden/{fixture}.json"));
    let mut runner = runner_for(&crate_root().join(&f.model_path));
    let mut worst = 0.0f32;
    for (i, c) in f.cases.iter().enumerate() {
        let name = format!("{fixture} case {i}");
        worst = worst.max(compare_logits(
            runner.as_mut(),
            &name,
            &c.token_ids,
            &c.positions,
            &c.logits,
        ));
    }
    for (i, g) in f.greedy.iter().enumerate() {
        let name = format!(
            "{fixture} greedy {}",
            g.name.clone().unwrap_or_else(|| i.to_string())
        );
        let steps = compare_greedy(
            runner.as_mut(),
            &name,
            &g.prompt_ids,
            &g.greedy,
            &g.top2_gap,
        );
        println!("{name}: {steps}/{} greedy steps compared", g.greedy.len());
    }
    println!("{fixture}: max |Δ| logits = {worst:e}");
}

#[test]
fn tiny_llama_safetensors_f32() {
    check_tiny("tiny_llama");
}

#[test]
fn tiny_llama_safetensors_bf16() {
    check_tiny("tiny_llama_bf16");
}

#[test]
fn tiny_qwen3_safetensors_f32() {
    check_tiny("tiny_qwen3");
}

#[test]
fn tiny_llama_gguf_f32() {
    check_tiny("tiny_llama_gguf_f32");
}

#[test]
fn tiny_llama_gguf_q8_0() {
    check_tiny("tiny_llama_gguf_q8_0");
}

#[test]
fn tiny_llama_gguf_q4_0() {
    check_tiny("tiny_llama_gguf_q4_0");
}

#[test]
fn tiny_llama_gguf_q4_1() {
    check_tiny("tiny_llama_gguf_q4_1");
}

#[derive(Deserialize)]
struct SmolLogits {
    vocab_size: usize,
    cases: Vec<SmolLogitsCase>,
}

#[derive(Deserialize)]
struct SmolLogitsCase {
    name: String,
    token_ids: Vec<u32>,
    positions: Vec<usize>,
    logits_file: String,
}

#[derive(Deserialize)]
struct SmolGreedy {
    cases: Vec<GreedyCase>,
}

/// Little-endian f32 rows `[rows, vocab]` from `tests/golden/<file>`.
fn read_rows(file: &str, rows: usize, vocab: usize) -> Vec<Vec<f32>> {
    let path = crate_root().join("tests/golden").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len(), rows * vocab * 4, "{}: size", path.display());
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}

#[test]
fn smollm2_q4_1_logits_match_transformers() {
    let f: SmolLogits = read_json("tests/golden/smollm2_logits.json");
    let mut runner = runner_for(&smollm2_path());
    assert_eq!(runner.vocab_size(), f.vocab_size);
    let mut worst = 0.0f32;
    for c in &f.cases {
        let want = read_rows(&c.logits_file, c.positions.len(), f.vocab_size);
        let d = compare_logits(runner.as_mut(), &c.name, &c.token_ids, &c.positions, &want);
        println!("smollm2 {}: max |Δ| logits = {d:e}", c.name);
        worst = worst.max(d);
    }
    println!("smollm2: max |Δ| logits = {worst:e}");
}

#[test]
fn smollm2_q4_1_greedy_matches_transformers() {
    let f: SmolGreedy = read_json("tests/golden/smollm2_greedy.json");
    let mut runner = runner_for(&smollm2_path());
    for (i, g) in f.cases.iter().enumerate() {
        let name = format!(
            "smollm2 greedy {}",
            g.name.clone().unwrap_or_else(|| i.to_string())
        );
        let steps = compare_greedy(
            runner.as_mut(),
            &name,
            &g.prompt_ids,
            &g.greedy,
            &g.top2_gap,
        );
        println!("{name}: {steps}/{} greedy steps compared", g.greedy.len());
    }
}

#[test]
fn probe_cli_prints_one_json_object_matching_transformers() {
    let f: TinyFixture = read_json("tests/golden/tiny_llama.json");
    let (case, greedy) = (&f.cases[0], &f.greedy[0]);
    let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let positions = case
        .positions
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["probe", "--model"])
        .arg(crate_root().join(&f.model_path))
        .args([
            "--token-ids",
            &ids(&case.token_ids),
            "--positions",
            &positions,
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let logits = v["logits"].as_object().unwrap();
    assert_eq!(logits.len(), case.positions.len());
    for (pos, want) in case.positions.iter().zip(&case.logits) {
        let row: Vec<f32> = serde_json::from_value(logits[&pos.to_string()].clone()).unwrap();
        assert!(max_abs_diff(&row, want) <= LOGITS_TOL, "position {pos}");
    }
    assert_eq!(v["greedy"], serde_json::json!([]));

    // --greedy N prints exactly N ids (it never stops at EOS), equal to the reference up to
    // its first near-tie.
    let n = greedy.greedy.len();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["probe", "--model"])
        .arg(crate_root().join(&f.model_path))
        .args([
            "--token-ids",
            &ids(&greedy.prompt_ids),
            "--greedy",
            &n.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<u32> = serde_json::from_value(v["greedy"].clone()).unwrap();
    assert_eq!(got.len(), n);
    let agree = greedy
        .top2_gap
        .iter()
        .position(|&g| g < TIE_GAP)
        .unwrap_or(n);
    assert_eq!(got[..agree], greedy.greedy[..agree]);
}
