//! Whole tiny-model parity of kiln's packed 4-bit loaders and CPU reference matmul against
//! Hugging Face transformers, one fixture per format.
//!
//! The checkpoints in `tests/fixtures/tiny-llama-{ct-*,awq-*,gptq-*}` were written by
//! `scripts/gen-quant-fixtures.py` (compressed-tensors' own compressors, AutoAWQ's own
//! `WQLinear_GEMM.from_linear`; GPTQ in its documented layout with numpy, no GPU-free writer
//! installs); the references in `tests/golden/tiny_llama_<fixture>.json` are transformers'
//! float32 forward pass over the dequantized weights (checked there against each library's own
//! decompressor). Each test opens the folder with `ModelFiles::open` (which reads the
//! `quantization_config`), builds the CPU runner, and runs `kiln probe`'s path:
//! logits max |Δ| ≤ [`LOGITS_TOL`], greedy tokens equal up to the first reference near-tie.
//! `cargo test --test quant_golden -- --nocapture` prints the measured max |Δ|.

use std::path::PathBuf;

use kiln::engine::{Device, EngineConfig};
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner;
use kiln::tensor::LinearView;
use kiln::tools::probe::{probe, Positions};
use serde::Deserialize;

/// Largest allowed |kiln − transformers| over every compared logit.
const LOGITS_TOL: f32 = 1e-3;
/// Top-2 reference logits closer than this make the argmax a tie for comparison purposes.
const TIE_GAP: f32 = 0.01;

#[derive(Deserialize)]
struct Fixture {
    model_path: String,
    cases: Vec<Case>,
    greedy: Vec<Greedy>,
}

#[derive(Deserialize)]
struct Case {
    token_ids: Vec<u32>,
    positions: Vec<usize>,
    logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Greedy {
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    top2_gap: Vec<f32>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Opens the fixture, checks which linears are packed, and compares logits and greedy runs.
fn check(fixture: &str, packed: &[&str], dense: &[&str]) {
    let path = root().join(format!("tests/golden/{fixture}.json"));
    let f: Fixture = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let files = ModelFiles::open(&root().join(&f.model_path)).unwrap();
    for m in packed {
        assert!(
            matches!(files.weights.linear(m).unwrap(), LinearView::Packed(_)),
            "{fixture}: `{m}` should be packed"
        );
    }
    for m in dense {
        assert!(
            matches!(files.weights.linear(m).unwrap(), LinearView::Dense(_)),
            "{fixture}: `{m}` should be dense (ignored)"
        );
    }
    let engine = EngineConfig {
        device: Device::Cpu,
        kv_cache_mib: 64,
        ..EngineConfig::default()
    };
    let mut runner = build_runner(&files, &engine.runner_options()).unwrap();
    let mut worst = 0.0f32;
    for (i, c) in f.cases.iter().enumerate() {
        let got = probe(
            runner.as_mut(),
            &c.token_ids,
            &Positions::List(c.positions.clone()),
            0,
        )
        .unwrap();
        assert_eq!(got.logits.len(), c.logits.len(), "{fixture} case {i}: rows");
        for ((pos, row), want) in got.logits.iter().zip(&c.logits) {
            let d = row
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                d <= LOGITS_TOL,
                "{fixture} case {i} position {pos}: max |Δ| {d}"
            );
            worst = worst.max(d);
        }
    }
    for (i, g) in f.greedy.iter().enumerate() {
        let got = probe(
            runner.as_mut(),
            &g.prompt_ids,
            &Positions::Last,
            g.greedy.len(),
        )
        .unwrap()
        .greedy;
        let mut steps = 0;
        for s in 0..g.greedy.len() {
            if g.top2_gap[s] < TIE_GAP {
                break;
            }
            assert_eq!(
                got[s], g.greedy[s],
                "{fixture} greedy {i} step {s}: {got:?} vs {:?}",
                g.greedy
            );
            steps += 1;
        }
        println!(
            "{fixture} greedy {i}: {steps}/{} steps compared",
            g.greedy.len()
        );
    }
    println!("{fixture}: max |Δ| logits = {worst:e}");
}

const ALL_LINEARS: [&str; 3] = [
    "model.layers.0.self_attn.q_proj",
    "model.layers.1.self_attn.o_proj",
    "model.layers.1.mlp.up_proj",
];

#[test]
fn compressed_tensors_w4a16_asym_group128_with_ignore_list() {
    check(
        "tiny_llama_ct_w4a16_asym_g128",
        &[
            "model.layers.0.mlp.down_proj",
            "model.layers.1.mlp.gate_proj",
        ],
        // `lm_head` by name, layer 1's down_proj by `re:.*layers\.1\.mlp\.down_proj$`.
        &["lm_head", "model.layers.1.mlp.down_proj"],
    );
}

#[test]
fn compressed_tensors_w4a16_sym_group32() {
    check("tiny_llama_ct_w4a16_sym_g32", &ALL_LINEARS, &["lm_head"]);
}

#[test]
fn compressed_tensors_nvfp4a16() {
    check("tiny_llama_ct_nvfp4a16", &ALL_LINEARS, &["lm_head"]);
}

#[test]
fn autoawq_gemm_group64() {
    check("tiny_llama_awq_g64", &ALL_LINEARS, &["lm_head"]);
}

#[test]
fn gptq_group64_desc_act() {
    check("tiny_llama_gptq_g64_desc_act", &ALL_LINEARS, &["lm_head"]);
}

/// A copy of the asymmetric compressed-tensors fixture with its `quantization_config` edited
/// by `edit`; the error of opening it and building the CPU runner.
fn load_error(edit: impl Fn(&mut serde_json::Value)) -> String {
    let src = root().join("tests/fixtures/tiny-llama-ct-w4a16-asym-g128");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config["quantization_config"]);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let files = match ModelFiles::open(dir.path()) {
        Ok(f) => f,
        Err(e) => return e.to_string(),
    };
    let engine = EngineConfig {
        device: Device::Cpu,
        kv_cache_mib: 8,
        ..EngineConfig::default()
    };
    match build_runner(&files, &engine.runner_options()) {
        Ok(_) => panic!("the edited checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_module_the_config_quantizes_but_the_file_stores_dense_is_named() {
    // Drop `lm_head` from the ignore list: the config now says it is packed, the file has
    // a dense `lm_head.weight`.
    let e = load_error(|q| q["ignore"] = serde_json::json!(["re:.*layers\\.1\\.mlp\\.down_proj$"]));
    assert!(e.contains("`lm_head`") && e.contains("dense"), "{e}");
}

#[test]
fn an_unsupported_scheme_is_an_error_naming_module_and_scheme() {
    let e = load_error(|q| q["config_groups"]["group_0"]["weights"]["num_bits"] = 8.into());
    // `ModelFiles::open` checks the last layer's q_proj first.
    assert!(e.contains("`model.layers.1.self_attn.q_proj`"), "{e}");
    assert!(e.contains("8-bit int group"), "{e}");
}
