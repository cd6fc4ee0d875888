//! The whole synthetic Qwen3.5-27B W4A16 (seeded random weights of every text tensor, made
//! in-process; `kiln::model::synthetic`) through the real Qwen3.5 CUDA runner: it loads in at
//! most 19 GiB of weights on the device (text only; lm_head and embeddings 16-bit), every
//! logits row checked stays finite over the 64 layers, and the decode / prefill figures of
//! `kiln bench --synthetic qwen3.5-27b --quant w4a16` are printed (the same code:
//! `kiln::tools::bench_synthetic::full::measure`).
//!
//! Run on the GPU machine (built with `cargo test --release --features cuda --no-run`):
//! `KILN_KERNEL_CACHE=/tmp/kc90 LD_LIBRARY_PATH=/usr/local/cuda/lib64 cuda_synthetic_27b-<hash>
//! --ignored --nocapture` (~1 minute warm: the weights are generated and repacked on the host).
#![cfg(feature = "cuda")]

use kiln::model::synthetic::SyntheticQuant;
use kiln::tools::bench_synthetic::{full::measure, SyntheticArgs};

const GIB: usize = 1 << 30;

#[test]
#[ignore = "needs a GPU: see the header"]
fn synthetic_27b_w4a16_loads_in_19_gib_and_runs_finite() {
    let args = SyntheticArgs {
        model: "qwen3.5-27b".into(),
        quant: "w4a16".into(),
        dtype: "auto".into(),
        json: false,
        linears_only: false,
        batches: vec![1, 8, 32],
        prompt_tokens: 128,
        gen_tokens: 64,
        prefill: vec![1024, 8192],
        // The engine's default: decode steps replayed from the hybrid runner's graphs.
        cuda_graphs: true,
    };
    let r = measure(0, SyntheticQuant::W4A16, "w4a16", &args).expect("the synthetic 27B runs");
    println!("RESULT {}", serde_json::to_string(&r).unwrap());
    // What the planner counts, and what the device lost to the load beyond the caches it was
    // asked for (weights + CUDA context + any load scratch still held): both ≤ 19 GiB.
    assert!(
        r.planned_weight_bytes <= 19 * GIB,
        "planned {}",
        r.planned_weight_bytes
    );
    let weights_on_device = r.used_after_load.saturating_sub(r.kv_bytes + r.state_bytes);
    assert!(
        weights_on_device <= 19 * GIB,
        "{:.2} GiB on the device besides KV and state",
        weights_on_device as f64 / GIB as f64
    );
    // ~24.3 B 4-bit weights are at least 12 GB: the weights really are on the device.
    assert!(
        r.runner_weight_bytes > 12_000_000_000,
        "{}",
        r.runner_weight_bytes
    );
    assert!(r.max_abs_logit.is_finite() && r.max_abs_logit > 0.0);
    assert_eq!(r.decode.len(), 3);
    assert!(r.decode.iter().all(|d| d.1 > 0.0) && r.prefill.iter().all(|p| p.1 > 0.0));
}
