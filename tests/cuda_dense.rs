//! The batch-invariant dense matmuls (`KILN_DENSE_MATMUL=fma|mma`, `kernels/dense.cu`) on a GPU:
//! a row's output is bit-identical computed alone, inside a batch of 64 rows and inside one of
//! 257 (the lm_head's f32-output variant too), close to cuBLAS; the tensor-core `mma` kernels
//! (small and large) agree with each other bit for bit at 1, 2, 7, 16, 17, 33, 40, 57, 64 and 257
//! rows and
//! with a CPU reference on the 16-bit inputs; all timed against cuBLAS at decode and prefill row
//! counts (`RESULT` lines for docs/gpu-validation.md and docs/benchmarks.md). The fused q|k|v +
//! RoPE + KV write (`norm_matmul_rope_write`) equals `norm_matmul` + `qkv_rope_write` bit for bit.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `cuda_dense-<hash> --ignored --test-threads=1 --nocapture` (and `source .gpu/shared/env70.sh`
//! first for the sm_70 path, fp16 only there).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::dense::{decode_batch, f32_view, residual_from, smol_layer, weight_f32, SmolLayer};
use common::*;
use kiln::backend::cuda::{CudaBackend, DenseMatmul, MmaKernel};
use kiln::backend::{AttentionParams, Backend, KvCacheSpec, RopeSpec};

/// A backend whose dense matmuls take `kind` (`cublas`, `fma`, `mma`): the switch is read at
/// creation.
fn backend(dtype: &str, kind: &str) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    std::env::set_var("KILN_DENSE_MATMUL", kind);
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    b
}

/// The kinds a batch-invariance test runs on this GPU: `mma` only where it is not `fma` (sm_80+).
fn invariant_kinds(dtype: &str) -> Vec<&'static str> {
    let mut v = vec!["fma"];
    if backend(dtype, "mma").dense_matmul_kind() == DenseMatmul::Mma {
        v.push("mma");
    }
    v
}

fn weight(b: &CudaBackend, n: usize, k: usize, seed: u64) -> <CudaBackend as Backend>::Weight {
    weight_f32(b, &data(n * k, seed), n, k)
}

fn matmul(
    b: &CudaBackend,
    x: &<CudaBackend as Backend>::Buffer,
    rows: usize,
    w: &<CudaBackend as Backend>::Weight,
    n: usize,
) -> Vec<f32> {
    let mut o = b.alloc(rows * n).expect("alloc");
    b.matmul(x, rows, w, &mut o).expect("matmul");
    down(b, &o, rows * n)
}

fn logits(
    b: &CudaBackend,
    x: &<CudaBackend as Backend>::Buffer,
    rows: usize,
    w: &<CudaBackend as Backend>::Weight,
    n: usize,
) -> Vec<f32> {
    let lg = b.logits(x, rows, w).expect("logits");
    let mut host = vec![f32::NAN; rows * n];
    b.download_logits(&lg, 0, &mut host).expect("download");
    host
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    max_diff(a, b) / scale
}

/// The SmolLM2 projection shapes (q|k|v, o, gate|up, down) and its lm_head.
const SHAPES: [(usize, usize); 4] = [(960, 576), (576, 576), (3072, 576), (576, 1536)];
const LM_HEAD: (usize, usize) = (49152, 576);

