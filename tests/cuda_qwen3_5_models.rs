//! Whole tiny `qwen3_5` models on CUDA against the CPU backend (the reference, itself checked
//! against transformers by `tests/qwen3_5.rs`), on a GPU: the three tiny fixtures (logits at
//! every position of 1/63/64/65/200-token prompts, greedy continuations) at f32 / fp16 / bf16,
//! batched vs alone, and two CPU-only measurements of what bf16 weight storage costs these
//! models by itself. The op-level checks are `tests/cuda_qwen3_5.rs`.
//!
//! Run on the GPU machine (binaries built here with `cargo test --release --features cuda --no-run`),
//! from the repository root:
//! `cuda_qwen3_5_models-<hash> --ignored --test-threads=1 --nocapture`
//! and the V100 (sm_70) path: `source .gpu/shared/env70.sh` (KILN_CUDA_ARCH=compute_70, NVRTC
//! 12.9) then the same command. Each check prints a `RESULT` line for docs/gpu-validation.md.
#![cfg(feature = "cuda")]

mod common;

use common::*;

use std::collections::HashMap;

use kiln::engine::Device;
use kiln::engine::EngineConfig;
use kiln::error::ModelError;
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner_for;
use kiln::model::step::ModelRunner;
use kiln::tensor::{TensorView, WeightDType, WeightSource};
use kiln::tools::probe::{probe, Positions};

/// Whole models, f32 compute: as the CPU matches transformers.
const MODEL_TOL_F32: f32 = 1e-3;
/// Whole models, fp16 compute: least cosine of a logits row against the CPU's f32 row.
const MODEL_MIN_COSINE_F16: f64 = 0.999;
/// Whole models, bf16 compute, against the CPU in f32 on the same weights rounded to bf16: least
/// cosine of a logits row. These tiny random models amplify rounding (the weights' bf16 rounding
/// alone moves the CPU's own logits to cosine 0.990 on tiny-qwen3_5-vl,
/// `bf16_weight_rounding_cost_on_the_cpu`). Until 2026-12-01 the GPU stored the `(1 + w)` norms
/// as `1 + w` in bf16 and reached only 0.9507 on that model; with `w` stored and `1 + w` formed in
/// f32 (`rms_norm_1p`) all three models gave ≥ 0.9963 on the H200 (docs/gpu-validation.md), so
/// 0.995 is asserted (greedy continuations of these random models still part after a few tokens).
const MODEL_MIN_COSINE_BF16: f64 = 0.995;

const MODELS: [&str; 3] = [
    "tests/fixtures/tiny-qwen3_5",
    "tests/fixtures/tiny-qwen3_5-vl",
    "tests/fixtures/tiny-qwen3_5-hd256",
];

fn prompt(vocab: usize, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11) % vocab as u32)
        .collect()
}

/// A checkpoint's tensors with every f32 one stored as bf16 (round to nearest even): what a
/// bf16 checkpoint of the same model holds. The tiny fixtures are f32; real Qwen3.5 checkpoints
/// are bf16, so for them this rounding costs nothing, while for the fixtures it is a
/// perturbation of the model itself that bf16 compute cannot avoid.
struct Bf16Weights {
    tensors: HashMap<String, (Vec<usize>, Vec<u8>, WeightDType)>,
}

/// Whether `name` is a zero-centred `(1 + w)` norm weight of Qwen3.5 (every norm but the GDN's
/// gated `linear_attn.norm`).
fn is_norm_1p(name: &str) -> bool {
    name.ends_with("norm.weight") && !name.contains("linear_attn.norm") && !name.contains("visual")
}

impl Bf16Weights {
    fn new(inner: &dyn WeightSource) -> Bf16Weights {
        Bf16Weights::with_norms(inner, false)
    }

