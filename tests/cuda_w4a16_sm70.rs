//! The sm_70 / sm_75 tensor-core packed 4-bit matmuls (`kernels/w4a16_sm70.cu`, mma m8n8k4,
//! fp16) on the GPU: every Qwen3.5-27B linear shape and every 4-bit format against the CPU
//! dequantizing reference, batch invariance (a step's rows equal the same rows of a larger step),
//! GEMV = GEMM bit for bit; and their speed beside the old FMA path (`w4_fma`) in the same run.
//!
//! Only meaningful on the sm_70 path; elsewhere each test prints SKIPPED and returns. On the
//! H200 that path is compute_70 PTX compiled by NVRTC 12.9 and JIT'd by the driver. Built here
//! with `cargo test --release --features cuda --no-run --test cuda_w4a16_sm70`, run from the
//! repository root on the GPU machine after staging NVRTC 12.9 (`bash .gpu/shared/stage.sh n`):
//! `source .gpu/shared/env70.sh && KILN_KERNEL_CACHE=/tmp/kc70 cuda_w4a16_sm70-<hash> --ignored --test-threads=1 --nocapture`.
//! Each test prints `RESULT` lines that go into docs/gpu-validation.md / docs/benchmarks.md.
//!
//! The reference: every weight dequantized exactly in f32 (`dequantize_packed_row`), the input as
//! the GPU holds it (rounded to fp16), dot products in f64. Relative error = max |Δ| / max
//! |reference| over the checked outputs, ≤ 1e-2. Shapes with N × K > 32M check a seeded random
//! subset of 256 output columns (all rows); the others every output.
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use common::*;
use kiln::backend::cuda::{CudaBackend, W4Kernel};
use kiln::backend::Backend;
use kiln::quant::packed::dequantize_packed_row;
use kiln::tensor::LinearView;
use w4_support::{all_formats, Fmt, Owned, Rng};

/// N × K of every linear of Qwen3.5-27B.
const SHAPES_27B: [(usize, usize); 9] = [
    (10240, 5120),
    (6144, 5120),
    (48, 5120),
    (12288, 5120),
    (1024, 5120),
    (5120, 6144),
    (17408, 5120),
    (5120, 17408),
    (248320, 5120),
];
/// Row counts of a step: the GEMV (1, 2, 7, 16) and the GEMM (64, 257).
const ROWS: [usize; 6] = [1, 2, 7, 16, 64, 257];
const REL_TOL: f64 = 1e-2;

/// The fp16 backend on the sm_70 path, or `None` (after a SKIPPED line) elsewhere.
fn sm70_backend() -> Option<CudaBackend> {
    let b = gpu("fp16", "auto");
    println!("device: {}", b.name());
    if b.arch().major != 7 {
        println!("SKIPPED: not the sm_70 path (source .gpu/shared/env70.sh, or a V100 / T4)");
        return None;
    }
    // The wiring: on sm_70 / sm_75 with fp16 the tensor-core kernels run, the GEMV to 16 rows.
    assert!(
        b.w4_tensor_cores(),
        "sm_70 fp16 backend without its tensor-core kernels"
    );
    assert_eq!(b.w4_kernel_for(16), W4Kernel::Gemv);
    assert_eq!(b.w4_kernel_for(17), W4Kernel::Gemm);
    Some(b)
}

/// The reference outputs `[rows][cols.len()]` for columns `cols` of `o` on input `x` (`[rows, K]`).
fn reference(o: &Owned, x: &[f32], rows: usize, cols: &[usize]) -> Vec<Vec<f64>> {
    let p = o.linear();
    reference_outputs(x, rows, o.k, cols, |n, w| dequantize_packed_row(&p, n, w))
}

/// The first `rows` rows of `x` through `w` with `kernel` (None: the backend's choice), the
/// output poisoned with NaN first.
fn run(
    b: &CudaBackend,
    w: &<CudaBackend as Backend>::Weight,
    x: &[f32],
    rows: usize,
    (n, k): (usize, usize),
    kernel: Option<W4Kernel>,
) -> Vec<f32> {
    run_poisoned(b, x, rows, n, k, |xb, out| match kernel {
        Some(kk) => b
            .matmul_w4_with(xb, rows, w, out, kk)
            .expect("matmul_w4_with"),
        None => b.matmul(xb, rows, w, out).expect("matmul"),
    })
}

/// One linear: every row count against the reference; every step's rows equal bit for bit to
/// the same rows of the 257-row step (GEMV steps against a GEMM step); the GEMV and the GEMM
/// forced on the same 7, 16, 64 and 257 rows equal bit for bit.
fn check_linear(b: &CudaBackend, label: &str, o: &Owned, subset: bool) -> Vec<String> {
    let (n, k) = (o.n, o.k);
    let mut failures = Vec::new();
    let w = b
        .upload_linear(label, &LinearView::Packed(o.linear()))
        .expect("upload_linear");
    let max_rows = ROWS[ROWS.len() - 1];
    let x: Vec<f32> = data(max_rows * k, 17 + n as u64)
        .into_iter()
        .map(|v| round("fp16", v))
        .collect();
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
    let full = run(b, &w, &x, max_rows, (n, k), None);
    let (mut worst, mut invariant, mut same) = (0f64, true, true);
    for rows in ROWS {
        let got = if rows == max_rows {
            full.clone()
        } else {
            run(b, &w, &x, rows, (n, k), None)
        };
        let e = rel_err(&got, n, &cols, &want[..rows]);
        worst = worst.max(e);
        if e > REL_TOL {
            failures.push(format!("{label} {n}x{k} rows {rows}: rel err {e:.3e}"));
        }
        if !bits_equal(&got, &full[..rows * n]) {
            invariant = false;
            failures.push(format!(
                "{label} {n}x{k}: rows {rows} differ from the same rows of a {max_rows}-row step"
            ));
        }
    }
    for rows in [7usize, 16, 64, 257] {
        let gv = run(b, &w, &x, rows, (n, k), Some(W4Kernel::Gemv));
        let gm = run(b, &w, &x, rows, (n, k), Some(W4Kernel::Gemm));
        if !bits_equal(&gv, &gm) {
            same = false;
            failures.push(format!(
                "{label} {n}x{k}: GEMV and GEMM differ on {rows} rows"
            ));
        }
    }
    println!(
        "RESULT w4a16_sm70 fp16 {label} N={n} K={k} rows={ROWS:?} checked_cols={} rel_err_max={worst:.3e} batch_invariant={invariant} gemv_eq_gemm_7_16_64_257={same} {}",
        if subset { format!("{} (seeded subset)", cols.len()) } else { format!("{n} (all)") },
        if failures.is_empty() { "ok" } else { "FAIL" }
    );
    failures
}

