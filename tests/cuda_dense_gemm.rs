//! The pipelined batch-invariant dense GEMM (`kernels/dense_gemm.cu`, what `KILN_DENSE_MATMUL=mma`
//! runs above 64 rows) on a GPU: every tile (t0..t5, and the automatic choice) gives the same
//! bits as the small `mma` kernel (`dense_mma_small`, whose numerics define the path) and as
//! `dense_mma_large`, for every epilogue (compute dtype, f32, SwiGLU), on SmolLM2's and the 27B's
//! shapes at 65..4096 rows, bf16 and fp16; and a timing table of GEMM (each tile) vs `Large` vs
//! cuBLAS in TFLOP/s (`RESULT` lines for docs/benchmarks.md).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_dense_gemm`): `cuda_dense_gemm-<hash> --ignored --test-threads=1 --nocapture`
//! (`KILN_GEMM_TEST_BIG=0` leaves out the 27B shapes; `KILN_GEMM_TIME_ROWS=512,2048` sets the
//! timing's row counts; `KILN_GEMM_BUDGET_S=40`: each test starts no new shape after that many
//! seconds and says which it left out, so a capped GPU run still reports what it did;
//! `KILN_GEMM_PREFETCH_VARIANTS=0,1` (the default): the GEMM builds checked and timed, by their
//! `KILN_DENSE_GEMM_PREFETCH`).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::dense::{probe_bits, weight16};
use common::*;
use kiln::backend::cuda::{CudaBackend, DenseMatmul, GemmTile, MmaKernel, MmaOut};
use kiln::backend::Backend;

/// A backend whose dense matmuls take `kind` (`cublas`, `mma`): the switch is read at creation.
fn backend(dtype: &str, kind: &str) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    std::env::set_var("KILN_DENSE_MATMUL", kind);
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    b
}

/// `KILN_GEMM_PREFETCH_VARIANTS` (default `0,1`): the values of `KILN_DENSE_GEMM_PREFETCH` the
/// tests build the GEMM with.
fn prefetch_variants() -> Vec<&'static str> {
    let v = std::env::var("KILN_GEMM_PREFETCH_VARIANTS").unwrap_or_else(|_| "0,1".into());
    ["0", "1"]
        .into_iter()
        .filter(|p| v.split(',').any(|x| x.trim() == *p))
        .collect()
}

/// [`backend`] with `KILN_DENSE_GEMM_PREFETCH=pf` (read when its kernels are compiled).
fn backend_pf(dtype: &str, kind: &str, pf: &str) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    std::env::set_var("KILN_DENSE_GEMM_PREFETCH", pf);
    let b = backend(dtype, kind);
    std::env::remove_var("KILN_DENSE_GEMM_PREFETCH");
    b
}

/// (n, k, name, epilogues, row counts) of the equality test.
type Case = (
    usize,
    usize,
    &'static str,
    &'static [MmaOut],
    &'static [usize],
);

const ALL_OUT: &[MmaOut] = &[MmaOut::Same, MmaOut::F32, MmaOut::Swiglu];
const ROWS: &[usize] = &[65, 127, 257, 1000, 4096];

/// SmolLM2-135M (hidden 576, inter 1536, 9 + 3 + 3 heads of 64, vocab 49152) and ragged sizes.
const SMOL: &[Case] = &[
    (576, 576, "o", ALL_OUT, ROWS),
    (208, 200, "ragged", ALL_OUT, &[65, 127, 257]),
    (192, 576, "k|v", ALL_OUT, ROWS),
    (3072, 576, "gate|up", ALL_OUT, ROWS),
    (576, 1536, "down", ALL_OUT, ROWS),
    (
        49152,
        576,
        "lm_head",
        &[MmaOut::Same, MmaOut::F32],
        &[65, 257, 1000],
    ),
];

/// The 27B's (hidden 5120, inter 17408, vocab 248320).
const BIG: &[Case] = &[
    (10240, 5120, "q|gate", &[MmaOut::Same], &[65, 257, 1000]),
    (
        6144,
        5120,
        "qkv",
        &[MmaOut::Same, MmaOut::F32],
        &[65, 257, 1000, 4096],
    ),
    (
        17408,
        5120,
        "up",
        &[MmaOut::Same, MmaOut::Swiglu],
        &[65, 257, 1000],
    ),
    (5120, 17408, "down", &[MmaOut::Same], &[65, 257, 1000]),
    (248320, 5120, "lm_head", &[MmaOut::F32], &[65, 257]),
];

