//! Qwen3.5 (Gated DeltaNet hybrid) on CUDA against the CPU backend (the reference, itself checked
//! against transformers by `tests/qwen3_5.rs`), on a GPU: every hybrid op on random data (the
//! conv with its state (the scalar kernel, and the 8-channel one with its 16-token runs in a step
//! of over 2048 tokens), the delta rule for decode tokens and prefills of 1, 63, 64, 65 and 200
//! tokens, the state carried across steps, the gated norm (three row widths), the query/gate split, the sigmoid
//! gate, slot copy and reset), the chunked delta rule (C = 64, tensor cores) against the
//! sequential scan at 1/63/64/65/200/1000 tokens and across continued prefills. Whole models
//! are `tests/cuda_qwen3_5_models.rs`, decode graphs `tests/cuda_qwen3_5_graphs.rs`.
//!
//! Run on the GPU machine (binaries built here with `cargo test --release --features cuda --no-run`),
//! from the repository root:
//! `cuda_qwen3_5-<hash> --ignored --test-threads=1 --nocapture`
//! and the V100 (sm_70) path: `source .gpu/shared/env70.sh` (KILN_CUDA_ARCH=compute_70, NVRTC
//! 12.9) then the same command. Each check prints a `RESULT` line for docs/gpu-validation.md.
#![cfg(feature = "cuda")]

mod common;

use common::*;

use kiln::backend::cuda::CudaBackend;
use kiln::backend::hybrid::{GdnParams, HybridBackend, StateSpec};
use kiln::backend::{Backend, CpuBackend, StepInput, StepSeq};

/// The recurrent and conv states are f32 on both backends and the ops get the same (dtype-rounded)
/// inputs, so with the sequential scan (f32 compute, decode, short prefills) the states must agree
/// to f32 rounding (the CPU's chunked form vs the GPU's scan).
const STATE_TOL: f32 = 1e-4;
/// The chunked delta rule (prefills of ≥ 16 tokens at fp16 / bf16) feeds its matrix products
/// operands rounded to the compute dtype (q̂, k̂, the state S, Vn; f32 accumulation, f32 state), so
/// its states differ from the f32 recurrence by about that rounding (2⁻¹¹ / 2⁻⁸ relative, on
/// entries of magnitude ≤ ~1 here): fp16, bf16.
const STATE_TOL_CHUNKED_F16: f32 = 5e-3;
const STATE_TOL_CHUNKED_BF16: f32 = 4e-2;

/// The state tolerance of `dtype` (see the constants).
fn state_tol(dtype: &str) -> f32 {
    match dtype {
        "fp16" => STATE_TOL_CHUNKED_F16,
        "bf16" => STATE_TOL_CHUNKED_BF16,
        _ => STATE_TOL,
    }
}

/// `v` rounded to the compute dtype `dtype` (what the GPU stores), as f32.
fn rounded(dtype: &str, v: &[f32]) -> Vec<f32> {
    match dtype {
        "fp16" => v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        "bf16" => v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect(),
        _ => v.to_vec(),
    }
}

/// A step of `seqs` = (len, cached_len, slot), tokens laid out in order.
fn step_of(seqs: &[(usize, usize, u32)]) -> StepInput {
    let mut token_start = 0;
    let mut out = StepInput {
        token_ids: vec![],
        positions: vec![],
        slot_mapping: vec![],
        seqs: vec![],
        logit_rows: vec![],
        block_size: 16,
    };
    for &(len, cached, slot) in seqs {
        for i in 0..len {
            out.token_ids.push(0);
            out.positions.push((cached + i) as u32);
            out.slot_mapping.push(0);
        }
        out.seqs.push(StepSeq {
            token_start,
            len,
            cached_len: cached,
            block_table: vec![],
            state_slot: Some(slot),
        });
        token_start += len;
    }
    out
}

/// What one backend produced for a sequence of steps.
struct OpRun {
    /// (name, values) of every output, in order.
    outputs: Vec<(String, Vec<f32>)>,
}

