//! The batch-invariant dense matmul (`KILN_DENSE_MATMUL=1`, `kernels/dense.cu`) on a GPU: a row's
//! output is bit-identical computed alone, inside a batch of 64 rows and inside one of 257 (the
//! lm_head's f32-output variant too), close to cuBLAS, and timed against cuBLAS at decode and
//! prefill row counts (`RESULT` lines for docs/gpu-validation.md and docs/benchmarks.md).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `cuda_dense-<hash> --ignored --test-threads=1 --nocapture` (and `source .gpu/shared/env70.sh`
//! first for the sm_70 path, fp16 only there).
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
use kiln::backend::cuda::CudaBackend;
use kiln::backend::Backend;
use kiln::tensor::{TensorView, WeightDType};

/// Backends with (`dense`) and without the dense kernel: the switch is read at creation.
fn backend(dtype: &str, dense: bool) -> CudaBackend {
    // SAFETY (edition 2021: a safe call): the tests run on one thread (`--test-threads=1`).
    if dense {
        std::env::set_var("KILN_DENSE_MATMUL", "1");
    } else {
        std::env::remove_var("KILN_DENSE_MATMUL");
    }
    let b = gpu(dtype, "auto");
    std::env::remove_var("KILN_DENSE_MATMUL");
    b
}

fn weight(b: &CudaBackend, n: usize, k: usize, seed: u64) -> <CudaBackend as Backend>::Weight {
    let w = data(n * k, seed);
    let shape = [n, k];
    let view = TensorView {
        dtype: WeightDType::F32,
        shape: &shape,
        data: bytemuck::cast_slice(&w),
    };
    b.upload_weight("w", &view).expect("upload")
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
    for dtype in dtypes().into_iter().filter(|d| *d != "f32") {
        let dense = backend(dtype, true);
        let blas = backend(dtype, false);
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
                "RESULT dense dtype={dtype} n={n} k={k} out={} row0_alone_eq_64_eq_257={alone_equal} \
                 rows64_eq_first64_of_257={batch_equal} rel_diff_vs_cublas={rel:e} ok={ok}",
                if lm { "f32" } else { dtype }
            );
            if !ok {
                failures.push(format!("{dtype} {n}x{k}"));
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
        for (name, dense) in [("dense", true), ("cublas", false)] {
            let b = backend(dtype, dense);
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
