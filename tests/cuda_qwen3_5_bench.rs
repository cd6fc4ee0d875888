//! Speed of the CUDA Gated DeltaNet kernels at the Qwen3.5-27B shapes (16 key heads, 48 value
//! heads, head dims 128, conv kernel 4; one layer): prefills of 8K and 32K tokens in one
//! sequence (the chunked delta rule, and the sequential scan beside it), and decode steps of 1
//! and 64 sequences, in bf16 compute (fp16 on an sm_70 target)
//! with the f32 state. Inputs are seeded pseudo-random values of the real shapes (a random block
//! of rows repeated), not model weights: the kernels' cost does not depend on the values.
//!
//! Run on the GPU machine (built with `cargo test --release --features cuda --no-run`):
//! `cuda_qwen3_5_bench-<hash> --ignored --nocapture`. Prints `RESULT bench …` lines (medians of
//! wall time between device synchronizations; decode steps are launched 200 at a time and
//! divided, so launch overhead is included) for docs/benchmarks.md, with FlashQLA's published
//! H200 figure (1.26 ms per layer at 32K tokens) and the decode state update's memory-bound
//! limit (state read + written once at 4.3 TB/s, the H200's measured device copy rate).
//!
//! For a per-kernel profile under `ncu`: `GDN_BENCH_CASES` (comma-separated of `prefill8192`,
//! `prefill32768`, `decode1`, `decode16`, `decode64`; unset: all) picks the cases, and `GDN_BENCH_QUICK=1`
//! times each op once per repetition over one repetition (few launches to profile), e.g.
//! `GDN_BENCH_CASES=prefill32768,decode64 GDN_BENCH_QUICK=1 ncu --clock-control none --metrics
//! gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
//! cuda_qwen3_5_bench-<hash> --ignored --nocapture` (its timings are then not medians).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;

use kiln::backend::cuda::{CudaBackend, DEFAULT_CHUNKED_MIN_LEN};
use kiln::backend::hybrid::{GdnParams, HybridBackend, StateSpec};
use kiln::backend::{Backend, StepInput, StepSeq};

const P27: GdnParams = GdnParams {
    num_key_heads: 16,
    num_value_heads: 48,
    key_head_dim: 128,
    value_head_dim: 128,
};
const KERNEL: usize = 4;
/// The H200's measured device-to-device copy rate (docs/gpu-workflow.md), bytes/s.
const H200_BYTES_PER_S: f64 = 4.3e12;
/// FlashQLA's published H200 time for one GDN layer of these shapes at 32K tokens, ms.
const FLASHQLA_32K_MS: f64 = 1.26;

/// `rows × width` values: a seeded random block of 1021 rows repeated.
fn rows(rows: usize, width: usize, seed: u64) -> Vec<f32> {
    let block_rows = rows.min(1021);
    let block = data(block_rows * width, seed);
    let mut out = Vec::with_capacity(rows * width);
    while out.len() < rows * width {
        let take = (rows * width - out.len()).min(block.len());
        out.extend_from_slice(&block[..take]);
    }
    out
}

fn step_of(seqs: &[(usize, usize, u32)]) -> StepInput {
    let mut s = StepInput {
        token_ids: vec![],
        positions: vec![],
        slot_mapping: vec![],
        seqs: vec![],
        logit_rows: vec![],
        block_size: 16,
    };
    for &(len, cached, slot) in seqs {
        s.seqs.push(StepSeq {
            token_start: s.token_ids.len(),
            len,
            cached_len: cached,
            block_table: vec![],
            state_slot: Some(slot),
        });
        for i in 0..len {
            s.token_ids.push(0);
            s.positions.push((cached + i) as u32);
            s.slot_mapping.push(0);
        }
    }
    s
}

/// Whether `GDN_BENCH_CASES` (unset: every case) names `case`.
fn wanted(case: &str) -> bool {
    std::env::var("GDN_BENCH_CASES")
        .map(|v| v.split(',').any(|c| c.trim() == case))
        .unwrap_or(true)
}

