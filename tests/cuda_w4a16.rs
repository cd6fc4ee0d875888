//! Packed 4-bit matmuls on the GPU (`kernels/w4a16.cu`) against the CPU dequantizing reference
//! (`kiln::quant::packed`), batch invariance and GEMV = GEMM bit for bit, and whole tiny
//! quantized models on CUDA against the CPU backend.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`), from
//! the repository root (it reads `tests/fixtures`):
//! `LD_LIBRARY_PATH=/usr/local/cuda/lib64 cuda_w4a16-<hash> --ignored --test-threads=1 --nocapture`
//! and for the V100 (sm_70) path, compute_70 PTX through the driver's JIT with NVRTC 12.9:
//! `source .gpu/shared/env70.sh && cuda_w4a16-<hash> --ignored --test-threads=1 --nocapture`.
//! Each test prints `RESULT` lines that go into docs/gpu-validation.md.
//!
//! The reference: every weight dequantized exactly in f32 (`dequantize_packed_row`), the input as
//! the GPU holds it (rounded to the compute dtype), dot products in f64. Relative error = max |Δ|
//! / max |reference| over the checked outputs, ≤ 1e-2 (16-bit weights and inputs). For the 27B
//! shapes with N × K > 32M the reference checks a seeded random subset of 256 output columns (all
//! rows); every other shape is checked in full.
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use std::time::Instant;

use common::*;
use kiln::backend::cuda::{CudaBackend, W4Kernel};
use kiln::backend::Backend;
use kiln::engine::Device;
use kiln::model::files::ModelFiles;
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
/// Row counts of a step: the 8-row GEMV (1, 2, 7), the 16-row GEMV (9, 12, 16; the 32-row one
/// for the generic layouts), the 32-row GEMV (17, 24, 32), the GEMM (64, 257).
const ROWS: [usize; 11] = [1, 2, 7, 9, 12, 16, 17, 24, 32, 64, 257];
const REL_TOL: f64 = 1e-2;

/// The reference outputs `[rows][cols.len()]` for columns `cols` of `o` on input `x` (`[rows, K]`).
fn reference(o: &Owned, x: &[f32], rows: usize, cols: &[usize]) -> Vec<Vec<f64>> {
    let p = o.linear();
    reference_outputs(x, rows, o.k, cols, |n, w| dequantize_packed_row(&p, n, w))
}

/// Run `o` on the first `rows` rows of `x` with `kernel` (None: the backend's choice).
fn run(
    b: &CudaBackend,
    w: &<CudaBackend as Backend>::Weight,
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
    kernel: Option<W4Kernel>,
) -> Vec<f32> {
    run_poisoned(b, x, rows, n, k, |xb, out| match kernel {
        Some(kk) => b
            .matmul_w4_with(xb, rows, w, out, kk)
            .expect("matmul_w4_with"),
        None => b.matmul(xb, rows, w, out).expect("matmul"),
    })
}

/// One linear on one backend: every row count against the reference; every prefix of rows equal
/// bit for bit to the same rows of the 257-row step; GEMV and GEMM equal on 64, 7 and 12 rows.
fn check_linear(b: &CudaBackend, dtype: &str, label: &str, o: &Owned, subset: bool) -> Vec<String> {
    let (n, k) = (o.n, o.k);
    let mut failures = Vec::new();
    let t0 = Instant::now();
    let w = b
        .upload_linear(label, &LinearView::Packed(o.linear()))
        .expect("upload_linear");
    let upload_s = t0.elapsed().as_secs_f64();
    let max_rows = *ROWS.last().unwrap_or(&1);
    let x: Vec<f32> = data(max_rows * k, 17 + n as u64)
        .into_iter()
        .map(|v| round(dtype, v))
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
    if b.w4_tensor_cores() {
        // 64 and 24 rows: the GEMV runs its 32-row blocks; 7 and 12 rows: its 8- and 16-row
        // blocks where the layout allows them (else the 32-row ones again).
        // The GEMM both as the backend picks it above 32 rows (`Gemm`: on sm_90 the GEMMs of
        // `kernels/w4a16_gemm.cu` where they apply) and as `w4_gemm` (`GemmBase`).
        let mut same_all = true;
        for rows in [64usize, 7, 12, 24] {
            let gv = run(b, &w, &x, rows, n, k, Some(W4Kernel::Gemv));
            for gk in [W4Kernel::Gemm, W4Kernel::GemmBase] {
                let gm = run(b, &w, &x, rows, n, k, Some(gk));
                if !bits_equal(&gv, &gm) {
                    same_all = false;
                    failures.push(format!(
                        "{dtype} {label} {n}x{k}: GEMV and {gk:?} differ on {rows} rows"
                    ));
                }
            }
        }
        gemv_gemm = if same_all { "equal" } else { "DIFFER" }.into();
    }
    println!(
        "RESULT w4a16 {dtype} {label} N={n} K={k} rows={ROWS:?} checked_cols={} rel_err_max={worst:.3e} batch_invariant={invariant} gemv_vs_gemm_64_7_12_24={gemv_gemm} upload_s={upload_s:.2} {}",
        if subset { format!("{} (seeded subset)", cols.len()) } else { format!("{n} (all)") },
        if failures.is_empty() { "ok" } else { "FAIL" }
    );
    failures
}

