//! The batch-invariant `mma` path at 1–64 rows (the small kernel's tiles rg1 / rg2 / rg4 / rg8 /
//! rg8w chosen by `KILN_DENSE_MID`, the GEMM for the lm_head from 17 rows) on a GPU:
//! - every tile of the small kernel (any of them at any row count), the dispatch
//!   (`MmaKernel::Small`, the warp budget) and the GEMM give the bits of the 8-row tile for every
//!   epilogue the probe has (compute dtype, f32, SwiGLU) at 1..64 rows (33, 40, 57, 64 among
//!   them), on SmolLM2's shapes, a ragged one, K = 5120 / 8192 (16 slices: the rg8 tile's 64 KiB
//!   of shared memory, and its block-size fallback where its registers do not allow 512
//!   threads) and the 27B's bf16 shapes (lm_head 248 320 × 5120 with f32 output, up 17 408 ×
//!   5120, down 5120 × 17 408) at 1, 17, 33 and 64 rows;
//! - the fused decode ops at 1–64 rows (the rg4 / rg8 NORM prologue with its multi-row sum of
//!   squares, the RES epilogue) equal the unfused ops bit for bit, on backends with
//!   `KILN_DENSE_MID` unset, `rg4` (main's tiles), `norm32` and `wide0` (the wide tile), fused up
//!   to 64 rows (the q|k|v RoPE epilogue at those rows: `tests/cuda_dense.rs`);
//! - timings (`RESULT mid_time` / `mid_fused_time` lines for docs/benchmarks.md): the SmolLM2
//!   shapes at 1 and 16–64 rows through each tile (with the x words preloaded and as before
//!   `mma64`: `_nopre`), the dispatch, the GEMM (auto, t1, t3) and cuBLAS, weights rotated over
//!   copies that do not fit the L2 (what a decode step streams), PDL on; the 27B's lm_head at
//!   16–64 rows; the fused ops against their unfused compositions at 16–64 rows.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_dense_mid`): `cuda_dense_mid-<hash> --ignored --test-threads=1 --nocapture`
//! (`KILN_MID_DTYPES=bf16` limits the dtypes of the bit tests, `KILN_MID_BIG=0` leaves out the
//! 27B's shapes; the timings are bf16).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::dense::{
    host16, probe_bits, residual_from, smol_layer, upload16, weight16 as weight, Buf,
    SmolLayer as Layer, Weight, HIDDEN, INTER, QKV_N,
};
use common::*;
use kiln::backend::cuda::{CudaBackend, DenseMatmul, GemmTile, MmaKernel, MmaOut};
use kiln::backend::Backend;

/// A `mma` backend with `KILN_DENSE_MID=mid` (`""`: the default) and the fused decode ops up to
/// 64 rows (both read at creation); `kind` the dense matmul.
fn backend(dtype: &str, kind: &str, mid: &str) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    std::env::set_var("KILN_DENSE_MATMUL", kind);
    std::env::set_var("KILN_DENSE_MID", mid);
    std::env::set_var("KILN_FUSED_DECODE_ROWS", "64");
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    std::env::remove_var("KILN_DENSE_MID");
    std::env::remove_var("KILN_FUSED_DECODE_ROWS");
    b
}

/// The 16-bit dtypes of the bit tests (`KILN_MID_DTYPES`, default both).
fn mid_dtypes() -> Vec<&'static str> {
    let v = std::env::var("KILN_MID_DTYPES").unwrap_or_else(|_| "bf16,fp16".into());
    dtypes()
        .into_iter()
        .filter(|d| *d != "f32" && v.split(',').any(|x| x.trim() == *d))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const ROWS: [usize; 12] = [1, 7, 8, 16, 17, 31, 32, 33, 40, 57, 63, 64];

