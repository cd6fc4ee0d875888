//! The cluster W4A16 GEMV for 9–16 rows (`kernels/w4a16_xs.cu` `w4_gemvxc*`, sm_90+; issue 10
//! item 7): its outputs against the x-staged GEMV it replaces (`w4_gemvx1` / `w4_gemvx2`) bit
//! for bit, and its speed against it in the same process.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_w4a16_xc`):
//! `cuda_w4a16_xc-<hash> --ignored --exact --test-threads=1 --nocapture xc_gemv_equals_xs_gemv_bit_for_bit`
//! (`KILN_XC_TEST_SMALL=1`: the small shapes only; with `KILN_XC_TEST_ROWS=2,9,16,17
//! KILN_XC_TEST_BUILDS=4x2b8hp3,8x2b4hp3,8p2b4hp3` the quick pass for compute-sanitizer) and
//! `cuda_w4a16_xc-<hash> --ignored --exact --test-threads=1 --nocapture w4a16_gemv_xc_speed`.
//! Both print `RESULT` lines (docs/gpu-validation.md, docs/benchmarks.md) and skip with a message
//! where the kernel does not exist (below sm_90).
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use common::*;
use kiln::backend::cuda::{CudaBackend, W4Kernel};
use kiln::backend::Backend;
use kiln::tensor::LinearView;
use w4_support::{ct, fast_format_shape, fast_formats, Owned};

/// A build: (tiles per CTA, weight ring depth, CTAs per SM of its register cap, slice sums
/// pushed, L2 prefetch distance (0: no L2 hints)).
type Build = (usize, usize, usize, bool, usize);

/// The builds (`kernels.rs` `W4_XC_VARIANTS`), then `None`: the backend's pick per launch.
const BUILDS: [Option<Build>; 9] = [
    Some((8, 2, 4, true, 0)),
    Some((4, 2, 8, true, 0)),
    Some((8, 2, 4, false, 0)),
    Some((4, 2, 8, false, 0)),
    Some((16, 2, 2, false, 0)),
    Some((4, 2, 8, false, 3)),
    Some((8, 2, 4, false, 3)),
    Some((8, 2, 4, true, 3)),
    None,
];

/// A build's label in the RESULT lines (`xc` + its `KILN_W4_XC` name), or `pick`.
fn label(build: Option<Build>) -> String {
    build.map_or("pick".into(), |(t, d, b, push, pf)| {
        let h = if pf > 0 {
            format!("hp{pf}")
        } else {
            String::new()
        };
        format!("xc{t}{}{d}b{b}{h}", if push { 'p' } else { 'x' })
    })
}

/// `o` on the first `rows` rows of `x` through [`W4Kernel::Gemv`], output NaN-poisoned first.
fn run(
    b: &CudaBackend,
    w: &<CudaBackend as Backend>::Weight,
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let xb = b.upload(&x[..rows * k]).expect("upload x");
    let mut out = b.alloc(rows * n).expect("alloc out");
    let nan = b.upload(&vec![f32::NAN; rows * n]).expect("poison");
    b.add(&mut out, &nan, rows * n).expect("poison add");
    b.matmul_w4_with(&xb, rows, w, &mut out, W4Kernel::Gemv)
        .expect("matmul_w4_with");
    down(b, &out, rows * n)
}