#[test]
#[ignore = "needs a GPU (the sm_70 path): see the header"]
fn every_27b_linear_shape_matches_the_cpu_reference_on_sm70() {
    let Some(b) = sm70_backend() else { return };
    let mut failures = Vec::new();
    for (i, &(n, k)) in SHAPES_27B.iter().enumerate() {
        // The 27B checkpoint's format: compressed-tensors W4A16 symmetric, group 128.
        let fmt = Fmt::Ct {
            group: 128,
            symmetric: true,
            act_order: false,
        };
        let o = Owned::random(fmt, n, k, 1000 + i as u64);
        failures.extend(check_linear(&b, "ct-sym-g128", &o, n * k > 32 << 20));
    }
    for (i, (n, k)) in [(17408usize, 5120usize), (5120, 17408)]
        .into_iter()
        .enumerate()
    {
        let o = Owned::random(Fmt::Nvfp4, n, k, 2000 + i as u64);
        failures.extend(check_linear(&b, "nvfp4", &o, true));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU (the sm_70 path): see the header"]
fn every_4bit_format_matches_the_cpu_reference_on_sm70() {
    let Some(b) = sm70_backend() else { return };
    let mut failures = Vec::new();
    for (i, (label, fmt)) in all_formats().into_iter().enumerate() {
        // N = 200 (padded to 256), K = 1152 (9 blocks: 1 slice), 4096 (8 slices) and, for
        // the CT group-32 formats, 1056 (33 groups; not a multiple of 128: a partial last block).
        for k in [1152usize, 4096, 1056] {
            if k == 1056 && !matches!(fmt, Fmt::Ct { group: 32, .. }) {
                continue;
            }
            let o = Owned::random(fmt, 200, k, 50 + i as u64);
            failures.extend(check_linear(&b, label, &o, false));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Median seconds of `f` over `reps` batches of `iters` calls after one warm-up batch.
fn time_n(b: &CudaBackend, iters: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    b.synchronize().expect("sync");
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = std::time::Instant::now();
            for _ in 0..iters {
                f();
            }
            b.synchronize().expect("sync");
            s.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

#[test]
#[ignore = "needs a GPU (the sm_70 path): see the header"]
fn sm70_tensor_core_speed_against_the_fma_path() {
    let Some(b) = sm70_backend() else { return };
    let fmt = Fmt::Ct {
        group: 128,
        symmetric: true,
        act_order: false,
    };
    for (i, (n, k)) in [(17408usize, 5120usize), (5120, 17408)]
        .into_iter()
        .enumerate()
    {
        let o = Owned::random(fmt, n, k, 7 + i as u64);
        let w = b
            .upload_linear("bench", &LinearView::Packed(o.linear()))
            .expect("upload");
        let bytes = b.weight_bytes(&w) as f64;
        let x = b.upload(&data(16 * k, 3)).expect("x");
        let mut out = b.alloc(16 * n).expect("out");
        for rows in [1usize, 16] {
            let mut t = |kk| {
                time_n(&b, 20, 5, || {
                    b.matmul_w4_with(&x, rows, &w, &mut out, kk)
                        .expect("matmul")
                })
            };
            let (tc, fma) = (t(W4Kernel::Gemv), t(W4Kernel::Fma));
            println!(
                "RESULT bench sm70 gemv N={n} K={k} rows={rows} mma_us={:.1} fma_us={:.1} speedup={:.2} mma_GBps={:.0} (bytes={bytes:.0})",
                tc * 1e6,
                fma * 1e6,
                fma / tc,
                bytes / tc / 1e9
            );
        }
    }
    let (m, n, k) = (4096usize, 17408usize, 5120usize);
    let o = Owned::random(fmt, n, k, 11);
    let w = b
        .upload_linear("bench", &LinearView::Packed(o.linear()))
        .expect("upload");
    let x = b.upload(&data(m * k, 9)).expect("x");
    let mut out = b.alloc(m * n).expect("out");
    let flops = 2.0 * (m * n * k) as f64;
    let mut t = |kk| {
        time_n(&b, 2, 3, || {
            b.matmul_w4_with(&x, m, &w, &mut out, kk).expect("gemm")
        })
    };
    let (tc, fma) = (t(W4Kernel::Gemm), t(W4Kernel::Fma));
    println!(
        "RESULT bench sm70 gemm M={m} N={n} K={k} mma_ms={:.2} fma_ms={:.2} speedup={:.2} mma_TFLOPs={:.1} fma_TFLOPs={:.1}",
        tc * 1e3,
        fma * 1e3,
        fma / tc,
        flops / tc / 1e12,
        flops / fma / 1e12
    );
}