    /// As `new`; with `round_1p`, each `(1 + w)` norm weight becomes the f32 value `v` with
    /// `1 + v = bf16(1 + bf16(w))`: what a GPU that stores `1 + w` in bf16 multiplies by.
    fn with_norms(inner: &dyn WeightSource, round_1p: bool) -> Bf16Weights {
        let mut tensors = HashMap::new();
        for name in inner.names() {
            let t = inner.tensor(&name).expect("tensor");
            let entry = if round_1p && t.dtype == WeightDType::F32 && is_norm_1p(&name) {
                let bytes: Vec<u8> = t
                    .data
                    .chunks_exact(4)
                    .flat_map(|b| {
                        let w = half::bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                        let one_plus = half::bf16::from_f32(1.0 + w.to_f32()).to_f32();
                        (one_plus - 1.0).to_le_bytes()
                    })
                    .collect();
                (t.shape.to_vec(), bytes, WeightDType::F32)
            } else if t.dtype == WeightDType::F32 {
                let bytes: Vec<u8> = t
                    .data
                    .chunks_exact(4)
                    .flat_map(|b| {
                        half::bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .to_le_bytes()
                    })
                    .collect();
                (t.shape.to_vec(), bytes, WeightDType::BF16)
            } else {
                (t.shape.to_vec(), t.data.to_vec(), t.dtype)
            };
            tensors.insert(name, entry);
        }
        Bf16Weights { tensors }
    }
}

impl WeightSource for Bf16Weights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let (shape, data, dtype) = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        Ok(TensorView {
            dtype: *dtype,
            shape,
            data,
        })
    }
    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.tensors.keys().cloned().collect();
        n.sort();
        n
    }
}

/// As `common::runner`, over any weight source.
fn runner_on(
    files: &ModelFiles,
    weights: &dyn WeightSource,
    device: Device,
    dtype: &str,
) -> Box<dyn ModelRunner> {
    let engine = EngineConfig {
        device,
        dtype: dtype.into(),
        max_model_len: 1024,
        max_num_batched_tokens: 512,
        gpu_memory_utilization: 0.1,
        ..EngineConfig::default()
    };
    build_runner_for(&files.config, weights, &engine.runner_options()).expect("runner")
}

/// Worst (max |Δ|, cosine) and whether all greedy continuations agree, `want` vs `got`, over
/// prompts of 1, 63, 64, 65 and 200 tokens (logits at every position, 16 greedy tokens).
fn compare_runners(
    want: &mut dyn ModelRunner,
    got: &mut dyn ModelRunner,
    vocab: usize,
) -> (f32, f64, bool) {
    let (mut worst, mut worst_cos, mut agree_all) = (0f32, 1f64, true);
    for n in [1, 63, 64, 65, 200] {
        let ids = prompt(vocab, n);
        let w = probe(want, &ids, &Positions::All, 16).expect("reference");
        let g = probe(got, &ids, &Positions::All, 16).expect("checked");
        let (d, c, agree) = compare(&w, &g);
        worst = worst.max(d);
        worst_cos = worst_cos.min(c);
        agree_all &= agree == 16;
    }
    (worst, worst_cos, agree_all)
}

/// What rounding the f32 fixtures' weights to bf16 costs by itself (both runs on the CPU in
/// f32): the floor under any bf16 comparison against the f32 model. Needs no GPU (ignored only
/// to keep it out of CI's time): `cargo test --features cuda --test cuda_qwen3_5 bf16_weight -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, printed: see the doc comment"]
fn bf16_weight_rounding_cost_on_the_cpu() {
    for path in MODELS {
        let files = ModelFiles::open(&root().join(path)).expect("model");
        let vocab = files.config.vocab_size;
        let rounded = Bf16Weights::new(files.weights.as_ref());
        let mut exact = runner_on(&files, files.weights.as_ref(), Device::Cpu, "f32");
        let mut r = runner_on(&files, &rounded, Device::Cpu, "f32");
        let (d, c, a) = compare_runners(exact.as_mut(), r.as_mut(), vocab);
        println!(
            "RESULT bf16_weight_cost model {path} (cpu f32 on bf16-rounded weights vs cpu f32) logits_max_abs_diff={d:.3e} min_cosine={c:.6} greedy_all_16={a}"
        );
    }
}

