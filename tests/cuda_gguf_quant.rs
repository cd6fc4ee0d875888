//! GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K kept quantized on the GPU (`kernels/gguf_mm.cu`) against
//! the CPU dequantizing reference (`kiln::quant::dequantize_row`): every kernel on random blocks,
//! batch invariance and GEMV = GEMM bit for bit; the whole SmolLM2 Q4_1 GGUF and the tiny Q4_K_M
//! fixture (`scripts/gen-kquant-fixture.py`) on CUDA against the CPU backend, at 4 bits and with
//! the old dequantize-at-load path; and the speed figures of docs/benchmarks.md (the GEMV at one
//! row as a fraction of the copy bandwidth measured in the same run, and the quantized kernels
//! beside cuBLAS on the same weights dequantized).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`), from
//! the repository root:
//! `LD_LIBRARY_PATH=/usr/local/cuda/lib64 KILN_TEST_GGUF=/tmp/k/SmolLM2.gguf cuda_gguf_quant-<hash> --ignored --test-threads=1 --nocapture`
//! and for the V100 (sm_70) path, compute_70 PTX through the driver's JIT with NVRTC 12.9:
//! `source .gpu/shared/env70.sh && cuda_gguf_quant-<hash> --ignored --test-threads=1 --nocapture`.
//! Each test prints `RESULT` lines that go into docs/gpu-validation.md / docs/benchmarks.md.
//! The K-quant tests alone (`k_quant` in their names): `cuda_gguf_quant-<hash> --ignored
//! --test-threads=1 --nocapture k_quant`; `KILN_TEST_KQUANT_GGUF` overrides the path of the tiny
//! Q4_K_M fixture (default `tests/fixtures/tiny-llama-q4_k_m.gguf`).
//!
//! The reference: every weight dequantized exactly in f32 (`dequantize_row`), the input as the GPU
//! holds it (rounded to the compute dtype), dot products in f64. Relative error = max |Δ| / max
//! |reference| over the checked outputs, ≤ 1e-2 (16-bit weights and inputs). For N × K > 8M the
//! reference checks a seeded random subset of 256 output columns (all rows); every other shape is
//! checked in full.
#![cfg(feature = "cuda")]

mod common;
mod gguf_support;

use std::path::PathBuf;
use std::time::Instant;

use common::*;
use gguf_support::{OwnedGguf, Rng, FORMATS, K_FORMATS};
use kiln::backend::cuda::{CudaBackend, GgufKernel};
use kiln::backend::Backend;
use kiln::engine::Device;
use kiln::model::files::ModelFiles;
use kiln::quant::dequantize_row;
use kiln::tensor::WeightDType;