/// (n, k, name) of the bit test: SmolLM2's shapes (q|k|v, o, gate|up, down, lm_head), a ragged
/// one, and K = 5120 / 8192 (16 slices: 64 KiB of partials in the rg8 tile).
const SHAPES: [(usize, usize, &str); 11] = [
    (960, 576, "qkv"),
    (576, 576, "o"),
    (3072, 576, "gate|up"),
    (576, 1536, "down"),
    (49152, 576, "lm_head"),
    (208, 200, "ragged"),
    (256, 5120, "k5120"),
    (160, 8192, "k8192"),
    (248_320, 5120, "27b_lm_head"),
    (17_408, 5120, "27b_up"),
    (5120, 17_408, "27b_down"),
];

/// The 27B's shapes (n ≥ 5120 and k ≥ 5120) run these rows only (a 2.5 GB weight).
const BIG_ROWS: [usize; 4] = [1, 17, 33, 64];

/// `KILN_MID_BIG=0`: leave out the 27B's shapes.
fn big() -> bool {
    !std::env::var("KILN_MID_BIG").is_ok_and(|v| v == "0")
}

/// Every row group, the dispatch and the GEMM give the bits of the 8-row tile (rg1), and a row's
/// bits do not depend on the call's row count (rows r of the 64-row rg8 call = the r-row call).
#[test]
#[ignore = "needs a GPU: see the header"]
fn every_row_group_and_the_gemm_give_the_same_bits_at_1_to_64_rows() {
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for dtype in mid_dtypes() {
        let b = backend(dtype, "mma", "");
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!(
                "RESULT mid_bits dtype={dtype} skipped: no tensor-core kernels on this target"
            );
            continue;
        }
        for (i, &(n, k, name)) in SHAPES.iter().enumerate() {
            let is_big = n >= 5120 && k >= 5120;
            if is_big && !big() {
                continue;
            }
            let rows_list: &[usize] = if is_big { &BIG_ROWS } else { &ROWS };
            let w = weight(&b, dtype, n, k, 500 + i as u64);
            let x = b.upload(&data(64 * k, 600 + i as u64)).unwrap();
            let outs: &[MmaOut] = if is_big {
                if n > 100_000 {
                    &[MmaOut::F32]
                } else {
                    &[MmaOut::Same]
                }
            } else if n % 16 == 0 {
                &[MmaOut::Same, MmaOut::F32, MmaOut::Swiglu]
            } else {
                &[MmaOut::Same, MmaOut::F32]
            };
            for &out in outs {
                let full = probe_bits(&b, &x, 64, &w, MmaKernel::SmallRg(8), out);
                let per_row = full.len() / 64;
                let mut bad = Vec::new();
                for &rows in rows_list {
                    let want = probe_bits(&b, &x, rows, &w, MmaKernel::SmallRg(1), out);
                    let mut kernels = vec![
                        ("rg2", MmaKernel::SmallRg(2)),
                        ("rg4", MmaKernel::SmallRg(4)),
                        ("rg8", MmaKernel::SmallRg(8)),
                        ("small", MmaKernel::Small),
                    ];
                    if k <= 1024 {
                        kernels.push(("rg8w", MmaKernel::SmallWide));
                    }
                    if rows > 16 {
                        kernels.push(("gemm", MmaKernel::Gemm));
                        kernels.push(("gemm_t3", MmaKernel::GemmTile(GemmTile::T3)));
                    }
                    for (kname, kernel) in kernels {
                        checked += 1;
                        if probe_bits(&b, &x, rows, &w, kernel, out) != want {
                            bad.push(format!("{kname}@{rows}"));
                        }
                    }
                    if want[..] != full[..rows * per_row] {
                        bad.push(format!("prefix@{rows}"));
                    }
                }
                let ok = bad.is_empty();
                println!(
                    "RESULT mid_bits dtype={dtype} shape={name} n={n} k={k} out={out:?} \
                     rows={rows_list:?} all_equal_rg1={ok} {}",
                    bad.join(",")
                );
                if !ok {
                    failures.push(format!("{dtype} {name} {out:?}: {bad:?}"));
                }
            }
        }
    }
    println!(
        "RESULT mid_bits comparisons={checked} failures={}",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Scratch of the fused / unfused layer ops for `rows` rows.
struct Scratch {
    h: Buf,
    qkv: Buf,
    gate_up: Buf,
    act: Buf,
    delta: Buf,
}

impl Scratch {
    fn new(b: &CudaBackend, rows: usize) -> Scratch {
        Scratch {
            h: b.alloc(rows * HIDDEN).unwrap(),
            qkv: b.alloc(rows * QKV_N).unwrap(),
            gate_up: b.alloc(rows * 2 * INTER).unwrap(),
            act: b.alloc(rows * INTER).unwrap(),
            delta: b.alloc(rows * HIDDEN).unwrap(),
        }
    }
}

const EPS: f32 = 1e-5;

/// q|k|v of rms_norm(x) into `s.qkv`: `norm_matmul` (fused) or `rms_norm` + `matmul`.
fn norm_qkv(b: &CudaBackend, l: &Layer, x: &Buf, rows: usize, fused: bool, s: &mut Scratch) {
    if fused {
        b.norm_matmul(
            x, &l.norm_w, EPS, rows, HIDDEN, &l.qkv, &mut s.h, &mut s.qkv,
        )
        .unwrap();
    } else {
        b.rms_norm(x, &l.norm_w, &mut s.h, rows, HIDDEN, EPS)
            .unwrap();
        b.matmul(&s.h, rows, &l.qkv, &mut s.qkv).unwrap();
    }
}

/// SwiGLU of rms_norm(x)'s gate|up into `s.act`: `norm_gate_up_swiglu` (fused) or `rms_norm` +
/// `gate_up_swiglu`.
fn norm_swiglu(b: &CudaBackend, l: &Layer, x: &Buf, rows: usize, fused: bool, s: &mut Scratch) {
    let (h, gu, act) = (&mut s.h, &mut s.gate_up, &mut s.act);
    if fused {
        b.norm_gate_up_swiglu(x, &l.norm_w, EPS, rows, HIDDEN, &l.gu, h, gu, act, INTER)
            .unwrap();
    } else {
        b.rms_norm(x, &l.norm_w, h, rows, HIDDEN, EPS).unwrap();
        b.gate_up_swiglu(h, rows, &l.gu, gu, act, INTER).unwrap();
    }
}

/// r += a · wᵀ: `matmul_residual` (fused) or `matmul` + `add_rms_norm`.
#[allow(clippy::too_many_arguments)]
fn residual_op(
    b: &CudaBackend,
    l: &Layer,
    w: &Weight,
    a: &Buf,
    r: &mut Buf,
    rows: usize,
    fused: bool,
    s: &mut Scratch,
) {
    if fused {
        b.matmul_residual(a, rows, w, &mut s.delta, r, HIDDEN)
            .unwrap();
    } else {
        b.matmul(a, rows, w, &mut s.delta).unwrap();
        b.add_rms_norm(r, &s.delta, &l.norm_w, &mut s.h, rows, HIDDEN, EPS)
            .unwrap();
    }
}

/// The fused ops of `rows` rows (fused = true) or their unfused compositions: the q|k|v of
/// `norm_matmul`, the SwiGLU output of `norm_gate_up_swiglu`, the residual after o_proj's and
/// down_proj's `matmul_residual`, as f32 bits.
fn layer_ops(
    b: &CudaBackend,
    l: &Layer,
    x_host: &[f32],
    a_host: &[f32],
    rows: usize,
    fused: bool,
) -> Vec<Vec<u32>> {
    let x = residual_from(b, &x_host[..rows * HIDDEN], rows, HIDDEN);
    let mut s = Scratch::new(b, rows);
    norm_qkv(b, l, &x, rows, fused, &mut s);
    norm_swiglu(b, l, &x, rows, fused, &mut s);
    let mut out = vec![
        bits(&down(b, &s.qkv, rows * QKV_N)),
        bits(&down(b, &s.act, rows * INTER)),
    ];
    for (w, k) in [(&l.o, HIDDEN), (&l.down, INTER)] {
        let xin = b.upload(&a_host[..rows * k]).unwrap();
        let mut r = residual_from(b, &x_host[..rows * HIDDEN], rows, HIDDEN);
        residual_op(b, l, w, &xin, &mut r, rows, fused, &mut s);
        out.push(bits(&down(b, &r, rows * HIDDEN)));
    }
    out
}

/// The fused decode ops at 1–64 rows (fused up to 64 rows here) equal the unfused ops bit for
/// bit (NORM prologue with the multi-row sum of squares of rg4 / rg8, RES epilogue), on the
/// default, `rg4`, `rg8`, `norm32` and `wide0` backends, and the backends agree; rows r of the
/// 64-row step equal the r-row step.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_fused_ops_at_17_to_64_rows_equal_the_unfused_ones_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in mid_dtypes() {
        let bs = [
            ("auto", backend(dtype, "mma", "")),
            ("rg4", backend(dtype, "mma", "rg4")),
            ("rg8", backend(dtype, "mma", "rg8")),
            ("norm32", backend(dtype, "mma", "norm32")),
            ("wide0", backend(dtype, "mma", "wide0")),
        ];
        if bs[0].1.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT mid_fused dtype={dtype} skipped: no tensor-core kernels");
            continue;
        }
        let x_host: Vec<f32> = data(64 * HIDDEN, 90).iter().map(|v| 3.0 * v).collect();
        let a_host = data(64 * INTER, 97);
        let mut first: Option<Vec<Vec<Vec<u32>>>> = None;
        for (mid, b) in &bs {
            let l = smol_layer(b);
            let full = layer_ops(b, &l, &x_host, &a_host, 64, true);
            let mut per_rows = Vec::new();
            for rows in ROWS {
                let f = layer_ops(b, &l, &x_host, &a_host, rows, true);
                let u = layer_ops(b, &l, &x_host, &a_host, rows, false);
                let names = ["norm_qkv", "norm_swiglu", "res_o", "res_down"];
                let neq: Vec<&str> = (0..4).filter(|&i| f[i] != u[i]).map(|i| names[i]).collect();
                let pre: Vec<&str> = (0..4)
                    .filter(|&i| f[i][..] != full[i][..f[i].len()])
                    .map(|i| names[i])
                    .collect();
                let ok = neq.is_empty() && pre.is_empty();
                println!(
                    "RESULT mid_fused dtype={dtype} mid={mid} rows={rows} fused_eq_unfused={} \
                     eq_rows_of_64={} ok={ok} {neq:?} {pre:?}",
                    neq.is_empty(),
                    pre.is_empty()
                );
                if !ok {
                    failures.push(format!("{dtype} {mid} rows {rows}: {neq:?} {pre:?}"));
                }
                per_rows.push(f);
            }
            match &first {
                None => first = Some(per_rows),
                Some(f0) => {
                    let same = *f0 == per_rows;
                    println!("RESULT mid_fused dtype={dtype} mid={mid} eq_auto_backend={same}");
                    if !same {
                        failures.push(format!("{dtype} {mid}: differs from auto"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Median µs per call of `f(i)` (i = the call's index, for rotating weights): a warm-up round of
/// `copies` calls, then 5 reps of as many back-to-back calls as fill ~4 ms (8..64, at least
/// `copies`), each rep ended by a synchronize.
fn median_us(b: &CudaBackend, copies: usize, mut f: impl FnMut(usize)) -> f64 {
    let s = Instant::now();
    for i in 0..copies {
        f(i);
    }
    b.synchronize().unwrap();
    let one = s.elapsed().as_secs_f64() / copies as f64;
    let iters = ((0.004 / one) as usize).clamp(8, 64).max(copies);
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            for i in 0..iters {
                f(i % copies);
            }
            b.synchronize().unwrap();
            s.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

/// Copies of an `n × k` weight that together pass 120 MB (more than the L2), at most 64.
fn copies_for(n: usize, k: usize) -> usize {
    (120_000_000 / (n * k * 2)).clamp(1, 64)
}

/// µs per call of the SmolLM2 shapes at 1 and 16–64 rows and the 27B's lm_head at 16–64 rows:
/// each small-kernel tile, the dispatch's (`auto`), the GEMM (auto, t1, t3) and cuBLAS (bf16,
/// weights rotated); with `KILN_MID_NOPRE=1` also each tile as before `mma64` (`_nopre`: a
/// build with `KILN_DENSE_BPRE=0`, compiled cold).
#[test]
#[ignore = "needs a GPU: see the header"]
fn mid_rows_kernel_timings() {
    let dtype = "bf16";
    let b = backend(dtype, "mma", "");
    if b.dense_matmul_kind() != DenseMatmul::Mma {
        println!("RESULT mid_time skipped: no tensor-core kernels on this target");
        return;
    }
    let blas = backend(dtype, "cublas", "");
    // The small kernels as before `mma64` (each k block's x words loaded just before its mmas).
    let nopre = std::env::var("KILN_MID_NOPRE")
        .is_ok_and(|v| v == "1")
        .then(|| {
            std::env::set_var("KILN_DENSE_BPRE", "0");
            let b = backend(dtype, "mma", "");
            std::env::remove_var("KILN_DENSE_BPRE");
            b
        });
    // (n, k, name, output): the lm_head writes f32 logits, gate|up the SwiGLU.
    let shapes = [
        (960usize, 576usize, "qkv", MmaOut::Same),
        (576, 576, "o", MmaOut::Same),
        (3072, 576, "gate|up", MmaOut::Swiglu),
        (576, 1536, "down", MmaOut::Same),
        (49152, 576, "lm_head", MmaOut::F32),
        (248_320, 5120, "27b_lm_head", MmaOut::F32),
    ];
    for (si, &(n, k, name, out)) in shapes.iter().enumerate() {
        let is_big = n * k > 1_000_000_000;
        if is_big && !big() {
            continue;
        }
        let copies = copies_for(n, k);
        // The same values in every copy (distinct allocations: what matters is the traffic).
        let host = host16(dtype, n, k, 700 + si as u64);
        let ws: Vec<Weight> = (0..copies)
            .map(|_| upload16(&b, dtype, &host, n, k))
            .collect();
        let wbs: Vec<Weight> = (0..copies)
            .map(|_| upload16(&blas, dtype, &host, n, k))
            .collect();
        let wns: Vec<Weight> = match &nopre {
            Some(nb) if !is_big => (0..copies)
                .map(|_| upload16(nb, dtype, &host, n, k))
                .collect(),
            _ => Vec::new(),
        };
        drop(host);
        let rows_list: &[usize] = if is_big {
            &[16, 32, 64]
        } else {
            &[1, 16, 32, 48, 64]
        };
        for &rows in rows_list {
            let x = b.upload(&data(rows * k, 800)).unwrap();
            let xb = blas.upload(&data(rows * k, 800)).unwrap();
            let mut line = format!(
                "RESULT mid_time dtype={dtype} shape={name} n={n} k={k} rows={rows} copies={copies}"
            );
            let mut kernels = vec![
                ("rg1", MmaKernel::SmallRg(1)),
                ("rg2", MmaKernel::SmallRg(2)),
                ("rg4", MmaKernel::SmallRg(4)),
                ("rg8", MmaKernel::SmallRg(8)),
                ("auto", MmaKernel::Small),
                ("gemm", MmaKernel::Gemm),
            ];
            if is_big {
                kernels.retain(|(name, _)| *name != "rg1");
            } else {
                kernels.push(("t1", MmaKernel::GemmTile(GemmTile::T1)));
                kernels.push(("t3", MmaKernel::GemmTile(GemmTile::T3)));
            }
            if k <= 1024 {
                kernels.push(("rg8w", MmaKernel::SmallWide));
            }
            for (kname, kernel) in kernels {
                let mut o = b.mma_probe_alloc(rows, &ws[0], out).unwrap();
                let us = median_us(&b, copies, |i| {
                    b.mma_probe_run(&x, rows, &ws[i], kernel, &mut o).unwrap()
                });
                line += &format!(" {kname}={us:.2}");
            }
            if let (Some(nb), false) = (&nopre, wns.is_empty()) {
                let xn = nb.upload(&data(rows * k, 800)).unwrap();
                for rg in [1usize, 2, 4, 8] {
                    let kernel = MmaKernel::SmallRg(rg);
                    let mut o = nb.mma_probe_alloc(rows, &wns[0], out).unwrap();
                    let us = median_us(nb, copies, |i| {
                        nb.mma_probe_run(&xn, rows, &wns[i], kernel, &mut o)
                            .unwrap()
                    });
                    line += &format!(" rg{rg}_nopre={us:.2}");
                }
            }
            // cuBLAS: the plain product (its SwiGLU / f32 forms are separate kernels or the
            // logits path; the product is what the tiles compete with).
            let mut o = blas.alloc(rows * n).unwrap();
            let us = median_us(&blas, copies, |i| {
                blas.matmul(&xb, rows, &wbs[i], &mut o).unwrap()
            });
            line += &format!(" cublas={us:.2} (us)");
            println!("{line}");
        }
    }
}

/// µs per call of the fused decode ops against their unfused compositions at 16, 32 and 64 rows
/// (fused up to 64 rows here), on the default, `rg4` and `wide0` backends (bf16, one
/// SmolLM2-shaped layer's weights rotated over 16 copies: 16 × 6.5 MB).
#[test]
#[ignore = "needs a GPU: see the header"]
fn mid_rows_fused_op_timings() {
    let dtype = "bf16";
    for mid in ["", "rg4", "wide0"] {
        let b = backend(dtype, "mma", mid);
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT mid_fused_time skipped: no tensor-core kernels on this target");
            return;
        }
        let copies = 16;
        let ls: Vec<Layer> = (0..copies).map(|_| smol_layer(&b)).collect();
        for rows in [16usize, 32, 64] {
            let x_host: Vec<f32> = data(rows * HIDDEN, 90).iter().map(|v| 3.0 * v).collect();
            let mut x = residual_from(&b, &x_host, rows, HIDDEN);
            let a = b.upload(&data(rows * INTER, 97)).unwrap();
            let mut s = Scratch::new(&b, rows);
            let mut t = Vec::new();
            for fused in [true, false] {
                let tag = if fused { "fused" } else { "unfused" };
                let us = median_us(&b, copies, |i| {
                    norm_qkv(&b, &ls[i], &x, rows, fused, &mut s)
                });
                t.push((format!("norm_qkv_{tag}"), us));
                let us = median_us(&b, copies, |i| {
                    norm_swiglu(&b, &ls[i], &x, rows, fused, &mut s)
                });
                t.push((format!("norm_swiglu_{tag}"), us));
                let us = median_us(&b, copies, |i| {
                    let l = &ls[i];
                    residual_op(&b, l, &l.down, &a, &mut x, rows, fused, &mut s)
                });
                t.push((format!("res_down_{tag}"), us));
            }
            let mut line = format!(
                "RESULT mid_fused_time dtype={dtype} mid={} rows={rows}",
                if mid.is_empty() { "auto" } else { mid }
            );
            for (name, us) in t {
                line += &format!(" {name}={us:.2}");
            }
            println!("{line} (us)");
        }
    }
}