/// What storing the `(1 + w)` norms as `1 + w` in bf16 costs by itself (both runs on the CPU in
/// f32, on bf16-rounded weights; one with every `(1 + w)` norm rounded as such a GPU would):
/// `cargo test --features cuda --test cuda_qwen3_5 bf16_norm -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, printed: see the doc comment"]
fn bf16_norm_1p_storage_cost_on_the_cpu() {
    for path in MODELS {
        let files = ModelFiles::open(&root().join(path)).expect("model");
        let vocab = files.config.vocab_size;
        let plain = Bf16Weights::new(files.weights.as_ref());
        let one_plus = Bf16Weights::with_norms(files.weights.as_ref(), true);
        let mut a = runner_on(&files, &plain, Device::Cpu, "f32");
        let mut b = runner_on(&files, &one_plus, Device::Cpu, "f32");
        let (d, c, g) = compare_runners(a.as_mut(), b.as_mut(), vocab);
        println!(
            "RESULT bf16_norm_1p_cost model {path} (cpu f32, bf16 weights, 1 + w rounded to bf16 vs not) logits_max_abs_diff={d:.3e} min_cosine={c:.6} greedy_all_16={g}"
        );
    }
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn tiny_qwen3_5_models_match_the_cpu_backend() {
    let mut failures = Vec::new();
    for path in MODELS {
        let files = ModelFiles::open(&root().join(path)).expect("model");
        let vocab = files.config.vocab_size;
        let rounded = Bf16Weights::new(files.weights.as_ref());
        let mut cpu = runner_on(&files, files.weights.as_ref(), Device::Cpu, "f32");
        // The bf16 reference: the CPU in f32 on the bf16-rounded weights (see Bf16Weights).
        let mut cpu_bf16w = runner_on(&files, &rounded, Device::Cpu, "f32");
        for dtype in dtypes() {
            let mut gpu = runner_on(&files, files.weights.as_ref(), Device::Cuda(0), dtype);
            let (worst, worst_cos, agree_all) = if dtype == "bf16" {
                compare_runners(cpu_bf16w.as_mut(), gpu.as_mut(), vocab)
            } else {
                compare_runners(cpu.as_mut(), gpu.as_mut(), vocab)
            };
            let ok = match dtype {
                "f32" => worst <= MODEL_TOL_F32 && agree_all,
                "fp16" => worst_cos >= MODEL_MIN_COSINE_F16,
                _ => worst_cos >= MODEL_MIN_COSINE_BF16,
            };
            println!(
                "RESULT model {path} dtype={dtype} vs {} prompts 1/63/64/65/200: logits_max_abs_diff={worst:.3e} min_cosine={worst_cos:.6} greedy_all_16={agree_all} {}",
                if dtype == "bf16" { "cpu f32 on bf16-rounded weights" } else { "cpu f32" },
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failures.push(format!("{path} {dtype}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Greedy continuations of several prompts batched in one forward per step (each in its own
/// state slot) equal each alone; with a prefill of some sequences mixed into decode steps.
#[test]
#[ignore = "needs a GPU: see the header"]
fn batched_greedy_equals_each_alone_on_the_gpu() {
    let files = ModelFiles::open(&root().join(MODELS[0])).expect("model");
    let vocab = files.config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|s| {
            (0..(3 + 29 * s))
                .map(|i| (i * 31 + s * 7 + 3) % vocab)
                .collect()
        })
        .collect();
    let steps = 12;
    let mut failures = Vec::new();
    for dtype in dtypes() {
        let mut r = runner(&files, Device::Cuda(0), dtype, "auto");
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                probe(r.as_mut(), p, &Positions::Last, steps)
                    .expect("alone")
                    .greedy
            })
            .collect();
        let g = r.cache_geometry();
        assert!(g.num_state_slots >= prompts.len(), "{g:?}");
        let per_seq = 256usize.div_ceil(g.block_size);
        let tables: Vec<Vec<u32>> = (0..prompts.len())
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        let outs = batched_greedy(r.as_mut(), &prompts, &tables, steps, true);
        let ok = outs == alone;
        println!(
            "RESULT batched_vs_alone model tiny-qwen3_5 dtype={dtype} seqs={} steps={steps} {}",
            prompts.len(),
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            failures.push(format!("{dtype}: batched {outs:?} alone {alone:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