/// `GDN_BENCH_QUICK=1`: one repetition of one launch per op (for a profiler).
fn quick() -> bool {
    std::env::var("GDN_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// One GDN layer's device buffers for `t` tokens.
struct Layer {
    mixed: <CudaBackend as Backend>::Buffer,
    conv: <CudaBackend as Backend>::Buffer,
    w: <CudaBackend as Backend>::Buffer,
    a: <CudaBackend as Backend>::Buffer,
    b: <CudaBackend as Backend>::Buffer,
    a_log: <CudaBackend as Backend>::Buffer,
    dt_bias: <CudaBackend as Backend>::Buffer,
    z: <CudaBackend as Backend>::Buffer,
    norm: <CudaBackend as Backend>::Buffer,
    o: <CudaBackend as Backend>::Buffer,
    y: <CudaBackend as Backend>::Buffer,
}

fn layer(g: &CudaBackend, t: usize) -> Layer {
    let p = P27;
    let nv = p.num_value_heads;
    Layer {
        mixed: g.upload(&rows(t, p.conv_dim(), 1)).unwrap(),
        conv: g.alloc(t * p.conv_dim()).unwrap(),
        w: g.upload(&data(p.conv_dim() * KERNEL, 2)).unwrap(),
        a: g.upload(&rows(t, nv, 3)).unwrap(),
        b: g.upload(&rows(t, nv, 4)).unwrap(),
        a_log: g
            .upload(&data(nv, 5).iter().map(|v| v * 0.5).collect::<Vec<_>>())
            .unwrap(),
        dt_bias: g.upload(&data(nv, 6)).unwrap(),
        z: g.upload(&rows(t, p.value_dim(), 7)).unwrap(),
        norm: g.upload(&vec![1.0; p.value_head_dim]).unwrap(),
        o: g.alloc(t * p.value_dim()).unwrap(),
        y: g.alloc(t * p.value_dim()).unwrap(),
    }
}

/// (conv ms, delta rule ms, gated norm ms) of one run of the layer's three GDN ops over `input`,
/// each the median of `reps` timings of `per` back-to-back launches.
fn time_ops(
    g: &CudaBackend,
    cache: &mut <CudaBackend as HybridBackend>::StateCache,
    l: &mut Layer,
    input: &StepInput,
    reps: usize,
    per: usize,
) -> (f64, f64, f64) {
    let st = g.prepare_step(input).unwrap();
    let t = input.num_tokens();
    let p = P27;
    let conv = |cache: &mut _, l: &mut Layer| {
        g.gdn_conv1d(cache, 0, &l.mixed, &l.w, &st, &mut l.conv)
            .unwrap()
    };
    let (reps, per, warm) = if quick() { (1, 1, 0) } else { (reps, per, 2) };
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..reps + warm {
        let mut ms = [0.0; 3];
        for (k, slot) in ms.iter_mut().enumerate() {
            g.synchronize().unwrap();
            let t0 = Instant::now();
            for _ in 0..per {
                match k {
                    0 => conv(cache, l),
                    1 => g
                        .gdn_recurrence(
                            cache, 0, &l.conv, &l.a, &l.b, &l.a_log, &l.dt_bias, &st, &p, &mut l.o,
                        )
                        .unwrap(),
                    _ => g
                        .gated_rms_norm(
                            &l.o,
                            &l.z,
                            &l.norm,
                            &mut l.y,
                            t * p.num_value_heads,
                            p.value_head_dim,
                            1e-6,
                        )
                        .unwrap(),
                }
            }
            g.synchronize().unwrap();
            *slot = t0.elapsed().as_secs_f64() * 1e3 / per as f64;
        }
        if rep >= warm {
            for k in 0..3 {
                times[k].push(ms[k]);
            }
        }
    }
    let [a, b, c] = times;
    (median(a), median(b), median(c))
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn gdn_kernels_at_the_27b_shapes() {
    let dtype = if dtypes().contains(&"bf16") {
        "bf16"
    } else {
        "fp16"
    };
    let g = gpu(dtype, "auto");
    let p = P27;
    let spec = StateSpec {
        num_slots: 64,
        num_layers: 1,
        conv_dim: p.conv_dim(),
        conv_kernel: KERNEL,
        num_value_heads: p.num_value_heads,
        key_head_dim: p.key_head_dim,
        value_head_dim: p.value_head_dim,
    };
    let mut cache = g.create_state_cache(&spec).unwrap();
    println!("device: {}", g.name());
    for t in [8192usize, 32768] {
        if !wanted(&format!("prefill{t}")) {
            continue;
        }
        let mut l = layer(&g, t);
        // A prefill that continues from a state (cached_len > 0), as a chunked prefill does.
        let input = step_of(&[(t, 1, 0)]);
        // The default path (chunked, C = 64), then the sequential scan for comparison.
        let (c, r, n) = time_ops(&g, &mut cache, &mut l, &input, 5, 1);
        cache.set_chunked_min_len(None);
        let (_, r_scan, _) = time_ops(&g, &mut cache, &mut l, &input, 3, 1);
        cache.set_chunked_min_len(Some(DEFAULT_CHUNKED_MIN_LEN));
        let total = c + r + n;
        // The chunked form's matrix products, counted: per chunk of 64 and value head, K Kᵀ and
        // Q Kᵀ (2·64²·dk), U and W (64²·(dv + dk), half of it past the diagonal skipped: not
        // subtracted), W S, Qg S (2·64·dk·dv), P Vn (64²·dv), Kdᵀ Vn (64·dk·dv); 2 flops each.
        let (dk, dv) = (p.key_head_dim as f64, p.value_head_dim as f64);
        let per_chunk = 2.0
            * (2.0 * 64.0 * 64.0 * dk
                + 64.0 * 64.0 * (dv + dk)
                + 3.0 * 64.0 * dk * dv
                + 64.0 * 64.0 * dv);
        let flops = per_chunk * (t as f64 / 64.0) * p.num_value_heads as f64;
        println!(
            "RESULT bench gdn prefill tokens={t} dtype={dtype} conv1d_ms={c:.3} delta_rule_ms={r:.3} (chunked; {:.1} TFLOP/s of {:.1} GFLOP) scan_delta_rule_ms={r_scan:.3} gated_norm_ms={n:.3} total_ms={total:.3} tokens_per_s={:.0}{}",
            flops / (r / 1e3) / 1e12,
            flops / 1e9,
            t as f64 / (total / 1e3),
            if t == 32768 {
                format!(
                    " flashqla_h200_ms={FLASHQLA_32K_MS} ratio_delta_rule_vs_flashqla={:.2}",
                    r / FLASHQLA_32K_MS
                )
            } else {
                String::new()
            }
        );
    }
    for batch in [1usize, 16, 64] {
        if !wanted(&format!("decode{batch}")) {
            continue;
        }
        let mut l = layer(&g, batch);
        let seqs: Vec<(usize, usize, u32)> = (0..batch).map(|i| (1, 100, i as u32)).collect();
        let input = step_of(&seqs);
        let (c, r, n) = time_ops(&g, &mut cache, &mut l, &input, 5, 200);
        // The state update's memory-bound limit: every sequence's recurrent state read and
        // written once, f32.
        let state_bytes = (batch * spec.recurrent_elems() * 4 * 2) as f64;
        let limit_us = state_bytes / H200_BYTES_PER_S * 1e6;
        println!(
            "RESULT bench gdn decode batch={batch} dtype={dtype} conv1d_us={:.2} delta_rule_us={:.2} gated_norm_us={:.2} total_us={:.2} state_bytes={state_bytes:.0} memory_bound_delta_rule_us={limit_us:.2} achieved_state_bandwidth_tb_s={:.2}",
            c * 1e3,
            r * 1e3,
            n * 1e3,
            (c + r + n) * 1e3,
            state_bytes / (r / 1e3) / 1e12
        );
    }
}