/// Every build at rows 2–16 (the kernel's fewest rows lowered to 2; below 9 the cluster-off
/// output is the 1–8-row GEMV's) and 17, 24, 31, 32 (two row tiles) against `w4_gemvx1` /
/// `w4_gemvx2` (the cluster kernel off) bit for bit, outputs finite: bf16 and fp16; CT sym / asym
/// g128 on the small shapes and the 27B shapes with 8 K slices, CT sym g32, AWQ g64, GPTQ g64
/// and NVFP4 (bf16) on the small shapes and 5120×6144. Each comparison also asserts that the
/// cluster kernel ran (the shape's tile count allows the build) or says it did not.
#[test]
#[ignore = "needs a GPU: see the header"]
fn xc_gemv_equals_xs_gemv_bit_for_bit() {
    let mut backends: Vec<(&str, CudaBackend)> = ["bf16", "fp16"]
        .into_iter()
        .map(|d| (d, gpu(d, "auto")))
        .collect();
    backends.retain_mut(|(d, b)| {
        // The 17–64-row rule off: rows 17–32 here are the cluster GEMV's (forced) or the
        // x-staged GEMV's.
        let ok = b.w4_tensor_cores()
            && b.set_w4_xc(false, None, 16)
            && b.set_w4_xr(false, None, (17, 64));
        if !ok {
            println!("RESULT w4a16 xc-gemv {d}: no cluster kernel here (sm_90+ only), skipped");
        }
        ok
    });
    let fmts = fast_formats();
    // Small shapes first: 1 k block per slice (K = 1024) and 2 (K = 2048), 8 and 16 m16 tiles.
    let small_only = std::env::var("KILN_XC_TEST_SMALL").is_ok_and(|v| v == "1");
    let mut shapes = vec![(128usize, 1024usize), (256, 2048)];
    if !small_only {
        shapes.extend([
            (5120, 6144),
            (17408, 5120),
            (5120, 17408),
            (10240, 5120),
            (6144, 5120),
            (12288, 5120),
            (1024, 5120),
        ]);
    }
    // `KILN_XC_TEST_ROWS=2,9,16,17` / `KILN_XC_TEST_BUILDS=4x2b8hp3,...`: only these row counts /
    // builds (the pick still runs; the short pass under compute-sanitizer).
    let list = |var: &str| -> Option<Vec<String>> {
        std::env::var(var)
            .ok()
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
    };
    let rows_list: Vec<usize> = match list("KILN_XC_TEST_ROWS") {
        Some(r) => r.iter().filter_map(|r| r.parse().ok()).collect(),
        None => (2..=16).chain([17, 24, 31, 32]).collect(),
    };
    let only_builds = list("KILN_XC_TEST_BUILDS");
    for (_, b) in backends.iter_mut() {
        assert!(b.set_w4_xc_min_rows(Some(2)));
    }
    let mut failures = Vec::new();
    for (i, (label, fmt)) in fmts.into_iter().enumerate() {
        for &(n, k) in shapes.iter().filter(|&&s| fast_format_shape(i, s)) {
            let o = Owned::random(fmt, n, k, 700 + 10 * i as u64 + n as u64);
            for (dtype, b) in backends.iter_mut() {
                if *dtype == "fp16" && i >= 2 {
                    continue;
                }
                let w = b
                    .upload_linear(label, &LinearView::Packed(o.linear()))
                    .expect("upload_linear");
                let x: Vec<f32> = data(32 * k, 51 + k as u64)
                    .into_iter()
                    .map(|v| round(dtype, v))
                    .collect();
                let (mut same, mut all, mut ran) = (0, 0, 0);
                for &rows in &rows_list {
                    b.set_w4_xc(false, None, 32);
                    let base = run(b, &w, &x, rows, n, k);
                    for build in BUILDS {
                        if build.is_some()
                            && only_builds.as_ref().is_some_and(|o| {
                                !o.iter().any(|n| format!("xc{n}") == self::label(build))
                            })
                        {
                            continue;
                        }
                        b.set_w4_xc(true, build, 32);
                        if b.w4_xc_build_for(&w, rows).is_none() {
                            continue;
                        }
                        ran += 1;
                        let a = run(b, &w, &x, rows, n, k);
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
                                "{dtype} {label} {n}x{k} rows {rows} build {build:?}: {diff} of {} outputs differ from w4_gemvx",
                                a.len()
                            ));
                        }
                    }
                }
                b.set_w4_xc(false, None, 16);
                println!(
                    "RESULT w4a16 xc-gemv {dtype} {label} N={n} K={k} rows={rows_list:?} builds_run={ran} equal_to_w4_gemvx={same}/{all} {}",
                    if same == all { "ok" } else { "FAIL" }
                );
            }
        }
    }
    for (_, b) in backends.iter_mut() {
        b.set_w4_xc(true, None, 16);
        b.set_w4_xc_min_rows(None);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Same-run speed: CT W4A16 sym g128, bf16, rotating over 4 distinct weights per shape (every
/// launch from DRAM), `common::time` (20 launches back to back, median of 7), PDL as the backend
/// has it (on, sm_90). Per shape (the 27B's with 8 K slices) and row count (1, 2, 4, 6, 8, 9, 12,
/// 16): the backend's GEMV with the cluster kernel off (`w4_gemv` to 8 rows, `w4_gemvx1` /
/// `w4_gemvx2` above), at 9+ rows each build, and the base pick (`KILN_W4_XC=base`: no L2
/// hints) and the backend's pick (below 9 rows with the kernel's fewest rows lowered to 2), µs
/// and the ratio to the 1-row time of the same run (target: ≤ 1.3 at 2–16 rows). Then, PDL on
/// and off, the A/B of the picks: 5 rounds of (1 row, 16 rows base pick, 16 rows pick, 9 rows
/// base pick, 9 rows pick, 8 rows off, 8 rows pick), medians (the spread between calls is ~1%,
/// so they are compared within rounds). Every build's output is first
/// checked bit for bit against the cluster-off output on the same data (asserted).
/// `KILN_XC_BENCH_SHAPES=17408x5120,...` keeps those shapes only.
#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_gemv_xc_speed() {
    let mut b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    if !b.set_w4_xc(false, None, 32) {
        println!("RESULT xc no cluster kernel here (sm_90+ only): nothing to compare");
        return;
    }
    let copy = copy_bandwidth();
    println!("RESULT xc copy_bandwidth_GBps={:.0}", copy / 1e9);
    let only: Option<String> = std::env::var("KILN_XC_BENCH_SHAPES").ok();
    let shapes = [
        (17408usize, 5120usize),
        (5120, 17408),
        (10240, 5120),
        (5120, 6144),
        (12288, 5120),
        (6144, 5120),
        (1024, 5120),
    ];
    for (si, &(n, k)) in shapes.iter().enumerate() {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|s| s == format!("{n}x{k}")))
        {
            continue;
        }
        let ws: Vec<_> = (0..4u64)
            .map(|j| {
                let o = Owned::random(ct(128, true), n, k, 500 + 10 * si as u64 + j);
                b.upload_linear("xc", &LinearView::Packed(o.linear()))
                    .expect("upload")
            })
            .collect();
        let xh: Vec<f32> = data(32 * k, 9 + si as u64)
            .into_iter()
            .map(|v| round("bf16", v))
            .collect();
        let x = b.upload(&xh).expect("x");
        let mut out = b.alloc(32 * n).expect("out");
        let bytes = b.weight_bytes(&ws[0]) as f64;
        let mut timed = |b: &CudaBackend, rows: usize| {
            let mut j = 0usize;
            time(b, || {
                j = (j + 1) % ws.len();
                b.matmul_w4_with(&x, rows, &ws[j], &mut out, W4Kernel::Gemv)
                    .expect("gemv")
            })
        };
        let mut one = 0.0;
        for rows in [1usize, 2, 4, 6, 8, 9, 12, 16] {
            b.set_w4_xc(false, None, 32);
            let base_bits = run(&b, &ws[0], &xh, rows, n, k);
            let t0 = timed(&b, rows);
            if rows == 1 {
                one = t0;
            }
            let mut line = format!(" off_us={:.2} ({:.2}x)", t0 * 1e6, t0 / one);
            if rows > 1 {
                // Every build (9+ rows), then the base pick (label `basepick`), then the pick.
                let mut runs: Vec<(Option<Build>, bool)> = BUILDS
                    .iter()
                    .flatten()
                    .filter(|_| rows > 8)
                    .map(|&v| (Some(v), false))
                    .collect();
                runs.extend([(None, true), (None, false)]);
                b.set_w4_xc_min_rows(Some(2));
                for (build, base) in runs {
                    b.set_w4_xc(true, build, 32);
                    b.set_w4_xc_base_pick(base);
                    let name = if base {
                        "basepick".into()
                    } else {
                        label(build)
                    };
                    let Some(ran) = b.w4_xc_build_for(&ws[0], rows) else {
                        line += &format!(" {name}=n/a");
                        continue;
                    };
                    let a = run(&b, &ws[0], &xh, rows, n, k);
                    assert!(
                        bits_equal(&a, &base_bits),
                        "{n}x{k} rows {rows} build {build:?}: bits differ from the cluster-off GEMV"
                    );
                    let t = timed(&b, rows);
                    line += &format!(" {name}_us={:.2} ({:.2}x)", t * 1e6, t / one);
                    if build.is_none() {
                        line += &format!(" {name}ed={}", label(Some(ran)));
                    }
                }
                b.set_w4_xc_base_pick(false);
                b.set_w4_xc_min_rows(None);
            }
            println!(
                "RESULT xc gemv N={n} K={k} rows={rows} rotating_4_weights 1row={:.3}_of_copy{line}",
                bytes / one / copy
            );
        }
        // The two picks A/B, PDL on then off: rounds of 1 row (cluster kernel off: `w4_gemv`),
        // then 16 and 9 rows with the base pick and the pick; medians over the rounds.
        for pdl in [true, false] {
            b.set_pdl(pdl, true);
            let mut t: [Vec<f64>; 7] = Default::default();
            for _ in 0..5 {
                b.set_w4_xc(false, None, 32);
                t[0].push(timed(&b, 1));
                t[5].push(timed(&b, 8));
                b.set_w4_xc(true, None, 32);
                for (i, (rows, base)) in [(16, true), (16, false), (9, true), (9, false)]
                    .into_iter()
                    .enumerate()
                {
                    b.set_w4_xc_base_pick(base);
                    t[i + 1].push(timed(&b, rows));
                }
                b.set_w4_xc_base_pick(false);
                b.set_w4_xc_min_rows(Some(2));
                t[6].push(timed(&b, 8));
                b.set_w4_xc_min_rows(None);
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let m: Vec<f64> = t.iter_mut().map(med).collect();
            println!(
                "RESULT xc ab N={n} K={k} pdl={} rows=1 us={:.2} rows=16 basepick_us={:.2} ({:.3}x) pick_us={:.2} ({:.3}x) rows=9 basepick_us={:.2} ({:.3}x) pick_us={:.2} ({:.3}x) pick_vs_base16={:.3} rows=8 off_us={:.2} ({:.3}x) xcpick_us={:.2} ({:.3}x)",
                if pdl { "on" } else { "off" },
                m[0] * 1e6,
                m[1] * 1e6,
                m[1] / m[0],
                m[2] * 1e6,
                m[2] / m[0],
                m[3] * 1e6,
                m[3] / m[0],
                m[4] * 1e6,
                m[4] / m[0],
                m[2] / m[1],
                m[5] * 1e6,
                m[5] / m[0],
                m[6] * 1e6,
                m[6] / m[0]
            );
        }
        b.set_pdl(true, true);
    }
    b.set_w4_xc(true, None, 16);
}