/// `KILN_GEMM_BUDGET_S` (unset: no limit): whether a test started at `start` is out of time.
fn out_of_time(start: Instant) -> bool {
    std::env::var("KILN_GEMM_BUDGET_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(|b| start.elapsed().as_secs_f64() > b)
}

/// Every GEMM tile, the automatic GEMM and `dense_mma_large` give the small kernel's bits.
#[test]
#[ignore = "needs a GPU: see the header"]
fn the_gemm_equals_the_small_mma_kernel_bit_for_bit() {
    let start = Instant::now();
    let big = !std::env::var("KILN_GEMM_TEST_BIG").is_ok_and(|v| v == "0");
    let mut failures = Vec::new();
    let mut compared = 0usize;
    let mut left_out = Vec::new();
    // bf16 on SmolLM2's shapes and the 27B's, then fp16 (the GPU run's budget may end it), each
    // with the kernel built as it is by default and with KILN_DENSE_GEMM_PREFETCH=1.
    // `KILN_GEMM_EQ_PHASES=fp16:big:0,bf16:smol:1` (dtype : smol / big : prefetch build) runs
    // those phases in that order instead.
    let mut phases: Vec<(&str, &[Case], &str)> = Vec::new();
    for dtype in ["bf16", "fp16"] {
        for (cases, on) in [(SMOL, true), (BIG, big)] {
            for pf in prefetch_variants() {
                if on {
                    phases.push((dtype, cases, pf));
                }
            }
        }
    }
    if let Ok(list) = std::env::var("KILN_GEMM_EQ_PHASES") {
        phases = list
            .split(',')
            .filter_map(|p| {
                let f: Vec<&str> = p.trim().split(':').collect();
                let dtype = ["bf16", "fp16"]
                    .into_iter()
                    .find(|d| Some(d) == f.first())?;
                let cases: &[Case] = match f.get(1) {
                    Some(&"smol") => SMOL,
                    Some(&"big") => BIG,
                    _ => return None,
                };
                let pf = ["0", "1"].into_iter().find(|v| Some(v) == f.get(2))?;
                Some((dtype, cases, pf))
            })
            .collect();
        assert!(!phases.is_empty(), "KILN_GEMM_EQ_PHASES={list:?}: no phase");
    }
    let available = dtypes();
    for (dtype, cases, pf) in phases {
        if !available.contains(&dtype) {
            continue;
        }
        let b = backend_pf(dtype, "mma", pf);
        if b.dense_matmul_kind() != DenseMatmul::Mma {
            println!("RESULT gemm_eq dtype={dtype} skipped: no tensor-core kernels on this target");
            continue;
        }
        for (ci, &(n, k, name, outs, rows_list)) in cases.iter().enumerate() {
            if out_of_time(start) {
                left_out.push(format!("{dtype} pf{pf} {name} {n}x{k}"));
                continue;
            }
            let t0 = Instant::now();
            let w = weight16(&b, dtype, n, k, 100 + ci as u64);
            let max_rows = *rows_list.iter().max().unwrap();
            let x = b.upload(&data(max_rows * k, 200 + ci as u64)).unwrap();
            for &rows in rows_list {
                for &out in outs {
                    let want = probe_bits(&b, &x, rows, &w, MmaKernel::Small, out);
                    let mut kernels: Vec<(String, MmaKernel)> = GemmTile::ALL
                        .iter()
                        .map(|&t| (format!("{t:?}"), MmaKernel::GemmTile(t)))
                        .collect();
                    kernels.push(("auto".into(), MmaKernel::Gemm));
                    // The unstaged large kernel is slow on the huge shapes; its equality with
                    // the small one is tests/cuda_dense.rs's.
                    if n * k <= 50_000_000 {
                        kernels.push(("large".into(), MmaKernel::Large));
                    }
                    let mut bad = Vec::new();
                    for (kname, kernel) in &kernels {
                        let got = probe_bits(&b, &x, rows, &w, *kernel, out);
                        compared += 1;
                        if got != want {
                            let first = got.iter().zip(&want).position(|(a, b)| a != b);
                            let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                            bad.push(format!("{kname}: {diff} differ, first at {first:?}"));
                        }
                    }
                    let ok = bad.is_empty();
                    println!(
                        "RESULT gemm_eq dtype={dtype} prefetch={pf} shape={name} n={n} k={k} \
                         rows={rows} out={out:?} kernels={} ok={ok} {}",
                        kernels.len(),
                        bad.join("; ")
                    );
                    if !ok {
                        failures.push(format!(
                            "{dtype} pf{pf} {name} {n}x{k} rows {rows} {out:?}: {bad:?}"
                        ));
                    }
                }
            }
            println!(
                "RESULT gemm_eq_shape dtype={dtype} prefetch={pf} shape={name} secs={:.2}",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "RESULT gemm_eq comparisons={compared} failures={} left_out_for_time={left_out:?}",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Median seconds per call of `f`: 2 warm-up calls, then 5 reps of as many back-to-back calls as
/// fill ~10 ms (at least 1), each rep ended by a synchronize.
fn median_secs(b: &CudaBackend, mut f: impl FnMut()) -> f64 {
    f();
    f();
    b.synchronize().unwrap();
    let s = Instant::now();
    f();
    b.synchronize().unwrap();
    let one = s.elapsed().as_secs_f64();
    let iters = ((0.01 / one) as usize).clamp(1, 50);
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            for _ in 0..iters {
                f();
            }
            b.synchronize().unwrap();
            s.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[2]
}

/// TFLOP/s of GEMM (each tile and auto) vs `Large` vs cuBLAS, output in the compute dtype, bf16.
#[test]
#[ignore = "needs a GPU: see the header"]
fn gemm_against_large_and_cublas_timings() {
    let rows_list: Vec<usize> = std::env::var("KILN_GEMM_TIME_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 2048, 4096]);
    let big = !std::env::var("KILN_GEMM_TEST_BIG").is_ok_and(|v| v == "0");
    let dtype = "bf16";
    let pfs = prefetch_variants();
    let mmas: Vec<CudaBackend> = pfs.iter().map(|pf| backend_pf(dtype, "mma", pf)).collect();
    let Some(mma) = mmas.first() else {
        return;
    };
    if mma.dense_matmul_kind() != DenseMatmul::Mma {
        println!("RESULT gemm_time skipped: no tensor-core kernels on this target");
        return;
    }
    let blas = backend(dtype, "cublas");
    // The 27B's shapes first (the headline), then SmolLM2's.
    let shapes: Vec<(usize, usize, &str)> = (if big { BIG } else { &[] })
        .iter()
        .chain(SMOL)
        .filter(|c| c.2 != "ragged")
        .map(|c| (c.0, c.1, c.2))
        .collect();
    let start = Instant::now();
    for (si, &(n, k, name)) in shapes.iter().enumerate() {
        if out_of_time(start) {
            println!("RESULT gemm_time shape={name} n={n} k={k} left out for time");
            continue;
        }
        let wms: Vec<_> = mmas
            .iter()
            .map(|b| weight16(b, dtype, n, k, 300 + si as u64))
            .collect();
        let wb = weight16(&blas, dtype, n, k, 300 + si as u64);
        for &rows in &rows_list {
            let flop = 2.0 * (rows * n * k) as f64;
            let xb = blas.upload(&data(rows * k, 400)).unwrap();
            let mut line =
                format!("RESULT gemm_time dtype={dtype} shape={name} n={n} k={k} rows={rows}");
            for ((b, wm), pf) in mmas.iter().zip(&wms).zip(&pfs) {
                let x = b.upload(&data(rows * k, 400)).unwrap();
                let mut kernels: Vec<(String, MmaKernel)> = GemmTile::ALL
                    .iter()
                    .map(|&t| (format!("{t:?}").to_lowercase(), MmaKernel::GemmTile(t)))
                    .collect();
                kernels.push(("auto".into(), MmaKernel::Gemm));
                // The unstaged kernel does not depend on the prefetch build; on the vocab-sized
                // shape it costs seconds: skipped there.
                if *pf == pfs[0] && n * k <= 500_000_000 {
                    kernels.push(("large".into(), MmaKernel::Large));
                }
                for (kname, kernel) in kernels {
                    let mut o = b.mma_probe_alloc(rows, wm, MmaOut::Same).unwrap();
                    let s =
                        median_secs(b, || b.mma_probe_run(&x, rows, wm, kernel, &mut o).unwrap());
                    let tag = if kname == "large" {
                        kname
                    } else {
                        format!("{kname}/pf{pf}")
                    };
                    line += &format!(" {tag}={:.1}", flop / s / 1e12);
                }
            }
            let mut o = blas.alloc(rows * n).unwrap();
            let s = median_secs(&blas, || blas.matmul(&xb, rows, &wb, &mut o).unwrap());
            line += &format!(" cublas={:.1} (TFLOP/s)", flop / s / 1e12);
            println!("{line}");
        }
    }
}
