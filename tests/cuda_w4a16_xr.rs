//! The packed W4A16 linears of Qwen3.5-27B at 16–64 rows (decode at 17–64 sequences): every
//! kernel that can run them, forced, bit for bit against the x-staged GEMV and timed, summed over
//! one decode step's linears; and the 17–64-row cluster GEMV (`kernels/w4a16_xr.cu`
//! `w4_gemvxr*`, sm_90+) against the GEMV on every layout it takes.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_w4a16_xr`):
//! `cuda_w4a16_xr-<hash> --ignored --exact --test-threads=1 --nocapture xr_gemv_equals_the_gemv_on_every_layout`
//! and `cuda_w4a16_xr-<hash> --ignored --exact --test-threads=1 --nocapture w4a16_rows_17_to_64_speed`
//! (`KILN_XR_TEST_SMALL=1`: the bit test's small shapes only; `KILN_XR_ROWS=32,64`: only these row counts; `KILN_XR_KERNELS=xs,xc,...`: only these kernels
//! besides the reference `xs`). Both print `RESULT` lines (docs/benchmarks.md,
//! docs/gpu-validation.md) and skip with a message where the kernel does not exist (below sm_90).
//!
//! Timing as in `cuda_w4a16_midm`: `common::time` (20 launches back to back, median of 7) on the
//! backend's stream, PDL as the backend has it; two device copies of each weight alternate, so a
//! launch does not find its weights in the L2 (the largest weight is 44.6 MB, the L2 50 MB).
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use common::*;
use kiln::backend::cuda::{CudaBackend, W4Kernel, W4_XR_VARIANTS};
use kiln::backend::Backend;
use kiln::tensor::LinearView;
use w4_support::{ct, fast_format_shape, fast_formats, Owned};

/// A build of `W4_XR_VARIANTS`: (warps per CTA, m16 tiles per warp, row groups of 8 rows, x ring
/// stages, CTAs per SM of the register cap, L2 prefetch distance).
type Build = (usize, usize, usize, usize, usize, usize);

/// A build's `KILN_W4_XR` name.
fn name((nw, mt, rg, xs, b, pf): Build) -> String {
    let h = if pf > 0 {
        format!("hp{pf}")
    } else {
        String::new()
    };
    format!("{nw}w{mt}t{rg}r{xs}s{b}b{h}")
}

/// The packed linears of one Qwen3.5-27B decode step: (N, K, how many per step), as
/// `cuda_w4a16_midm`, the largest first (a run cut short keeps their lines).
const STEP_LINEARS: [(usize, usize, usize); 7] = [
    (17408, 5120, 128), // MLP gate_proj and up_proj
    (5120, 17408, 64),  // MLP down_proj
    (10240, 5120, 48),  // GDN in_proj_qkv
    (5120, 6144, 64),   // GDN out_proj (48) and attention o_proj (16)
    (6144, 5120, 48),   // GDN in_proj_z
    (12288, 5120, 16),  // attention q_proj (with the output gate)
    (1024, 5120, 32),   // attention k_proj and v_proj
];

/// How a kernel of the sweep is set up: the backend's switches, then the forced kernel.
#[derive(Clone, Copy)]
enum Setup {
    /// The x-staged GEMV (`w4_gemvx1` / `w4_gemvx2`, 16-row tiles): both cluster GEMVs off,
    /// [`W4Kernel::Gemv`]. The bit reference.
    Xs,
    /// The 9–16-row cluster GEMV at any rows (`grid.y = ⌈m / 16⌉`, its pick), [`W4Kernel::Gemv`].
    Xc,
    /// A GEMM forced (both cluster GEMVs off).
    Forced(W4Kernel),
    /// One 17–64-row cluster GEMV build forced ([`W4Kernel::GemvXr`]).
    Xr(Build),
    /// The backend's choice with `KILN_W4_XR` off / on (its pick) and the 9–16-row kernel as
    /// by default.
    Auto(bool),
}