/// 16-bit dtypes of this run (bf16 only where the device has it).
fn half_dtypes() -> Vec<&'static str> {
    dtypes().into_iter().filter(|d| *d != "f32").collect()
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn every_27b_linear_shape_matches_the_cpu_reference() {
    let dtype = if half_dtypes().contains(&"bf16") {
        "bf16"
    } else {
        "fp16"
    };
    let b = gpu(dtype, "auto");
    println!("device: {}", b.name());
    let mut failures = Vec::new();
    for (i, &(n, k)) in SHAPES_27B.iter().enumerate() {
        // The 27B checkpoint's format: compressed-tensors W4A16 symmetric, group 128.
        let o = Owned::random(
            Fmt::Ct {
                group: 128,
                symmetric: true,
                act_order: false,
            },
            n,
            k,
            1000 + i as u64,
        );
        failures.extend(check_linear(&b, dtype, "ct-sym-g128", &o, n * k > 32 << 20));
    }
    // NVFP4 (decoded in the kernel) on the two largest MLP shapes.
    for (i, (n, k)) in [(17408usize, 5120usize), (5120, 17408)]
        .into_iter()
        .enumerate()
    {
        let o = Owned::random(Fmt::Nvfp4, n, k, 2000 + i as u64);
        failures.extend(check_linear(&b, dtype, "nvfp4", &o, true));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn every_4bit_format_matches_the_cpu_reference() {
    let mut failures = Vec::new();
    for dtype in dtypes() {
        let b = gpu(dtype, "auto");
        println!("device: {}", b.name());
        for (i, (label, fmt)) in all_formats().into_iter().enumerate() {
            // N = 200 (not a multiple of 64: padding); K = 1152 (9 blocks: 1 slice) and 4096 (8).
            for k in [1152usize, 4096] {
                let o = Owned::random(fmt, 200, k, 50 + i as u64);
                failures.extend(check_linear(&b, dtype, label, &o, false));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn tiny_quantized_models_match_the_cpu_backend() {
    let mut failures = Vec::new();
    for fixture in [
        "tiny-llama-ct-w4a16-asym-g128",
        "tiny-llama-ct-w4a16-sym-g32",
        "tiny-llama-awq-g64",
        "tiny-llama-gptq-g64-desc-act",
        "tiny-llama-ct-nvfp4a16",
    ] {
        let path = root().join("tests/fixtures").join(fixture);
        let files = ModelFiles::open(&path).expect("model");
        let prompt = model_prompt(files.config.vocab_size);
        let cpu = probe16(&files, Device::Cpu, "f32", "auto", &prompt);
        for dtype in dtypes() {
            let got = probe16(&files, Device::Cuda(0), dtype, "auto", &prompt);
            let (worst, worst_cos, agree) = compare(&cpu, &got);
            let ok = model_matches(dtype, worst, worst_cos, agree);
            println!(
                "RESULT w4a16 model {fixture} dtype={dtype} logits_max_abs_diff={worst:.3e} min_cosine={worst_cos:.6} greedy_agree={agree}/16 {}",
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failures.push(format!("{fixture} {dtype}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The sm_90 GEMMs (`kernels/w4a16_gemm.cu`: [`W4Kernel::GemmWide`] 128 × 256 tiles,
/// [`W4Kernel::GemmTile`] 64 × 128 tiles, [`W4Kernel::GemmSplit`] cluster split-K,
/// [`W4Kernel::GemmWgmma`] the warpgroup-MMA 256 × 128 tiles (sm_90; `w4g_gemm` on sm_100),
/// [`W4Kernel::GemmWs`] its warp-specialised form (`kernels/w4a16_wgmma.cu`), and
/// [`W4Kernel::Gemm`], the backend's pick by rows) against `w4_gemm` ([`W4Kernel::GemmBase`]):
/// bit for bit on row counts with partial row tiles (33, 64, 129, 257, 300) and output counts
/// with partial output tiles (48, 200, 1000: N not a multiple of 128 / 256), every int4 format
/// they take (symmetric / asymmetric zeros, groups 32 / 64 / 128, AWQ, GPTQ), K with 1 slice
/// (1152: the split runs as a tile) and 8 (4096, 5120: the split's clusters), fp16 and bf16.
/// Where they do not apply (another GPU, or a layout left to `w4_gemm`) the test says so and
/// checks the same equality trivially.
#[test]
#[ignore = "needs a GPU: see the header"]
fn wide_gemm_equals_the_base_gemm_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in half_dtypes() {
        let b = gpu(dtype, "auto");
        if !b.w4_tensor_cores() {
            println!("RESULT w4a16 wide-gemm {dtype}: no tensor-core path here, skipped");
            continue;
        }
        let fmts = [
            (
                "ct-sym-g128",
                Fmt::Ct {
                    group: 128,
                    symmetric: true,
                    act_order: false,
                },
            ),
            (
                "ct-asym-g32",
                Fmt::Ct {
                    group: 32,
                    symmetric: false,
                    act_order: false,
                },
            ),
            (
                "ct-asym-g64",
                Fmt::Ct {
                    group: 64,
                    symmetric: false,
                    act_order: false,
                },
            ),
            ("awq-g128", Fmt::Awq { group: 128 }),
            (
                "gptq-g64",
                Fmt::Gptq {
                    group: 64,
                    desc_act: false,
                },
            ),
        ];
        for (i, (label, fmt)) in fmts.into_iter().enumerate() {
            for (n, k) in [(48usize, 5120usize), (200, 1152), (1000, 4096)] {
                let o = Owned::random(fmt, n, k, 700 + i as u64);
                let w = b
                    .upload_linear(label, &LinearView::Packed(o.linear()))
                    .expect("upload_linear");
                let wide = b.w4_wide_gemm_applies(&w);
                let x: Vec<f32> = data(300 * k, 23 + n as u64)
                    .into_iter()
                    .map(|v| round(dtype, v))
                    .collect();
                let kernels = [
                    ("wide", W4Kernel::GemmWide),
                    ("tile", W4Kernel::GemmTile),
                    ("split", W4Kernel::GemmSplit),
                    ("wgmma", W4Kernel::GemmWgmma),
                    ("ws", W4Kernel::GemmWs),
                    ("pick", W4Kernel::Gemm),
                ];
                let rows_list = [33usize, 64, 129, 257, 300];
                let mut same = 0;
                for rows in rows_list {
                    let c = run(&b, &w, &x, rows, n, k, Some(W4Kernel::GemmBase));
                    for &(kl, kk) in &kernels {
                        let a = run(&b, &w, &x, rows, n, k, Some(kk));
                        if bits_equal(&a, &c) && a.iter().all(|v| v.is_finite()) {
                            same += 1;
                        } else {
                            failures.push(format!(
                                "{dtype} {label} {n}x{k} rows {rows}: {kl} != w4_gemm"
                            ));
                        }
                    }
                }
                let all = rows_list.len() * kernels.len();
                println!(
                    "RESULT w4a16 wide-gemm {dtype} {label} N={n} K={k} wide_kernel={wide} rows={rows_list:?} kernels={:?} equal_to_w4_gemm={same}/{all} {}",
                    kernels.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
                    if same == all { "ok" } else { "FAIL" }
                );
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The bulk-copy GEMV (`kernels/w4a16_bulk.cu`, [`W4Kernel::GemvBulk`], sm_90+) against
/// `w4_gemv` ([`W4Kernel::Gemv`] with the bulk kernel switched off), bit for bit, 1–8 rows:
/// two small shapes first (64×1152: 1 K slice; 200×4096: 8), then every packed Qwen3.5-27B
/// linear shape (the 248320-output lm_head is dense in the model and left out). Formats: CT
/// symmetric and asymmetric g128 on every shape (bf16 and fp16); CT asymmetric g32, AWQ g128,
/// GPTQ g64 and NVFP4 (bf16) on the small shapes, 48×5120 and 5120×6144. Rings (stages × k
/// blocks per stage): 1×1, 3×1, 2×2, 3×2, 1×4, 2×4 (odd depths wrap the ring at odd places;
/// partial last stages), 2×2 with the L2 hint, and the cluster form at 2×2 and 3×1 (where the
/// weight has 8 K slices; else the block form again), then every setting the bench
/// `w4a16_gemv_bulk` sweeps by default (`w4_support::BULK_VARIANTS`); plus the default pick with
/// the switch on. Where the kernel does not exist (below sm_90) the test says so and passes.
/// `KILN_BULK_TEST_TRACE=1` prints each bulk launch's setting before it (so that a device
/// error's last line names it). Run (GPU machine, repository root; `KILN_BULK_TEST_SMALL=1`
/// runs the small shapes only, `KILN_BULK_TEST_SHAPES` / `_ROWS` replace shapes / rows):
/// `cuda_w4a16-<hash> --ignored --exact --test-threads=1 --nocapture bulk_gemv_equals_w4_gemv_bit_for_bit`
#[test]
#[ignore = "needs a GPU: see the header"]
fn bulk_gemv_equals_w4_gemv_bit_for_bit() {
    let mut backends: Vec<(&str, CudaBackend)> = half_dtypes()
        .into_iter()
        .map(|d| (d, gpu(d, "auto")))
        .collect();
    for (dtype, b) in backends.iter_mut() {
        if !b.w4_tensor_cores() || !b.set_w4_bulk(false, 2, 2, false, false) {
            println!("RESULT w4a16 bulk-gemv {dtype}: no bulk kernel here (sm_90+ only), skipped");
        }
    }
    backends.retain_mut(|(_, b)| b.w4_tensor_cores() && b.set_w4_bulk(false, 2, 2, false, false));
    let fmts = [
        (
            "ct-sym-g128",
            Fmt::Ct {
                group: 128,
                symmetric: true,
                act_order: false,
            },
        ),
        (
            "ct-asym-g128",
            Fmt::Ct {
                group: 128,
                symmetric: false,
                act_order: false,
            },
        ),
        (
            "ct-asym-g32",
            Fmt::Ct {
                group: 32,
                symmetric: false,
                act_order: false,
            },
        ),
        ("awq-g128", Fmt::Awq { group: 128 }),
        (
            "gptq-g64",
            Fmt::Gptq {
                group: 64,
                desc_act: false,
            },
        ),
        ("nvfp4", Fmt::Nvfp4),
    ];
    // (stages, k blocks per stage, L2 hint, cluster form, persistent blocks per SM, grid cap):
    // this test's own settings (the capped grids make a block run several tiles, its rings
    // running on from one tile into the next, on every shape), then every one
    // `cuda_w4a16_bulk_bench w4a16_gemv_bulk` sweeps (`w4_support::BULK_VARIANTS`) not among them.
    let mut depths = vec![
        (1usize, 1usize, false, false, 0usize, 0usize),
        (3, 1, false, false, 0, 0),
        (2, 2, false, false, 0, 0),
        (3, 2, false, false, 0, 0),
        (2, 2, true, false, 0, 0),
        (1, 4, false, false, 0, 0),
        (2, 4, false, false, 0, 0),
        (2, 2, false, true, 0, 0),
        (3, 1, false, true, 0, 0),
        (3, 1, false, false, 0, 2),
        (2, 2, false, false, 0, 5),
        (1, 4, false, false, 0, 3),
        (4, 1, true, false, 1, 7),
    ];
    for (_, stages, sk, hint, cluster, persist) in
        w4_support::bulk_variants(w4_support::BULK_VARIANTS)
    {
        if !depths.contains(&(stages, sk, hint, cluster, persist, 0)) {
            depths.push((stages, sk, hint, cluster, persist, 0));
        }
    }
    let mut failures = Vec::new();
    // Two small shapes first (1 and 8 K slices; `KILN_BULK_TEST_SMALL=1` stops there: the
    // quick pass run under compute-sanitizer), then the 27B ones.
    // `KILN_BULK_TEST_SHAPES=NxK,...` replaces the shapes and `KILN_BULK_TEST_ROWS=r,...` the
    // row counts (a sanitizer pass on one big shape at a few rows).
    let small_only = std::env::var("KILN_BULK_TEST_SMALL").is_ok_and(|v| v == "1");
    let trace = std::env::var("KILN_BULK_TEST_TRACE").is_ok_and(|v| v == "1");
    let shapes: Vec<(usize, usize)> = match std::env::var("KILN_BULK_TEST_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                let (n, k) = s.trim().split_once('x')?;
                Some((n.parse().ok()?, k.parse().ok()?))
            })
            .collect(),
        Err(_) => [(64usize, 1152usize), (200, 4096)]
            .into_iter()
            .chain(
                SHAPES_27B
                    .into_iter()
                    .filter(|s| s.0 != 248320 && !small_only),
            )
            .collect(),
    };
    let row_counts: Vec<usize> = std::env::var("KILN_BULK_TEST_ROWS").map_or_else(
        |_| (1..=8).collect(),
        |v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect(),
    );
    for (i, (label, fmt)) in fmts.into_iter().enumerate() {
        // CT sym / asym g128 (the 27B checkpoints' formats) on every shape; the other formats
        // on the small shapes, 48×5120 and 5120×6144, to keep the test short.
        for &(n, k) in shapes
            .iter()
            .filter(|&&(n, k)| i < 2 || n < 1000 || (n, k) == (5120, 6144))
        {
            let o = Owned::random(fmt, n, k, 900 + 10 * i as u64 + n as u64);
            for (dtype, b) in backends.iter_mut() {
                if *dtype == "fp16" && i >= 2 {
                    continue;
                }
                let w = b
                    .upload_linear(label, &LinearView::Packed(o.linear()))
                    .expect("upload_linear");
                let x: Vec<f32> = data(8 * k, 31 + k as u64)
                    .into_iter()
                    .map(|v| round(dtype, v))
                    .collect();
                let (mut same, mut all) = (0, 0);
                for &rows in &row_counts {
                    b.set_w4_bulk(false, 2, 2, false, false);
                    let base = run(b, &w, &x, rows, n, k, Some(W4Kernel::Gemv));
                    for &(stages, sk, hint, cluster, persist, cap) in &depths {
                        b.set_w4_bulk(false, stages, sk, hint, cluster);
                        b.set_w4_bulk_grid(persist, cap);
                        if trace {
                            println!("TRACE {dtype} {label} {n}x{k} rows {rows} stages {stages}x{sk} hint {hint} cluster {cluster} persist {persist} cap {cap}");
                        }
                        let a = run(b, &w, &x, rows, n, k, Some(W4Kernel::GemvBulk));
                        all += 1;
                        if bits_equal(&a, &base) && a.iter().all(|v| v.is_finite()) {
                            same += 1;
                        } else {
                            failures.push(format!(
                                "{dtype} {label} {n}x{k} rows {rows} stages {stages}x{sk} hint {hint} cluster {cluster} persist {persist} cap {cap}: bulk != w4_gemv"
                            ));
                        }
                    }
                    // The default choice with the switch on, at the built-in ring settings,
                    // runs the bulk kernel: same bits.
                    b.reset_w4_bulk(true);
                    let picked = run(b, &w, &x, rows, n, k, Some(W4Kernel::Gemv));
                    all += 1;
                    if bits_equal(&picked, &base) {
                        same += 1;
                    } else {
                        failures.push(format!(
                            "{dtype} {label} {n}x{k} rows {rows}: picked != w4_gemv"
                        ));
                    }
                }
                b.set_w4_bulk(false, 2, 2, false, false);
                b.set_w4_bulk_grid(0, 0);
                println!(
                    "RESULT w4a16 bulk-gemv {dtype} {label} N={n} K={k} rows={row_counts:?} settings={} equal_to_w4_gemv={same}/{all} {}",
                    depths.len(),
                    if same == all { "ok" } else { "FAIL" }
                );
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every build of the 1–8-row GEMV (`kernels/w4a16_gemv.cu`, `KILN_W4_GEMV`,
/// [`CudaBackend::set_w4_gemv`]; the read ceilings `rd` / `hrd` excepted: no product) against the
/// plain `w4_gemv` build, bit for bit, rows 1–8: CT sym / asym g128 on 64×1152, 200×4096,
/// 17408×5120 and 5120×17408 (bf16 and fp16), CT asym g32, AWQ g128 and NVFP4 (bf16; the builds
/// that need groups of >= 128 columns run the plain code there) on the two small shapes. Run (GPU
/// machine): `cuda_w4a16-<hash> --ignored --exact --test-threads=1 gemv_builds_equal_the_plain_build_bit_for_bit`
#[test]
#[ignore = "needs a GPU: see the header"]
fn gemv_builds_equal_the_plain_build_bit_for_bit() {
    let ct = |group, symmetric| Fmt::Ct {
        group,
        symmetric,
        act_order: false,
    };
    let fmts = [
        ("ct-sym-g128", ct(128, true)),
        ("ct-asym-g128", ct(128, false)),
        ("ct-asym-g32", ct(32, false)),
        ("awq-g128", Fmt::Awq { group: 128 }),
        ("nvfp4", Fmt::Nvfp4),
    ];
    let builds: Vec<&str> = kiln::backend::cuda::W4_GEMV_VARIANTS
        .into_iter()
        .filter(|v| !v.is_empty() && !CudaBackend::w4_gemv_is_read_only(v))
        .collect();
    let mut failures = Vec::new();
    // Every build compiled (a backend compiles only the one that runs otherwise).
    std::env::set_var("KILN_W4_GEMV_BUILDS", "all");
    for dtype in half_dtypes() {
        let mut b = gpu(dtype, "auto");
        if !b.w4_tensor_cores() || !b.set_w4_gemv("base") {
            println!("RESULT w4a16 gemv-builds {dtype}: no tensor-core GEMV here, skipped");
            continue;
        }
        for (i, (label, fmt)) in fmts.into_iter().enumerate() {
            for (n, k) in [
                (64usize, 1152usize),
                (200, 4096),
                (17408, 5120),
                (5120, 17408),
            ] {
                if i >= 2 && (n > 1000 || dtype == "fp16") {
                    continue;
                }
                let o = Owned::random(fmt, n, k, 1200 + 10 * i as u64 + n as u64);
                let w = b
                    .upload_linear(label, &LinearView::Packed(o.linear()))
                    .expect("upload_linear");
                let x: Vec<f32> = data(8 * k, 51 + k as u64)
                    .into_iter()
                    .map(|v| round(dtype, v))
                    .collect();
                let (mut same, mut all) = (0, 0);
                for rows in 1..=8 {
                    b.set_w4_gemv("base");
                    let base = run(&b, &w, &x, rows, n, k, Some(W4Kernel::Gemv));
                    for v in &builds {
                        assert!(b.set_w4_gemv(v), "{v}");
                        let a = run(&b, &w, &x, rows, n, k, Some(W4Kernel::Gemv));
                        all += 1;
                        if bits_equal(&a, &base) && a.iter().all(|x| x.is_finite()) {
                            same += 1;
                        } else {
                            failures
                                .push(format!("{dtype} {label} {n}x{k} rows {rows} {v} != base"));
                        }
                    }
                }
                b.set_w4_gemv("base");
                println!(
                    "RESULT w4a16 gemv-builds {dtype} {label} N={n} K={k} rows=1..8 builds={builds:?} equal_to_base={same}/{all} {}",
                    if same == all { "ok" } else { "FAIL" }
                );
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
