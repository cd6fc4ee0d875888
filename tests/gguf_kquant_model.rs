//! The tiny Q4_K_M llama (`tests/fixtures/tiny-llama-q4_k_m.gguf`, written by
//! `scripts/gen-kquant-fixture.py`: Q4_K q / k / o / gate / up and embedding, Q6_K v / down /
//! output) loads and runs on the CPU backend. Regression test: its q|k|v parts have different
//! encodings (Q4_K, Q4_K, Q6_K, as in every llama.cpp Q4_K_M file), which the fused-projection
//! loader used to refuse ("cannot stack Q6K under Q4K") instead of loading them apart. The GPU
//! parity of the same file is `whole_k_quant_model_matches_the_cpu_backend` in
//! tests/cuda_gguf_quant.rs.
//!
//! Run: `cargo test --test gguf_kquant_model`

use std::path::Path;

use kiln::engine::{Device, EngineConfig};
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner;
use kiln::tools::probe::{probe, Positions};

#[test]
fn the_tiny_q4_k_m_llama_runs_on_the_cpu() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama-q4_k_m.gguf");
    let files = ModelFiles::open(&path).expect("open the fixture");
    assert_eq!(files.config.hidden_size, 256);
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 37 + 11) % 256).collect();
    let engine = EngineConfig {
        device: Device::Cpu,
        kv_cache_mib: 8,
        ..EngineConfig::default()
    };
    let mut runner = build_runner(&files, &engine.runner_options()).expect("load on the CPU");
    let out = probe(runner.as_mut(), &prompt, &Positions::All, 4).expect("probe on the CPU");
    assert_eq!(out.greedy.len(), 4);
    for (pos, logits) in &out.logits {
        assert_eq!(logits.len(), 256, "position {pos:?}");
        assert!(logits.iter().all(|v| v.is_finite()), "position {pos:?}");
        // Random weights give logits that differ across the vocabulary.
        let (lo, hi) = logits
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        assert!(hi - lo > 1e-3, "position {pos:?}: flat logits");
    }
}