fn setup(b: &mut CudaBackend, s: Setup, rows: usize) -> W4Kernel {
    let xc_default = |b: &mut CudaBackend| assert!(b.set_w4_xc(true, None, 16));
    match s {
        Setup::Xs => {
            assert!(b.set_w4_xc(false, None, 16));
            assert!(b.set_w4_xr(false, None, (17, 64)));
            W4Kernel::Gemv
        }
        Setup::Xc => {
            assert!(b.set_w4_xc(true, None, 1024));
            assert!(b.set_w4_xr(false, None, (17, 64)));
            W4Kernel::Gemv
        }
        Setup::Forced(k) => {
            assert!(b.set_w4_xc(false, None, 16));
            assert!(b.set_w4_xr(false, None, (17, 64)));
            k
        }
        Setup::Xr(build) => {
            xc_default(b);
            assert!(b.set_w4_xr(false, Some(build), (17, 64)));
            W4Kernel::GemvXr
        }
        Setup::Auto(on) => {
            xc_default(b);
            assert!(b.set_w4_xr(on, None, (17, 64)));
            b.w4_kernel_for(rows)
        }
    }
}

/// Every kernel that runs 16–64 rows on the 27B's shapes at each row count (16, 17, 24, 32, 48,
/// 64; `KILN_XR_ROWS`), CT W4A16 sym g128, bf16: the x-staged GEMV (the reference), the cluster
/// GEMV with `grid.y` 2..4, `w4g_split`, `w4g_tile`, each `w4_gemvxr` build, and the backend's
/// choice before (`KILN_W4_XR` off) and after (on). Each output NaN-poisoned first and asserted
/// bit-equal to the reference. Prints per shape and row count µs, and per row count the sum over
/// one decode step's linears (ms) with its ratio to the 16-row step of the backend's choice
/// (target: ≤ 1.6× at 32 rows, ≤ 2.5× at 64).
#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_rows_17_to_64_speed() {
    let mut b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    if !b.set_w4_xr(false, None, (17, 64)) {
        println!("RESULT xr no 17–64-row cluster kernel here (sm_90+ only): nothing to compare");
        return;
    }
    let mut kernels: Vec<(String, Setup)> = vec![
        ("xs".into(), Setup::Xs),
        ("xc".into(), Setup::Xc),
        ("split".into(), Setup::Forced(W4Kernel::GemmSplit)),
        ("tile".into(), Setup::Forced(W4Kernel::GemmTile)),
        ("before".into(), Setup::Auto(false)),
        ("after".into(), Setup::Auto(true)),
    ];
    kernels.extend(
        W4_XR_VARIANTS
            .iter()
            .map(|&v| (format!("xr{}", name(v)), Setup::Xr(v))),
    );
    if let Ok(only) = std::env::var("KILN_XR_KERNELS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        kernels.retain(|(n, _)| n == "xs" || only.contains(&n.as_str()));
    }
    let rows: Vec<usize> = match std::env::var("KILN_XR_ROWS") {
        Ok(v) => v.split(',').filter_map(|m| m.trim().parse().ok()).collect(),
        Err(_) => vec![16, 17, 24, 32, 48, 64],
    };
    let max_m = *rows.iter().max().unwrap_or(&1);
    // Per row count and kernel: the step's linears (µs); NaN where a kernel did not apply.
    let mut step = vec![vec![0.0f64; kernels.len()]; rows.len()];
    let mut failures: Vec<String> = Vec::new();
    for (i, &(n, k, count)) in STEP_LINEARS.iter().enumerate() {
        let o = Owned::random(ct(128, true), n, k, 41 + i as u64);
        let ws: Vec<_> = (0..2)
            .map(|_| {
                b.upload_linear("xr", &LinearView::Packed(o.linear()))
                    .expect("upload")
            })
            .collect();
        let xh: Vec<f32> = data(max_m * k, 15 + i as u64)
            .into_iter()
            .map(|v| round("bf16", v))
            .collect();
        let x = b.upload(&xh).expect("x");
        for (ri, &m) in rows.iter().enumerate() {
            let mut line = format!("RESULT xr N={n} K={k} M={m}");
            let mut want: Option<Vec<f32>> = None;
            for (ki, (label, s)) in kernels.iter().enumerate() {
                let kern = setup(&mut b, *s, m);
                if let Setup::Xr(_) = s {
                    if b.w4_mid_kernel_for(&ws[0], m, kern).is_none() {
                        step[ri][ki] = f64::NAN;
                        line += &format!(" {label}=n/a");
                        continue;
                    }
                }
                let mut out = b.upload(&vec![f32::NAN; m * n]).expect("out");
                b.matmul_w4_with(&x, m, &ws[0], &mut out, kern)
                    .expect("matmul");
                let got = down(&b, &out, m * n);
                match &want {
                    None => {
                        assert!(
                            got.iter().all(|v| v.is_finite()) && got.iter().any(|&v| v != 0.0),
                            "xs output at N={n} K={k} M={m} is not finite or all zero"
                        );
                        want = Some(got);
                    }
                    // Recorded, asserted after the sweep (so one wrong kernel does not hide
                    // the others' figures).
                    Some(w) if !bits_equal(w, &got) => {
                        failures.push(format!(
                            "{label} differs from the x-staged GEMV at N={n} K={k} M={m}"
                        ));
                        line += &format!(" {label}_BITS_DIFFER");
                    }
                    Some(_) => {}
                }
                let mut j = 0usize;
                let t = time(&b, || {
                    j += 1;
                    b.matmul_w4_with(&x, m, &ws[j & 1], &mut out, kern)
                        .expect("matmul")
                });
                step[ri][ki] += t * 1e6 * count as f64;
                line += &format!(" {label}={:.2}", t * 1e6);
            }
            println!("{line}");
        }
    }
    let base16 = rows.iter().position(|&m| m == 16).and_then(|ri| {
        kernels
            .iter()
            .position(|(l, _)| l == "before")
            .map(|ki| step[ri][ki])
    });
    for (ri, &m) in rows.iter().enumerate() {
        let mut line = format!("RESULT xr step M={m} linears_ms");
        for (ki, (label, _)) in kernels.iter().enumerate() {
            line += &format!(" {label}={:.2}", step[ri][ki] / 1e3);
        }
        let best = kernels
            .iter()
            .enumerate()
            .filter(|&(ki, _)| step[ri][ki].is_finite())
            .min_by(|a, c| step[ri][a.0].total_cmp(&step[ri][c.0]))
            .map(|(ki, (l, _))| (l.clone(), step[ri][ki]));
        if let Some((l, v)) = best {
            line += &format!(" best={l}");
            if let Some(b16) = base16 {
                line += &format!(" best_over_16rows={:.2}", v / b16);
            }
        }
        for tag in ["before", "after"] {
            if let (Some(ki), Some(b16)) = (kernels.iter().position(|(l, _)| l == tag), base16) {
                line += &format!(" {tag}_over_16rows={:.2}", step[ri][ki] / b16);
            }
        }
        println!("{line}");
    }
    setup(&mut b, Setup::Auto(false), 1);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every `w4_gemvxr` build against the x-staged GEMV (`w4_gemvx1` / `w4_gemvx2`, both cluster
/// GEMVs off) bit for bit, outputs finite, at rows 1, 5, 16, 17, 31, 32, 33, 40, 63, 64, 65, 100
/// (row tiles past m zero-filled, several row tiles): bf16 and fp16; CT sym / asym g128 on the
/// small shapes (K = 1024, 2048: 1 and 2 k blocks per slice, fewer than the x ring's stages) and
/// 5120×6144 / 1024×5120 / 5120×17408 (6, 5, 17 k blocks per slice: the ring wraps), CT sym g32,
/// AWQ g64, GPTQ g64 and NVFP4 (bf16) on the small shapes and 5120×6144. Each comparison first
/// asserts the build applies (else says so).
#[test]
#[ignore = "needs a GPU: see the header"]
fn xr_gemv_equals_the_gemv_on_every_layout() {
    let mut backends: Vec<(&str, CudaBackend)> = ["bf16", "fp16"]
        .into_iter()
        .map(|d| (d, gpu(d, "auto")))
        .collect();
    backends.retain_mut(|(d, b)| {
        let ok = b.w4_tensor_cores() && b.set_w4_xr(false, None, (17, 64));
        if !ok {
            println!(
                "RESULT w4a16 xr-gemv {d}: no 17–64-row cluster kernel here (sm_90+ only), skipped"
            );
        }
        ok
    });
    let fmts = fast_formats();
    // `KILN_XR_TEST_SMALL=1`: the small shapes only (the short pass for compute-sanitizer).
    let small_only = std::env::var("KILN_XR_TEST_SMALL").is_ok_and(|v| v == "1");
    let mut shapes = vec![(128usize, 1024usize), (256, 2048)];
    if !small_only {
        shapes.extend([(5120, 6144), (1024, 5120), (5120, 17408)]);
    }
    let rows_list = [1usize, 5, 16, 17, 31, 32, 33, 40, 63, 64, 65, 100];
    let max_m = 100;
    let mut failures = Vec::new();
    for (i, (label, fmt)) in fmts.into_iter().enumerate() {
        for &(n, k) in shapes.iter().filter(|&&s| fast_format_shape(i, s)) {
            let o = Owned::random(fmt, n, k, 900 + 10 * i as u64 + n as u64);
            for (dtype, b) in backends.iter_mut() {
                if *dtype == "fp16" && i >= 2 {
                    continue;
                }
                let w = b
                    .upload_linear(label, &LinearView::Packed(o.linear()))
                    .expect("upload_linear");
                let xh: Vec<f32> = data(max_m * k, 61 + k as u64)
                    .into_iter()
                    .map(|v| round(dtype, v))
                    .collect();
                let x = b.upload(&xh).expect("x");
                let run = |b: &CudaBackend, rows: usize, kern: W4Kernel| -> Vec<f32> {
                    let mut out = b.upload(&vec![f32::NAN; rows * n]).expect("out");
                    b.matmul_w4_with(&x, rows, &w, &mut out, kern)
                        .expect("matmul_w4_with");
                    down(b, &out, rows * n)
                };
                let (mut same, mut all, mut skipped) = (0, 0, 0);
                for &rows in &rows_list {
                    assert!(b.set_w4_xc(false, None, 16));
                    assert!(b.set_w4_xr(false, None, (17, 64)));
                    let base = run(b, rows, W4Kernel::Gemv);
                    for build in W4_XR_VARIANTS {
                        assert!(b.set_w4_xr(false, Some(build), (17, 64)));
                        if b.w4_mid_kernel_for(&w, rows, W4Kernel::GemvXr).is_none() {
                            skipped += 1;
                            continue;
                        }
                        let a = run(b, rows, W4Kernel::GemvXr);
                        all += 1;
                        if bits_equal(&a, &base) && a.iter().all(|v| v.is_finite()) {
                            same += 1;
                        } else {
                            let diff = a
                                .iter()
                                .zip(&base)
                                .filter(|(p, q)| p.to_bits() != q.to_bits())
                                .count();
                            failures.push(format!(
                                "{dtype} {label} {n}x{k} rows {rows} build {}: {diff} of {} outputs differ from w4_gemvx",
                                name(build),
                                a.len()
                            ));
                        }
                    }
                }
                assert!(b.set_w4_xc(true, None, 16));
                assert!(b.set_w4_xr(false, None, (17, 64)));
                println!(
                    "RESULT w4a16 xr-gemv {dtype} {label} N={n} K={k} rows={rows_list:?} runs={all} (not applicable: {skipped}) equal_to_w4_gemvx={same}/{all} {}",
                    if same == all && all > 0 { "ok" } else { "FAIL" }
                );
                if all == 0 {
                    failures.push(format!("{dtype} {label} {n}x{k}: no build ran"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