/// Run conv + delta rule over `steps` with `p`'s shapes on `b`; `state` reads a slot's
/// (conv, recurrent) state in the CPU layout.
fn run_gdn<B: HybridBackend>(
    b: &B,
    dtype: &str,
    p: &GdnParams,
    steps: &[StepInput],
    state: impl Fn(&B, &B::StateCache, u32) -> (Vec<f32>, Vec<f32>),
) -> OpRun {
    let kern = 4;
    let spec = StateSpec {
        num_slots: 3,
        num_layers: 2,
        conv_dim: p.conv_dim(),
        conv_kernel: kern,
        num_value_heads: p.num_value_heads,
        key_head_dim: p.key_head_dim,
        value_head_dim: p.value_head_dim,
    };
    let nv = p.num_value_heads;
    let mut cache = b.create_state_cache(&spec).expect("state cache");
    let layer = 1;
    let w = b
        .upload(&rounded(dtype, &data(spec.conv_dim * kern, 11)))
        .unwrap();
    let a_log = b
        .upload(&rounded(
            dtype,
            &data(nv, 12).iter().map(|v| v * 0.5).collect::<Vec<_>>(),
        ))
        .unwrap();
    let dt_bias = b.upload(&rounded(dtype, &data(nv, 13))).unwrap();
    let mut outputs = Vec::new();
    for (i, input) in steps.iter().enumerate() {
        let t = input.num_tokens();
        let st = b.prepare_step(input).expect("step");
        let seed = 100 + 10 * i as u64;
        let mixed = b
            .upload(&rounded(dtype, &data(t * spec.conv_dim, seed)))
            .unwrap();
        let mut conv = b.alloc(t * spec.conv_dim).unwrap();
        b.gdn_conv1d(&mut cache, layer, &mixed, &w, &st, &mut conv)
            .expect("conv1d");
        outputs.push((format!("step{i}.conv1d"), down(b, &conv, t * spec.conv_dim)));
        // The delta rule on its own random inputs (not the conv output: each op is checked on
        // identical inputs).
        let qkv = b
            .upload(&rounded(dtype, &data(t * spec.conv_dim, seed + 1)))
            .unwrap();
        let ga = b.upload(&rounded(dtype, &data(t * nv, seed + 2))).unwrap();
        let gb = b.upload(&rounded(dtype, &data(t * nv, seed + 3))).unwrap();
        let mut o = b.alloc(t * p.value_dim()).unwrap();
        b.gdn_recurrence(
            &mut cache, layer, &qkv, &ga, &gb, &a_log, &dt_bias, &st, p, &mut o,
        )
        .expect("recurrence");
        outputs.push((
            format!("step{i}.delta_rule"),
            down(b, &o, t * p.value_dim()),
        ));
        for s in &input.seqs {
            let slot = s.state_slot.unwrap();
            let (c, r) = state(b, &cache, slot);
            outputs.push((format!("step{i}.slot{slot}.conv_state"), c));
            outputs.push((format!("step{i}.slot{slot}.recurrent_state"), r));
        }
    }
    // Slot copy and reset.
    b.copy_state_slot(&mut cache, 0, 2).unwrap();
    let (c, r) = state(b, &cache, 2);
    outputs.push(("copy_state_slot.conv".into(), c));
    outputs.push(("copy_state_slot.recurrent".into(), r));
    b.reset_state_slot(&mut cache, 0).unwrap();
    let (c, r) = state(b, &cache, 0);
    outputs.push(("reset_state_slot.conv".into(), c));
    outputs.push(("reset_state_slot.recurrent".into(), r));
    OpRun { outputs }
}

fn cpu_state(
    _: &CpuBackend,
    c: &<CpuBackend as HybridBackend>::StateCache,
    slot: u32,
) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = c.slot_layer(slot as usize, 1);
    (a.to_vec(), b.to_vec())
}

fn gpu_state(
    b: &CudaBackend,
    c: &<CudaBackend as HybridBackend>::StateCache,
    slot: u32,
) -> (Vec<f32>, Vec<f32>) {
    b.download_state(c, slot, 1).expect("download state")
}