#[test]
#[ignore = "needs a GPU: see the header"]
fn one_row_is_bit_identical_alone_and_in_batches_of_64_and_257() {
    let mut failures = Vec::new();
    for (dtype, kind) in dtypes()
        .into_iter()
        .filter(|d| *d != "f32")
        .flat_map(|d| invariant_kinds(d).into_iter().map(move |k| (d, k)))
    {
        let dense = backend(dtype, kind);
        let blas = backend(dtype, "cublas");
        for (i, &(n, k)) in SHAPES.iter().chain([&LM_HEAD]).enumerate() {
            let lm = (n, k) == LM_HEAD;
            let x_host = data(257 * k, 10 + i as u64);
            let (xd, xb) = (
                dense.upload(&x_host).unwrap(),
                blas.upload(&x_host).unwrap(),
            );
            let (wd, wb) = (
                weight(&dense, n, k, 20 + i as u64),
                weight(&blas, n, k, 20 + i as u64),
            );
            let run = |b: &CudaBackend, x, w, rows| {
                if lm {
                    logits(b, x, rows, w, n)
                } else {
                    matmul(b, x, rows, w, n)
                }
            };
            let one = run(&dense, &xd, &wd, 1);
            let r64 = run(&dense, &xd, &wd, 64);
            let r257 = run(&dense, &xd, &wd, 257);
            let alone_equal = bits(&one) == bits(&r64[..n]) && bits(&one) == bits(&r257[..n]);
            let batch_equal = bits(&r64) == bits(&r257[..64 * n]);
            let reference = run(&blas, &xb, &wb, 257);
            let rel = rel_diff(&r257, &reference);
            let ok = alone_equal && batch_equal && rel <= 1e-2;
            println!(
                "RESULT dense kind={kind} dtype={dtype} n={n} k={k} out={} row0_alone_eq_64_eq_257={alone_equal} \
                 rows64_eq_first64_of_257={batch_equal} rel_diff_vs_cublas={rel:e} ok={ok}",
                if lm { "f32" } else { dtype }
            );
            if !ok {
                failures.push(format!("{kind} {dtype} {n}x{k}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn dense_against_cublas_timings() {
    // Wall time of `iters` back-to-back calls after a warm-up, with one synchronize at the end;
    // GB/s counts the weight bytes once per call (what a decode step must stream).
    let iters = 200;
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        for name in ["fma", "mma", "cublas"] {
            let b = backend(dtype, name);
            if name == "mma" && b.dense_matmul_kind() != DenseMatmul::Mma {
                continue;
            }
            for &(n, k) in SHAPES.iter().chain([&LM_HEAD]) {
                let w = weight(&b, n, k, 7);
                for rows in [1usize, 4, 16, 64, 512] {
                    let x = b.upload(&data(rows * k, 3)).unwrap();
                    let mut o = b.alloc(rows * n).unwrap();
                    for _ in 0..10 {
                        b.matmul(&x, rows, &w, &mut o).unwrap();
                    }
                    b.synchronize().unwrap();
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        b.matmul(&x, rows, &w, &mut o).unwrap();
                    }
                    b.synchronize().unwrap();
                    let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
                    let gbps = (n * k * 2) as f64 / (us * 1e3);
                    let tflops = 2.0 * (rows * n * k) as f64 / (us * 1e6);
                    println!(
                        "RESULT dense_time dtype={dtype} kernel={name} n={n} k={k} rows={rows} \
                         us={us:.2} weight_gbps={gbps:.0} tflops={tflops:.2}"
                    );
                }
            }
        }
    }
}

/// The small and the large `mma` kernel give the same bits at every row count, a row's bits do
/// not depend on the call's row count, and both match an f64 CPU reference on the 16-bit inputs
/// within the output rounding (the SmolLM2 shapes and one with ragged n and k).
#[test]
#[ignore = "needs a GPU: see the header"]
fn mma_small_and_large_agree_bit_for_bit_and_match_a_cpu_reference() {
    const ROWS: [usize; 10] = [1, 2, 7, 16, 17, 33, 40, 57, 64, 257];
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        let b = backend(dtype, "mma");
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT mma dtype={dtype} skipped: no tensor-core kernels on this target");
            continue;
        }
        // Output rounding to the 16-bit type dominates: 2^-8 (bf16) / 2^-11 (fp16) relative.
        let limit = if dtype == "bf16" { 8e-3 } else { 1.5e-3 };
        for (i, &(n, k)) in SHAPES.iter().chain([&(100, 200)]).enumerate() {
            let x_host = data(257 * k, 40 + i as u64);
            let w_host = data(n * k, 50 + i as u64);
            let x = b.upload(&x_host).unwrap();
            let w = weight_f32(&b, &w_host, n, k);
            let xr: Vec<f64> = x_host.iter().map(|&v| f64::from(round(dtype, v))).collect();
            let wr: Vec<f64> = w_host.iter().map(|&v| f64::from(round(dtype, v))).collect();
            let want: Vec<f32> = (0..257 * n)
                .map(|e| {
                    let (r, c) = (e / n, e % n);
                    let s: f64 = (0..k).map(|j| xr[r * k + j] * wr[c * k + j]).sum();
                    s as f32
                })
                .collect();
            let run = |rows: usize, kernel: MmaKernel| {
                let mut o = b.alloc(rows * n).unwrap();
                b.matmul_dense_mma_with(&x, rows, &w, &mut o, kernel)
                    .unwrap();
                down(&b, &o, rows * n)
            };
            let full = run(257, MmaKernel::Large);
            for rows in ROWS {
                let small = run(rows, MmaKernel::Small);
                let large = run(rows, MmaKernel::Large);
                let kernels_equal = bits(&small) == bits(&large);
                let prefix_equal = bits(&small) == bits(&full[..rows * n]);
                let rel = rel_diff(&small, &want[..rows * n]);
                let ok = kernels_equal && prefix_equal && rel <= limit;
                println!(
                    "RESULT mma dtype={dtype} n={n} k={k} rows={rows} small_eq_large={kernels_equal} \
                     eq_rows_of_257={prefix_equal} rel_diff_vs_cpu={rel:e} ok={ok}"
                );
                if !ok {
                    failures.push(format!("{dtype} {n}x{k} rows {rows}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The SwiGLU epilogue (`gate_up_swiglu` on a weight from `upload_gate_up`, rows interleaved at
/// load) gives exactly the bits of the unfused `mma` matmul on the stacked weight followed by
/// `swiglu`, at decode and prefill row counts; a cuBLAS backend keeps the unfused form.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_swiglu_epilogue_equals_the_matmul_then_swiglu_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        for kind in ["mma", "cublas"] {
            let b = backend(dtype, kind);
            if kind == "mma" && b.dense_matmul_kind() != DenseMatmul::Mma {
                println!("RESULT swiglu dtype={dtype} skipped: no tensor-core kernels here");
                continue;
            }
            for (i, &(inter, k)) in [(1536usize, 576usize), (104, 200)].iter().enumerate() {
                let g_host = data(inter * k, 60 + i as u64);
                let u_host = data(inter * k, 70 + i as u64);
                let shape = [inter, k];
                let (gv, uv) = (f32_view(&g_host, &shape), f32_view(&u_host, &shape));
                let stacked = b.upload_weight_rows("gu", &[gv, uv]).unwrap();
                let fused = b.upload_gate_up("gu", &[gv, uv]).unwrap();
                let x = b.upload(&data(257 * k, 80 + i as u64)).unwrap();
                for rows in [1usize, 7, 16, 33, 40, 57, 64, 257] {
                    let mut scratch = b.alloc(rows * 2 * inter).unwrap();
                    let mut want = b.alloc(rows * inter).unwrap();
                    b.matmul(&x, rows, &stacked, &mut scratch).unwrap();
                    b.swiglu(&scratch, &mut want, rows, inter).unwrap();
                    let mut got = b.alloc(rows * inter).unwrap();
                    b.gate_up_swiglu(&x, rows, &fused, &mut scratch, &mut got, inter)
                        .unwrap();
                    let (w, g) = (down(&b, &want, rows * inter), down(&b, &got, rows * inter));
                    let ok = bits(&w) == bits(&g) && g.iter().all(|v| v.is_finite());
                    println!(
                        "RESULT swiglu kind={kind} dtype={dtype} inter={inter} k={k} rows={rows} \
                         fused_eq_unfused={ok}"
                    );
                    if !ok {
                        failures.push(format!("{kind} {dtype} {inter}x{k} rows {rows}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The fused decode ops of the llama layer (`KILN_FUSED_DECODE_ROWS`, dense.cu's NORM prologue
/// and RES epilogue): `norm_matmul` and `norm_gate_up_swiglu` match `rms_norm` then the unfused
/// op within the 16-bit rounding (the prologue sums a row's squares in its own order),
/// `matmul_residual` equals `matmul` + `add_rms_norm`'s residual bit for bit on an `mma` backend
/// (the same product, the same f32 add), and each is batch-invariant: a row gives the same bits
/// alone and in steps of 7, 16, 17, 33, 40, 57 and 64 rows. On the default (cuBLAS) backend the fused ops
/// run the same kernels, compared with the cuBLAS unfused ops within the rounding.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_decode_ops_match_the_unfused_ones_and_are_batch_invariant() {
    const ROWS: [usize; 8] = [1, 7, 16, 17, 33, 40, 57, 64];
    let (hidden, qkv_n, inter) = (576usize, 960usize, 1536usize);
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        for kind in ["mma", "cublas"] {
            std::env::set_var("KILN_FUSED_DECODE_ROWS", "64");
            let b = backend(dtype, kind);
            std::env::remove_var("KILN_FUSED_DECODE_ROWS");
            if b.fused_decode_limit() == 0 {
                println!("RESULT fused dtype={dtype} kind={kind} skipped: no tensor-core kernels");
                continue;
            }
            let limit = if dtype == "bf16" { 2e-2 } else { 4e-3 };
            let x_host: Vec<f32> = data(64 * hidden, 90).iter().map(|v| 3.0 * v).collect();
            let SmolLayer {
                norm_w,
                qkv,
                o,
                gu,
                down: down_w,
            } = smol_layer(&b);
            let a_host = data(64 * inter, 97);
            let eps = 1e-5;
            // norm_matmul (q|k|v) and norm_gate_up_swiglu (the SwiGLU output) of `rows` rows.
            let fused_norm_ops = |x: &<CudaBackend as Backend>::Buffer, rows: usize| {
                let mut h = b.alloc(rows * hidden).unwrap();
                let mut got = b.alloc(rows * qkv_n).unwrap();
                b.norm_matmul(x, &norm_w, eps, rows, hidden, &qkv, &mut h, &mut got)
                    .unwrap();
                let mut scratch = b.alloc(rows * 2 * inter).unwrap();
                let mut act = b.alloc(rows * inter).unwrap();
                b.norm_gate_up_swiglu(
                    x,
                    &norm_w,
                    eps,
                    rows,
                    hidden,
                    &gu,
                    &mut h,
                    &mut scratch,
                    &mut act,
                    inter,
                )
                .unwrap();
                (down(&b, &got, rows * qkv_n), down(&b, &act, rows * inter))
            };
            let mut full: Option<[Vec<f32>; 3]> = None;
            for rows in ROWS {
                let x = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                let (got_qkv, got_act) = fused_norm_ops(&x, rows);
                // norm_matmul vs rms_norm + matmul.
                let mut h = b.alloc(rows * hidden).unwrap();
                b.rms_norm(&x, &norm_w, &mut h, rows, hidden, eps).unwrap();
                let want_qkv = matmul(&b, &h, rows, &qkv, qkv_n);
                let rel_qkv = rel_diff(&got_qkv, &want_qkv);
                // norm_gate_up_swiglu vs rms_norm + gate_up_swiglu.
                let mut scratch = b.alloc(rows * 2 * inter).unwrap();
                let mut act = b.alloc(rows * inter).unwrap();
                b.rms_norm(&x, &norm_w, &mut h, rows, hidden, eps).unwrap();
                b.gate_up_swiglu(&h, rows, &gu, &mut scratch, &mut act, inter)
                    .unwrap();
                let want_act = down(&b, &act, rows * inter);
                let rel_act = rel_diff(&got_act, &want_act);
                // matmul_residual (o: k = hidden; down: k = inter) vs matmul + add_rms_norm.
                let mut res = Vec::new();
                let mut res_equal = true;
                for (w, k) in [(&o, hidden), (&down_w, inter)] {
                    let xin = b.upload(&a_host[..rows * k]).unwrap();
                    let mut r_got = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                    let mut delta = b.alloc(rows * hidden).unwrap();
                    b.matmul_residual(&xin, rows, w, &mut delta, &mut r_got, hidden)
                        .unwrap();
                    let mut r_want = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                    b.matmul(&xin, rows, w, &mut delta).unwrap();
                    b.add_rms_norm(&mut r_want, &delta, &norm_w, &mut h, rows, hidden, eps)
                        .unwrap();
                    let (g, wv) = (
                        down(&b, &r_got, rows * hidden),
                        down(&b, &r_want, rows * hidden),
                    );
                    let close = rel_diff(&g, &wv) <= limit;
                    res_equal &= if kind == "mma" {
                        bits(&g) == bits(&wv)
                    } else {
                        close
                    };
                    res.push(g);
                }
                let ok_close = rel_qkv <= limit && rel_act <= limit && res_equal;
                println!(
                    "RESULT fused kind={kind} dtype={dtype} rows={rows} norm_qkv_rel={rel_qkv:e} \
                     norm_swiglu_rel={rel_act:e} residual_ok={res_equal} ok={ok_close}"
                );
                if !ok_close {
                    failures.push(format!("{kind} {dtype} rows {rows}: unfused mismatch"));
                }
                if rows == 64 {
                    full = Some([got_qkv, got_act, res.swap_remove(1)]);
                }
            }
            // Rows 0..r of the 64-row step equal the r-row step's.
            let full = full.expect("64 rows ran");
            for rows in ROWS {
                let x = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                let (q, a) = fused_norm_ops(&x, rows);
                let xin = b.upload(&a_host[..rows * inter]).unwrap();
                let mut r = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                let mut delta = b.alloc(rows * hidden).unwrap();
                b.matmul_residual(&xin, rows, &down_w, &mut delta, &mut r, hidden)
                    .unwrap();
                let d = down(&b, &r, rows * hidden);
                let inv = bits(&q) == bits(&full[0][..rows * qkv_n])
                    && bits(&a) == bits(&full[1][..rows * inter])
                    && bits(&d) == bits(&full[2][..rows * hidden]);
                println!("RESULT fused kind={kind} dtype={dtype} rows={rows} eq_rows_of_64={inv}");
                if !inv {
                    failures.push(format!("{kind} {dtype} rows {rows}: not batch-invariant"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The fused q|k|v projection with RoPE and the KV write in its epilogue
/// (`norm_matmul_rope_write`, dense.cu's NORM_ROPE): q, the written k and v equal `norm_matmul`
/// then `qkv_rope_write` bit for bit (k / v compared through a paged attention over each cache
/// with the same q: identical caches give identical bits), for 1, 3, 8 and 17 decode rows at
/// assorted positions, on the `mma` and default backends, with the KV cache in the compute dtype
/// and in fp8. That the fused kernel ran is checked too: it leaves the unfused form's q|k|v
/// scratch untouched (a sentinel), which the unfused pair overwrites. SmolLM2's attention shape
/// (hidden 576, 9 / 3 heads × 64).
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_qkv_rope_write_equals_norm_matmul_then_qkv_rope_write_bit_for_bit() {
    let (hidden, heads, kv_heads, hd) = (576usize, 9usize, 3usize, 64usize);
    let qkv_n = (heads + 2 * kv_heads) * hd;
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let num_blocks = 4096;
    let mut failures = Vec::new();
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        for kind in ["mma", "cublas"] {
            for kv in ["auto", "fp8_e4m3"] {
                std::env::set_var("KILN_DENSE_MATMUL", kind);
                std::env::set_var("KILN_FUSED_DECODE_ROWS", "64");
                let b = gpu(dtype, kv);
                std::env::remove_var("KILN_FUSED_DECODE_ROWS");
                std::env::remove_var("KILN_DENSE_MATMUL");
                if b.fused_decode_limit() == 0 {
                    println!("RESULT rope_fused dtype={dtype} kind={kind} kv={kv} skipped");
                    continue;
                }
                let rope = b
                    .create_rope(&RopeSpec {
                        rotary_dim: hd,
                        theta: 10000.0,
                        max_positions: 2048,
                    })
                    .unwrap();
                let spec = KvCacheSpec {
                    num_layers: 1,
                    num_blocks,
                    block_size: 16,
                    num_kv_heads: kv_heads,
                    head_dim: hd,
                };
                let norm_w = b
                    .upload(
                        &data(hidden, 71)
                            .iter()
                            .map(|v| 1.0 + 0.5 * v)
                            .collect::<Vec<_>>(),
                    )
                    .unwrap();
                let w = weight(&b, qkv_n, hidden, 72);
                let x_host: Vec<f32> = data(64 * hidden, 73).iter().map(|v| 3.0 * v).collect();
                for rows in [1usize, 3, 8, 17, 33, 40, 57, 64] {
                    // One decode token per sequence, sequence r at position 5 + 29 r (< 1 900),
                    // each with blocks of its own (the zeroed caches give both forms the same
                    // context).
                    let batch = decode_batch(rows, |r| 5 + 29 * r, 16);
                    let input = batch.step_input(16, num_blocks, 50, 2048).unwrap();
                    let st = b.prepare_step(&input).unwrap();
                    let x = residual_from(&b, &x_host[..rows * hidden], rows, hidden);
                    let mut h = b.alloc(rows * hidden).unwrap();
                    // Fused, with a sentinel in the unfused form's q|k|v scratch.
                    let sentinel = vec![7.0f32; rows * qkv_n];
                    let mut qkv = b.upload(&sentinel).unwrap();
                    let mut q_f = b.alloc(rows * heads * hd).unwrap();
                    let mut cache_f = b.create_kv_cache(&spec).unwrap();
                    b.norm_matmul_rope_write(
                        &x,
                        &norm_w,
                        1e-5,
                        rows,
                        hidden,
                        &w,
                        &mut h,
                        &mut qkv,
                        &mut q_f,
                        &mut cache_f,
                        0,
                        &rope,
                        &st,
                        &params,
                    )
                    .unwrap();
                    let fused_ran = bits(&down(&b, &qkv, rows * qkv_n)) == bits(&sentinel);
                    // Unfused.
                    let mut q_u = b.alloc(rows * heads * hd).unwrap();
                    let mut cache_u = b.create_kv_cache(&spec).unwrap();
                    b.norm_matmul(&x, &norm_w, 1e-5, rows, hidden, &w, &mut h, &mut qkv)
                        .unwrap();
                    b.qkv_rope_write(&qkv, &mut q_u, &mut cache_u, 0, &rope, &st, &params, None)
                        .unwrap();
                    let (qf, qu) = (
                        down(&b, &q_f, rows * heads * hd),
                        down(&b, &q_u, rows * heads * hd),
                    );
                    let mut att_f = b.alloc(rows * heads * hd).unwrap();
                    let mut att_u = b.alloc(rows * heads * hd).unwrap();
                    b.paged_attention(&q_u, &cache_f, 0, &st, &params, &mut att_f)
                        .unwrap();
                    b.paged_attention(&q_u, &cache_u, 0, &st, &params, &mut att_u)
                        .unwrap();
                    let (af, au) = (
                        down(&b, &att_f, rows * heads * hd),
                        down(&b, &att_u, rows * heads * hd),
                    );
                    let q_eq = bits(&qf) == bits(&qu);
                    let kv_eq = bits(&af) == bits(&au);
                    let finite = qf.iter().chain(&af).all(|v| v.is_finite());
                    let ok = fused_ran && q_eq && kv_eq && finite;
                    println!(
                        "RESULT rope_fused dtype={dtype} kind={kind} kv={kv} rows={rows} \
                         fused_ran={fused_ran} q_bits_equal={q_eq} kv_bits_equal={kv_eq} \
                         q_rel={:e} att_rel={:e} ok={ok}",
                        rel_diff(&qf, &qu),
                        rel_diff(&af, &au)
                    );
                    if !ok {
                        failures.push(format!("{dtype} {kind} {kv} rows {rows}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