/// N × K of every SmolLM2-135M linear (q/o, k/v, gate/up, down, the tied lm_head) and a large one
/// (Qwen3.5-27B's down_proj).
const SHAPES: [(usize, usize); 6] = [
    (576, 576),
    (192, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
    (5120, 17408),
];
/// N × K for the K-quants, whose K is whole 256-element super-blocks (SmolLM2's K = 576 cannot be
/// stored as Q4_K / Q6_K, so its N's take K = 512; its down_proj K = 1536 is kept), and the two
/// large Qwen3.5-27B MLP shapes.
const K_SHAPES: [(usize, usize); 7] = [
    (576, 512),
    (1536, 512),
    (576, 1536),
    (49152, 512),
    (5120, 17408),
    (17408, 5120),
    (200, 256),
];
const ROWS: [usize; 6] = [1, 2, 7, 16, 64, 257];
const REL_TOL: f64 = 1e-2;

/// The reference outputs `[rows][cols.len()]` for columns `cols` of `o` on input `x`.
fn reference(o: &OwnedGguf, x: &[f32], rows: usize, cols: &[usize]) -> Vec<Vec<f64>> {
    let rb = o.dtype.row_bytes(o.k).expect("whole blocks");
    reference_outputs(x, rows, o.k, cols, |n, w| {
        dequantize_row(o.dtype, &o.data[n * rb..(n + 1) * rb], w)
    })
}

/// `w` on the first `rows` rows of `x` with `kernel` (None: the backend's choice), the output
/// poisoned with NaN first.
fn run(
    b: &CudaBackend,
    w: &<CudaBackend as Backend>::Weight,
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
    kernel: Option<GgufKernel>,
) -> Vec<f32> {
    run_poisoned(b, x, rows, n, k, |xb, out| match kernel {
        Some(kk) => b
            .matmul_gguf_with(xb, rows, w, out, kk)
            .expect("matmul_gguf_with"),
        None => b.matmul(xb, rows, w, out).expect("matmul"),
    })
}

/// One weight on one backend: every row count against the reference; every prefix of rows equal
/// bit for bit to the same rows of the 257-row step; GEMV and GEMM equal on 64 rows.
fn check_weight(b: &CudaBackend, dtype: &str, label: &str, o: &OwnedGguf) -> Vec<String> {
    let (n, k) = (o.n, o.k);
    let mut failures = Vec::new();
    let t0 = Instant::now();
    let w = b.upload_weight(label, &o.view()).expect("upload_weight");
    let upload_s = t0.elapsed().as_secs_f64();
    assert!(
        b.gguf_format(&w).is_some(),
        "{label}: not kept quantized (is {} set?)",
        kiln::tensor::gguf_tiles::WEIGHTS_ENV
    );
    let max_rows = *ROWS.last().unwrap_or(&1);
    let x: Vec<f32> = data(max_rows * k, 17 + n as u64)
        .into_iter()
        .map(|v| round(dtype, v))
        .collect();
    let subset = n * k > 8 << 20;
    let cols: Vec<usize> = if subset {
        let mut rng = Rng(n as u64 * 31 + k as u64);
        let mut c: Vec<usize> = (0..256).map(|_| rng.below(n)).collect();
        c.sort_unstable();
        c.dedup();
        c
    } else {
        (0..n).collect()
    };
    let want = reference(o, &x, max_rows, &cols);
    let full = run(b, &w, &x, max_rows, n, k, None);
    let mut worst = 0f64;
    let mut invariant = true;
    for rows in ROWS {
        let got = if rows == max_rows {
            full.clone()
        } else {
            run(b, &w, &x, rows, n, k, None)
        };
        let e = rel_err(&got, n, &cols, &want[..rows]);
        worst = worst.max(e);
        if e > REL_TOL {
            failures.push(format!(
                "{dtype} {label} {n}x{k} rows {rows}: rel err {e:.3e}"
            ));
        }
        if !bits_equal(&got, &full[..rows * n]) {
            invariant = false;
            failures.push(format!(
                "{dtype} {label} {n}x{k}: rows {rows} differ from the same rows of a {max_rows}-row step"
            ));
        }
    }
    let mut gemv_gemm = "n/a (FMA path)".to_string();
    if b.gguf_tensor_cores() {
        let gv = run(b, &w, &x, 64, n, k, Some(GgufKernel::Gemv));
        let gm = run(b, &w, &x, 64, n, k, Some(GgufKernel::Gemm));
        let same = bits_equal(&gv, &gm);
        gemv_gemm = if same { "equal" } else { "DIFFER" }.into();
        if !same {
            failures.push(format!(
                "{dtype} {label} {n}x{k}: GEMV and GEMM differ on 64 rows"
            ));
        }
    }
    println!(
        "RESULT gguf {dtype} {label} N={n} K={k} rows={ROWS:?} checked_cols={} rel_err_max={worst:.3e} batch_invariant={invariant} gemv_vs_gemm_64={gemv_gemm} upload_s={upload_s:.2} {}",
        if subset { format!("{} (seeded subset)", cols.len()) } else { format!("{n} (all)") },
        if failures.is_empty() { "ok" } else { "FAIL" }
    );
    failures
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn every_gguf_kernel_matches_the_cpu_reference() {
    // The quantized path is opt-in (the default dequantizes at load); the tests run with
    // --test-threads=1 and nothing else reads the variable concurrently.
    std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
    let mut failures = Vec::new();
    for dtype in dtypes() {
        let b = gpu(dtype, "auto");
        println!("device: {}", b.name());
        for (i, (label, fmt)) in FORMATS.into_iter().enumerate() {
            for (j, &(n, k)) in SHAPES.iter().enumerate() {
                // f32 (the FMA path, exercised at every shape on sm_70) skips the largest shape.
                if dtype == "f32" && n * k > 8 << 20 {
                    continue;
                }
                let o = OwnedGguf::random(fmt, n, k, 100 * i as u64 + j as u64);
                failures.extend(check_weight(&b, dtype, label, &o));
            }
            // N not a multiple of 64 (padding rows), K = 32 (one block).
            for (n, k) in [(200usize, 1152usize), (40, 32)] {
                let o = OwnedGguf::random(fmt, n, k, 900 + i as u64);
                failures.extend(check_weight(&b, dtype, label, &o));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The SmolLM2 GGUF (`KILN_TEST_GGUF`, default `/tmp/k/SmolLM2.gguf`), or `None` when absent.
fn smollm2() -> Option<PathBuf> {
    let p = std::env::var("KILN_TEST_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/tmp/k/SmolLM2.gguf"));
    p.is_file().then_some(p)
}

/// Whole models on CUDA against the CPU backend (f32): the tiny GGUF fixtures (Q4_0, Q4_1, Q8_0)
/// and SmolLM2 Q4_1 (its embedding / tied lm_head is Q8_0), with the weights kept quantized,
/// and SmolLM2 with the old dequantize-at-load path beside it (the same tolerances).
#[test]
#[ignore = "needs a GPU: see the header"]
fn whole_gguf_models_match_the_cpu_backend() {
    let mut paths: Vec<PathBuf> = [
        "tiny-llama-q4_0.gguf",
        "tiny-llama-q4_1.gguf",
        "tiny-llama-q8_0.gguf",
    ]
    .iter()
    .map(|f| root().join("tests/fixtures").join(f))
    .collect();
    match smollm2() {
        Some(p) => paths.push(p),
        None => {
            println!("RESULT gguf model SmolLM2 SKIPPED (no KILN_TEST_GGUF / /tmp/k/SmolLM2.gguf)")
        }
    }
    let mut failures = Vec::new();
    for path in paths {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let files = ModelFiles::open(&path).expect("model");
        let prompt = model_prompt(files.config.vocab_size);
        let cpu = probe16(&files, Device::Cpu, "f32", "auto", &prompt);
        let modes: &[&str] = if name.contains("SmolLM2") {
            &["4bit", "dequant"]
        } else {
            &["4bit"]
        };
        for &mode in modes {
            // SAFETY of the environment change: the tests run with --test-threads=1 and nothing
            // else reads the variable concurrently; it is read once per weight upload.
            if mode == "dequant" {
                std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "dequantized");
            } else {
                std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
            }
            for dtype in dtypes() {
                let got = probe16(&files, Device::Cuda(0), dtype, "auto", &prompt);
                let (worst, worst_cos, agree) = compare(&cpu, &got);
                let ok = model_matches(dtype, worst, worst_cos, agree);
                println!(
                    "RESULT gguf model {name} weights={mode} dtype={dtype} logits_max_abs_diff={worst:.3e} min_cosine={worst_cos:.6} greedy_agree={agree}/16 {}",
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{name} {mode} {dtype}"));
                }
            }
        }
        std::env::remove_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV);
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Speed (figures, not pass/fail): per format and shape, the GEMV at 1 row (bytes = values +
/// scales + mins as stored on the device) as a fraction of the copy bandwidth, the 16-row time
/// over the 1-row time, and the 1-row / 512-row times of cuBLAS on the same weight dequantized to
/// bf16 (`KILN_GGUF_GPU_WEIGHTS=dequantized`) beside the quantized kernels'.
#[test]
#[ignore = "needs a GPU: see the header"]
fn gguf_gemv_and_gemm_speed() {
    let b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    let copy = copy_bandwidth();
    println!("RESULT bench copy_bandwidth_GBps={:.0}", copy / 1e9);
    let shapes = [
        ("q4_1", WeightDType::Q4_1, 576usize, 576usize),
        ("q4_1", WeightDType::Q4_1, 1536, 576),
        ("q4_1", WeightDType::Q4_1, 576, 1536),
        ("q8_0", WeightDType::Q8_0, 49152, 576),
        ("q4_0", WeightDType::Q4_0, 17408, 5120),
        ("q4_1", WeightDType::Q4_1, 17408, 5120),
        ("q8_0", WeightDType::Q8_0, 17408, 5120),
        ("q4_1", WeightDType::Q4_1, 5120, 17408),
    ];
    for (i, (label, dt, n, k)) in shapes.into_iter().enumerate() {
        let o = OwnedGguf::random(dt, n, k, 77 + i as u64);
        std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
        let wq = b.upload_weight(label, &o.view()).expect("upload");
        std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "dequantized");
        let wd = b.upload_weight(label, &o.view()).expect("upload dense");
        std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
        let bytes = b.weight_bytes(&wq) as f64;
        let dense_bytes = b.weight_bytes(&wd) as f64;
        let x = b.upload(&data(512 * k, 3)).expect("x");
        let mut out = b.alloc(512 * n).expect("out");
        let t1 = time(&b, || b.matmul(&x, 1, &wq, &mut out).expect("matmul"));
        let t16 = time(&b, || b.matmul(&x, 16, &wq, &mut out).expect("matmul"));
        let t512 = time(&b, || b.matmul(&x, 512, &wq, &mut out).expect("matmul"));
        let d1 = time(&b, || b.matmul(&x, 1, &wd, &mut out).expect("matmul"));
        let d512 = time(&b, || b.matmul(&x, 512, &wd, &mut out).expect("matmul"));
        println!(
            "RESULT bench gguf {label} N={n} K={k} rows=1 time_us={:.2} bytes={bytes:.0} GBps={:.0} fraction_of_copy={:.3} rows16_vs_1={:.2} rows512_us={:.1} | cublas bf16 dequantized: bytes={dense_bytes:.0} rows1_us={:.2} rows512_us={:.1}",
            t1 * 1e6,
            bytes / t1 / 1e9,
            bytes / t1 / copy,
            t16 / t1,
            t512 * 1e6,
            d1 * 1e6,
            d512 * 1e6
        );
    }
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn every_k_quant_kernel_matches_the_cpu_reference() {
    // SAFETY of the environment change: --test-threads=1, nothing reads it concurrently.
    std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
    let mut failures = Vec::new();
    for dtype in dtypes() {
        let b = gpu(dtype, "auto");
        println!("device: {}", b.name());
        for (i, (label, fmt)) in K_FORMATS.into_iter().enumerate() {
            for (j, &(n, k)) in K_SHAPES.iter().enumerate() {
                // f32 (the FMA path, exercised at every shape on sm_70) skips the largest shapes.
                if dtype == "f32" && n * k > 8 << 20 {
                    continue;
                }
                let o = OwnedGguf::random(fmt, n, k, 500 + 100 * i as u64 + j as u64);
                failures.extend(check_weight(&b, dtype, label, &o));
            }
            // Edge scales (±0, f16 subnormals and maximum, sub-block scales 0 / 63 / ±128): the
            // reference is finite, the kernels must match it as well. Not for fp16: the f16
            // maximum times a sub-block scale of 63 is beyond the f16 range, so those weights
            // round to ±inf in fp16 compute on any path (the H200 run of 2026-12-01 showed inf).
            if dtype == "fp16" {
                continue;
            }
            let o = OwnedGguf::random_k(fmt, 72, 1536, 950 + i as u64, true);
            failures.extend(check_weight(&b, dtype, &format!("{label}-edges"), &o));
        }
    }
    std::env::remove_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The tiny Q4_K_M llama (Q4_K and Q6_K linears, Q4_K embedding) on CUDA with the weights kept
/// quantized, and dequantized at load, against the CPU backend (the tolerances of
/// `whole_gguf_models_match_the_cpu_backend`).
#[test]
#[ignore = "needs a GPU: see the header"]
fn whole_k_quant_model_matches_the_cpu_backend() {
    let path = std::env::var("KILN_TEST_KQUANT_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("tests/fixtures/tiny-llama-q4_k_m.gguf"));
    let files = ModelFiles::open(&path).expect("model");
    let vocab = files.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % vocab).collect();
    let cpu = probe16(&files, Device::Cpu, "f32", "auto", &prompt);
    let mut failures = Vec::new();
    for mode in ["quantized", "dequantized"] {
        // SAFETY of the environment change: --test-threads=1, read once per weight upload.
        std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, mode);
        for dtype in dtypes() {
            let got = probe16(&files, Device::Cuda(0), dtype, "auto", &prompt);
            let (worst, worst_cos, agree) = compare(&cpu, &got);
            let ok = model_matches(dtype, worst, worst_cos, agree);
            println!(
                "RESULT gguf model tiny-llama-q4_k_m weights={mode} dtype={dtype} logits_max_abs_diff={worst:.3e} min_cosine={worst_cos:.6} greedy_agree={agree}/16 {}",
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failures.push(format!("{mode} {dtype}"));
            }
        }
    }
    std::env::remove_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV);
    assert!(failures.is_empty(), "{failures:?}");
}

/// Mean seconds of `f` over 3 × `iters` calls after `iters` warm-up calls (the best of 3).
fn time_few(b: &CudaBackend, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters {
        f();
    }
    b.synchronize().expect("sync");
    (0..3)
        .map(|_| {
            let s = Instant::now();
            for _ in 0..iters {
                f();
            }
            b.synchronize().expect("sync");
            s.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Speed (figures, not pass/fail) of Q4_K and Q6_K beside Q4_1 at the two large 27B MLP shapes:
/// the GEMV at 1 row (bytes = the tiles as stored on the device) as a fraction of the copy
/// bandwidth of the same run, 16 rows over 1, and the GEMM at M = 4096 in TFLOP/s beside cuBLAS
/// on the same weight dequantized to bf16.
#[test]
#[ignore = "needs a GPU: see the header"]
fn k_quant_gemv_and_gemm_speed() {
    let b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    let copy = copy_bandwidth();
    println!("RESULT bench copy_bandwidth_GBps={:.0}", copy / 1e9);
    let m = 4096usize;
    for (n, k) in [(17408usize, 5120usize), (5120, 17408)] {
        let x = b.upload(&data(m * k, 3)).expect("x");
        let mut out = b.alloc(m * n).expect("out");
        let flops = 2.0 * (m * n * k) as f64;
        let mut dense_done = false;
        for (i, (label, dt)) in [
            ("q4_k", WeightDType::Q4K),
            ("q6_k", WeightDType::Q6K),
            ("q4_1", WeightDType::Q4_1),
        ]
        .into_iter()
        .enumerate()
        {
            let o = OwnedGguf::random(dt, n, k, 300 + i as u64);
            std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "quantized");
            let wq = b.upload_weight(label, &o.view()).expect("upload");
            let bytes = b.weight_bytes(&wq) as f64;
            let t1 = time(&b, || b.matmul(&x, 1, &wq, &mut out).expect("matmul"));
            let t16 = time(&b, || b.matmul(&x, 16, &wq, &mut out).expect("matmul"));
            let tm = time_few(&b, 3, || b.matmul(&x, m, &wq, &mut out).expect("matmul"));
            println!(
                "RESULT bench gguf {label} N={n} K={k} rows=1 time_us={:.2} bytes={bytes:.0} GBps={:.0} fraction_of_copy={:.3} rows16_vs_1={:.2} | M={m} time_us={:.0} TFLOPs={:.1}",
                t1 * 1e6,
                bytes / t1 / 1e9,
                bytes / t1 / copy,
                t16 / t1,
                tm * 1e6,
                flops / tm / 1e12
            );
            if !dense_done {
                std::env::set_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV, "dequantized");
                let wd = b.upload_weight(label, &o.view()).expect("upload dense");
                let d1 = time(&b, || b.matmul(&x, 1, &wd, &mut out).expect("matmul"));
                let dm = time_few(&b, 3, || b.matmul(&x, m, &wd, &mut out).expect("matmul"));
                let db = b.weight_bytes(&wd) as f64;
                println!(
                    "RESULT bench cublas bf16 dequantized N={n} K={k} rows=1 time_us={:.2} GBps={:.0} | M={m} time_us={:.0} TFLOPs={:.1}",
                    d1 * 1e6,
                    db / d1 / 1e9,
                    dm * 1e6,
                    flops / dm / 1e12
                );
                dense_done = true;
            }
        }
    }
    std::env::remove_var(kiln::tensor::gguf_tiles::WEIGHTS_ENV);
}