/// The small gated-attention / GDN-output ops on `b`.
fn run_small<B: HybridBackend>(b: &B, dtype: &str) -> Vec<(&'static str, Vec<f32>)> {
    let (t, heads, hd) = (37, 3, 64);
    let n = t * heads * hd;
    let qg = b.upload(&rounded(dtype, &data(2 * n, 21))).unwrap();
    let mut q = b.alloc(n).unwrap();
    let mut gate = b.alloc(n).unwrap();
    b.split_query_gate(&qg, &mut q, &mut gate, t, heads, hd)
        .unwrap();
    let mut x = b.upload(&rounded(dtype, &data(n, 22))).unwrap();
    b.sigmoid_mul(&mut x, &gate, n).unwrap();
    let (rows, dim) = (t * 4, 128);
    let ox = b
        .upload(&rounded(
            dtype,
            &data(rows * dim, 23)
                .iter()
                .map(|v| v * 3.0)
                .collect::<Vec<_>>(),
        ))
        .unwrap();
    let z = b.upload(&rounded(dtype, &data(rows * dim, 24))).unwrap();
    let w = b
        .upload(&rounded(
            dtype,
            &data(dim, 25)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect::<Vec<_>>(),
        ))
        .unwrap();
    let mut y = b.alloc(rows * dim).unwrap();
    b.gated_rms_norm(&ox, &z, &w, &mut y, rows, dim, 1e-6)
        .unwrap();
    // A row width that is not a multiple of 8 (the block-per-row kernel; 128 takes the
    // 128-bit one) and one past 8 · 32 (the 128-bit kernel's lanes loop over chunks).
    let mut others = Vec::new();
    for (name, rows, dim) in [
        ("gated_rms_norm.dim60", 37, 60),
        ("gated_rms_norm.dim520", 9, 520),
    ] {
        let ox = b.upload(&rounded(dtype, &data(rows * dim, 26))).unwrap();
        let z = b.upload(&rounded(dtype, &data(rows * dim, 27))).unwrap();
        let w = b.upload(&rounded(dtype, &data(dim, 28))).unwrap();
        let mut y = b.alloc(rows * dim).unwrap();
        b.gated_rms_norm(&ox, &z, &w, &mut y, rows, dim, 1e-6)
            .unwrap();
        others.push((name, down(b, &y, rows * dim)));
    }
    let mut out = vec![
        ("split_query_gate.q", down(b, &q, n)),
        ("split_query_gate.gate", down(b, &gate, n)),
        ("sigmoid_mul", down(b, &x, n)),
        ("gated_rms_norm", down(b, &y, rows * dim)),
    ];
    out.extend(others);
    out
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn gdn_ops_match_the_cpu_backend() {
    let shapes = [
        // (key heads, value heads, dk, dv): 2 value heads per key head; 1; 3 at the 27B's dims.
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 4,
            key_head_dim: 32,
            value_head_dim: 32,
        },
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 2,
            key_head_dim: 16,
            value_head_dim: 40,
        },
        GdnParams {
            num_key_heads: 1,
            num_value_heads: 3,
            key_head_dim: 128,
            value_head_dim: 128,
        },
        // conv_dim 52 (not a multiple of 8: the scalar conv kernel even in the 2141-token step,
        // where the others take the 8-channel one), dk 16 (the scan with single-float rows; dk 32
        // and 128 take the 128-bit one).
        GdnParams {
            num_key_heads: 1,
            num_value_heads: 1,
            key_head_dim: 16,
            value_head_dim: 20,
        },
    ];
    // Prefills from a zero state, then each sequence continues from its state (65 more tokens
    // crossing the CPU's chunk boundaries, mixed with a decode), decode-only steps, a fresh
    // prefill into a used slot (the stale state must be ignored) beside a decode; then the
    // prefill lengths 1, 63, 64, 65 and 200 each alone.
    let mut steps = vec![
        step_of(&[(1, 0, 0), (63, 0, 1), (200, 0, 2)]),
        step_of(&[(65, 1, 0), (65, 63, 1), (1, 200, 2)]),
        step_of(&[(1, 66, 0), (1, 128, 1), (1, 201, 2)]),
        step_of(&[(64, 0, 1), (1, 67, 0)]),
    ];
    // A step of over 2048 tokens (the 8-channel conv, the only one here to take it, gives each
    // thread a run of 16 tokens): runs that cross from a continued prefill into a fresh one, and a
    // decode token inside a run (its state shifted in place).
    steps.push(step_of(&[(40, 130, 0), (2100, 0, 1), (1, 202, 2)]));
    for l in [1usize, 63, 64, 65, 200] {
        steps.push(step_of(&[(l, 0, 0)]));
    }
    let mut failures = Vec::new();
    for dtype in dtypes() {
        let gpu = gpu(dtype, "auto");
        for p in &shapes {
            let cpu_b = CpuBackend::new(0).expect("cpu");
            let want = run_gdn(&cpu_b, dtype, p, &steps, cpu_state);
            let got = run_gdn(&gpu, dtype, p, &steps, gpu_state);
            let mut worst = (0f32, 0f32);
            for ((name, w), (_, g)) in want.outputs.iter().zip(&got.outputs) {
                let d = max_diff(w, g);
                let is_state = name.contains("state") || name.contains("slot");
                let limit = if is_state {
                    state_tol(dtype)
                } else {
                    tol(dtype)
                };
                let ok = d <= limit && g.iter().all(|v| v.is_finite());
                if is_state {
                    worst.1 = worst.1.max(d);
                } else {
                    worst.0 = worst.0.max(d);
                }
                if !ok {
                    println!("RESULT op gdn {name} dtype={dtype} {p:?} max_abs_diff={d:.3e} tol={limit:.0e} FAIL");
                    failures.push(format!("{name} {dtype} {p:?}: {d}"));
                }
            }
            println!(
                "RESULT op gdn conv1d+delta_rule dtype={dtype} heads={}/{} dk={} dv={} steps={} outputs_max_abs_diff={:.3e} (tol {:.0e}) states_max_abs_diff={:.3e} (tol {:.0e}) {}",
                p.num_key_heads,
                p.num_value_heads,
                p.key_head_dim,
                p.value_head_dim,
                steps.len(),
                worst.0,
                tol(dtype),
                worst.1,
                state_tol(dtype),
                if failures.is_empty() { "ok" } else { "FAIL" }
            );
        }
        let cpu = run_small(&CpuBackend::new(0).expect("cpu"), dtype);
        let g = run_small(&gpu, dtype);
        for ((name, w), (_, got)) in cpu.iter().zip(&g) {
            let d = max_diff(w, got);
            let ok = d <= tol(dtype);
            println!(
                "RESULT op {name} dtype={dtype} max_abs_diff={d:.3e} tol={:.0e} {}",
                tol(dtype),
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failures.push(format!("{name} {dtype}: {d}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// One sequence's delta rule on the GPU in slot 0 of a fresh cache, its tokens split over steps of
/// `splits` new tokens (each continuing from the state the last left), with the chunked path from
/// `min_len` tokens (`None`: the sequential scan only). Returns the outputs of all its tokens and
/// the final recurrent state (CPU layout).
#[allow(clippy::too_many_arguments)]
fn rule_on_gpu(
    g: &CudaBackend,
    p: &GdnParams,
    min_len: Option<usize>,
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    splits: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let spec = StateSpec {
        num_slots: 1,
        num_layers: 1,
        conv_dim: p.conv_dim(),
        conv_kernel: 4,
        num_value_heads: p.num_value_heads,
        key_head_dim: p.key_head_dim,
        value_head_dim: p.value_head_dim,
    };
    let mut cache = g.create_state_cache(&spec).expect("state cache");
    cache.set_chunked_min_len(min_len);
    let (cd, nv, vd) = (p.conv_dim(), p.num_value_heads, p.value_dim());
    let al = g.upload(a_log).unwrap();
    let dt = g.upload(dt_bias).unwrap();
    let mut outs = Vec::new();
    let mut done = 0;
    for &n in splits {
        let st = g.prepare_step(&step_of(&[(n, done, 0)])).expect("step");
        let x = g.upload(&qkv[done * cd..(done + n) * cd]).unwrap();
        let ga = g.upload(&a[done * nv..(done + n) * nv]).unwrap();
        let gb = g.upload(&b[done * nv..(done + n) * nv]).unwrap();
        let mut o = g.upload(&vec![f32::NAN; n * vd]).unwrap(); // poisoned
        g.gdn_recurrence(&mut cache, 0, &x, &ga, &gb, &al, &dt, &st, p, &mut o)
            .expect("recurrence");
        outs.extend(down(g, &o, n * vd));
        done += n;
    }
    let (_, rec) = g.download_state(&cache, 0, 0).expect("state");
    (outs, rec)
}

/// The chunked delta rule (C = 64; mma m16n8k16 on sm_80+, m8n8k4 at fp16 on the sm_70 path, or
/// its FMA tiles with `KILN_GDN_CHUNK_TILES=fma`) against the sequential scan on the same GPU and inputs, at prompt lengths 1, 63, 64, 65,
/// 200, 1000 from a zero state, and split over two or three steps (a prefill continued from its
/// state): outputs within the op tolerance of the dtype, final states within `state_tol`. Slow
/// decays (g ≈ −0.03 per token on most heads) so the state carries across many chunks.
#[test]
#[ignore = "needs a GPU: see the header"]
fn chunked_delta_rule_matches_the_sequential_scan() {
    let shapes = [
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 4,
            key_head_dim: 32,
            value_head_dim: 32,
        },
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 2,
            key_head_dim: 16,
            value_head_dim: 40,
        },
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 6,
            key_head_dim: 128,
            value_head_dim: 128,
        },
    ];
    let cases: [&[usize]; 10] = [
        &[1],
        &[63],
        &[64],
        &[65],
        &[200],
        &[1000],
        &[64, 136],
        &[1, 64],
        &[333, 667],
        &[100, 37, 500],
    ];
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        let g = gpu(dtype, "auto");
        for p in &shapes {
            let nv = p.num_value_heads;
            // Head 0 decays fast (g ≈ −0.7 per token), the others slowly (≈ −0.03).
            let a_log: Vec<f32> = (0..nv)
                .map(|h| if h == 0 { 0.0 } else { -3.0 + 0.1 * h as f32 })
                .collect();
            let dt_bias = rounded(dtype, &data(nv, 33));
            let a_log = rounded(dtype, &a_log);
            let (mut worst_o, mut worst_s) = (0f32, 0f32);
            for splits in cases {
                let n: usize = splits.iter().sum();
                let qkv = rounded(dtype, &data(n * p.conv_dim(), 31 + n as u64));
                let a = rounded(dtype, &data(n * nv, 32 + n as u64));
                let b = rounded(dtype, &data(n * nv, 34 + n as u64));
                let (wo, ws) = rule_on_gpu(&g, p, None, &qkv, &a, &b, &a_log, &dt_bias, &[n]);
                let (go, gs) = rule_on_gpu(&g, p, Some(1), &qkv, &a, &b, &a_log, &dt_bias, splits);
                let (dout, dst) = (max_diff(&wo, &go), max_diff(&ws, &gs));
                let smax = ws.iter().fold(0f32, |m, v| m.max(v.abs()));
                let finite = go.iter().chain(&gs).all(|v| v.is_finite());
                let ok = dout <= tol(dtype) && dst <= state_tol(dtype) && finite;
                worst_o = worst_o.max(dout);
                worst_s = worst_s.max(dst);
                println!(
                    "RESULT chunked_vs_scan dtype={dtype} heads={}/{nv} dk={} dv={} splits={splits:?} out_max_abs_diff={dout:.3e} (tol {:.0e}) state_max_abs_diff={dst:.3e} (tol {:.0e}, max |S| {smax:.3}) {}",
                    p.num_key_heads,
                    p.key_head_dim,
                    p.value_head_dim,
                    tol(dtype),
                    state_tol(dtype),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{dtype} {p:?} {splits:?}: out {dout} state {dst}"));
                }
            }
            println!(
                "RESULT chunked_vs_scan summary dtype={dtype} heads={}/{nv} dk={} dv={} worst out {worst_o:.3e} state {worst_s:.3e}",
                p.num_key_heads, p.key_head_dim, p.value_head_dim
            );
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