/// Launches for Nsight Compute (no timing): CT W4A16 sym g128, bf16, one 17408×5120 weight (or
/// `KILN_XC_PROFILE_SHAPE=NxK`); 1 row (the cluster kernel off: `w4_gemv`) then 16 rows with each
/// build named in `KILN_XC_PROFILE_BUILDS` (default `8x2b4`), two launches each (profile the
/// second), e.g. `ncu --clock-control none -k regex:w4_gemv --launch-count 8 --section
/// SpeedOfLight ... cuda_w4a16_xc-<hash> --ignored --exact w4a16_gemv_xc_profile_launches`.
#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_gemv_xc_profile_launches() {
    let mut b = gpu("bf16", "auto");
    if !b.set_w4_xc(false, None, 16) {
        println!("RESULT xc no cluster kernel here (sm_90+ only): nothing to profile");
        return;
    }
    let (n, k) = std::env::var("KILN_XC_PROFILE_SHAPE")
        .ok()
        .and_then(|s| {
            let (a, c) = s.split_once('x')?;
            Some((a.parse().ok()?, c.parse().ok()?))
        })
        .unwrap_or((17408usize, 5120usize));
    let names = std::env::var("KILN_XC_PROFILE_BUILDS").unwrap_or_else(|_| "8x2b4".into());
    let o = Owned::random(ct(128, true), n, k, 77);
    let w = b
        .upload_linear("xc", &LinearView::Packed(o.linear()))
        .expect("upload");
    let xh: Vec<f32> = data(16 * k, 5)
        .into_iter()
        .map(|v| round("bf16", v))
        .collect();
    let x = b.upload(&xh).expect("x");
    let mut out = b.alloc(16 * n).expect("out");
    let mut go = |b: &CudaBackend, rows: usize| {
        for _ in 0..2 {
            b.matmul_w4_with(&x, rows, &w, &mut out, W4Kernel::Gemv)
                .expect("gemv");
        }
        b.synchronize().expect("sync");
    };
    go(&b, 1);
    for name in names.split(',') {
        let Some(build) = BUILDS
            .iter()
            .flatten()
            .copied()
            .find(|&v| label(Some(v)) == format!("xc{name}"))
        else {
            println!("RESULT xc profile: unknown build {name}");
            continue;
        };
        b.set_w4_xc(true, Some(build), 16);
        match b.w4_xc_build_for(&w, 16) {
            Some(_) => {
                go(&b, 16);
                println!("RESULT xc profile launched {name} N={n} K={k} rows=16 (x2)");
            }
            None => println!("RESULT xc profile: {name} does not apply to {n}x{k}"),
        }
    }
    b.set_w4_xc(true, None, 16);
}
