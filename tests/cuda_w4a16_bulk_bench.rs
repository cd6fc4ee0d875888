//! The bulk-copy W4A16 GEMV (`kernels/w4a16_bulk.cu`, sm_90+, issue 10 item 7) against
//! `w4_gemv` in one process: bits of every ring setting, then timings by the DRAM method of
//! `tests/cuda_w4a16_bench.rs` (rotating over 4 weights, 20 launches back to back, median of 7),
//! beside the 1 GiB copy and a copy of the weight's own byte count. Figures, not pass/fail
//! checks (the bits are asserted); they go into docs/benchmarks.md.
//!
//! Run on the GPU machine (built with `cargo test --release --features cuda --no-run`):
//! `cuda_w4a16_bulk_bench-<hash> --ignored --exact --test-threads=1 --nocapture w4a16_gemv_bulk`
//! (`KILN_BULK_BENCH`, `KILN_BULK_BENCH_SHAPES`, `KILN_BULK_BENCH_BITS_ONLY`: see the test).
#![cfg(feature = "cuda")]

mod common;
mod w4_support;

use common::*;
use kiln::backend::cuda::W4Kernel;
use kiln::backend::Backend;
use kiln::tensor::LinearView;
use w4_support::{Fmt, Owned};

/// CT W4A16 symmetric, group 128 (the 27B checkpoint's format), seeded.
fn ct_g128(n: usize, k: usize, seed: u64) -> Owned {
    Owned::random(
        Fmt::Ct {
            group: 128,
            symmetric: true,
            act_order: false,
        },
        n,
        k,
        seed,
    )
}

/// Median seconds of a device-to-device copy of `bytes` bytes timed as the GEMVs here: rotating
/// over 4 source / destination pairs (from DRAM, as the rotating weights), 20 copies back to
/// back, median of 7 (`common::time`'s method). Its bandwidth, read + write as
/// [`copy_bandwidth`], is the ceiling of a launch of that size: a ~45 MB launch has a ramp and
/// tail a 1 GiB copy does not.
fn same_size_copy_seconds(bytes: usize) -> f64 {
    let ctx = cudarc::driver::CudaContext::new(0).expect("context");
    let s = ctx.default_stream();
    let mut pairs: Vec<_> = (0..4)
        .map(|_| {
            (
                s.alloc_zeros::<u8>(bytes).expect("alloc"),
                s.alloc_zeros::<u8>(bytes).expect("alloc"),
            )
        })
        .collect();
    let mut j = 0usize;
    let mut batch = |n: usize| {
        let st = std::time::Instant::now();
        for _ in 0..n {
            j = (j + 1) % pairs.len();
            let (src, dst) = &mut pairs[j];
            s.memcpy_dtod(src, dst).expect("copy");
        }
        s.synchronize().expect("sync");
        st.elapsed().as_secs_f64() / n as f64
    };
    batch(ITERS);
    let mut t: Vec<f64> = (0..REPS).map(|_| batch(ITERS)).collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

/// The bulk-copy GEMV (`kernels/w4a16_bulk.cu`, [`W4Kernel::GemvBulk`]) against `w4_gemv`
/// ([`W4Kernel::Gemv`] with the bulk kernel off) in the same process: CT W4A16 sym g128, bf16,
/// rotating over 4 distinct weights per shape (every launch from DRAM, the method of
/// `w4a16_gemv_profile_launches`), 20 launches back to back, median of 7, µs and fraction of the
/// copy bandwidth of the same run (bytes = packed words + scales), and per shape the fraction of
/// a copy of the weight's own byte count timed the same way (`same`, [`same_size_copy_seconds`]).
/// Shapes 17408×5120, 5120×17408, 10240×5120, 5120×6144 at 1 / 2 / 4 / 8 rows; PDL off, then
/// on (trigger after the main loop, the default); the bulk kernel with the rings of
/// `KILN_BULK_BENCH` (`SKxSTAGES`: k blocks per stage × stages per warp, `h` = with the L2
/// evict-first hint, `c` = the cluster form, `pN` = the block form on a persistent grid of N
/// blocks per SM; default `w4_support::BULK_VARIANTS`, every one of
/// which the bit test `cuda_w4a16 bulk_gemv_equals_w4_gemv_bit_for_bit` covers). Before the
/// timings every variant's output is **checked bit for bit** against `w4_gemv` on each shape and
/// row count (asserted), each launch synchronized so that a device error names its variant
/// (`RESULT bulk FAULT ...`). `KILN_BULK_BENCH_SHAPES=NxK,...` picks the shapes;
/// `KILN_BULK_BENCH_BITS_ONLY=1` stops after the bits (a profiler pass). Ends with the
/// best variant per (PDL, shape, rows). Run (GPU machine):
/// `cuda_w4a16_bulk_bench-<hash> --ignored --exact --test-threads=1 --nocapture w4a16_gemv_bulk`
#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_gemv_bulk() {
    let mut b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    if !b.set_w4_bulk(false, 2, 2, false, false) {
        println!("RESULT bulk unavailable on this device (sm_90+ only): nothing to compare");
        return;
    }
    let copy = copy_bandwidth();
    println!("RESULT bulk copy_bandwidth_GBps={:.0}", copy / 1e9);
    let variants = w4_support::bulk_variants(
        &std::env::var("KILN_BULK_BENCH").unwrap_or_else(|_| w4_support::BULK_VARIANTS.into()),
    );
    let shapes: Vec<(usize, usize)> = match std::env::var("KILN_BULK_BENCH_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                let (n, k) = s.trim().split_once('x')?;
                Some((n.parse().ok()?, k.parse().ok()?))
            })
            .collect(),
        Err(_) => vec![(17408, 5120), (5120, 17408), (10240, 5120), (5120, 6144)],
    };
    let mut sets: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| {
            let ws: Vec<_> = (0..4u64)
                .map(|j| {
                    let o = ct_g128(n, k, 500 + 10 * i as u64 + j);
                    b.upload_linear("bulk", &LinearView::Packed(o.linear()))
                        .expect("upload")
                })
                .collect();
            let x = b.upload(&data(8 * k, 9 + i as u64)).expect("x");
            let out = b.alloc(8 * n).expect("out");
            (n, k, ws, x, out)
        })
        .collect();
    // Bits first: every variant against w4_gemv, each launch synchronized (a device error is
    // sticky: the line before the panic names the launch that raised it), into an output of
    // exactly `rows` rows poisoned with NaN (`download` takes the whole buffer: the bench's first
    // version downloaded `rows` rows of the 8-row timing buffer, an argument error that the
    // merged-main run of 80b2937 reported as a device fault).
    let mut same = 0;
    let mut all = 0;
    for (n, k, ws, x, _) in sets.iter_mut() {
        for rows in [1usize, 2, 4, 8] {
            let nan = vec![f32::NAN; rows * *n];
            b.set_w4_bulk(false, 2, 2, false, false);
            b.set_w4_bulk_grid(0, 0);
            let mut o = b.upload(&nan).expect("out");
            b.matmul_w4_with(x, rows, &ws[0], &mut o, W4Kernel::Gemv)
                .expect("gemv");
            if let Err(e) = b.synchronize() {
                println!("RESULT bulk FAULT w4_gemv N={n} K={k} rows={rows}: {e}");
                panic!("w4_gemv faulted");
            }
            let base = down(&b, &o, rows * *n);
            for (name, stages, sk, hint, cluster, persist) in &variants {
                b.set_w4_bulk(false, *stages, *sk, *hint, *cluster);
                b.set_w4_bulk_grid(*persist, 0);
                let mut o = b.upload(&nan).expect("out");
                b.matmul_w4_with(x, rows, &ws[0], &mut o, W4Kernel::GemvBulk)
                    .expect("bulk");
                if let Err(e) = b.synchronize() {
                    println!("RESULT bulk FAULT {name} N={n} K={k} rows={rows}: {e}");
                    panic!("{name} faulted");
                }
                let got = down(&b, &o, rows * *n);
                all += 1;
                if bits_equal(&got, &base) && got.iter().all(|v| v.is_finite()) {
                    same += 1;
                } else {
                    println!("RESULT bulk bits N={n} K={k} rows={rows} {name} DIFFERS");
                }
            }
        }
    }
    println!("RESULT bulk bits_equal_to_w4_gemv={same}/{all}");
    if std::env::var("KILN_BULK_BENCH_BITS_ONLY").is_ok_and(|v| v == "1") {
        // (A profiler pass: the first launches are the bits pass's.)
        b.set_w4_bulk(false, 2, 2, false, false);
        b.set_w4_bulk_grid(0, 0);
        assert_eq!(same, all, "a bulk variant's bits differ from w4_gemv");
        return;
    }
    let mut best = Vec::new();
    for (pdl_name, pdl) in [("pdl_off", false), ("pdl_on", true)] {
        b.set_pdl(pdl, true);
        for (n, k, ws, x, out) in sets.iter_mut() {
            let bytes = b.weight_bytes(&ws[0]) as f64;
            let same_copy = 2.0 * bytes / same_size_copy_seconds(bytes as usize);
            if !pdl {
                println!(
                    "RESULT bulk same_size_copy N={n} K={k} bytes={bytes:.0} GBps={:.0} of_1GiB_copy={:.3}",
                    same_copy / 1e9,
                    same_copy / copy
                );
            }
            let mut one_row = Vec::new();
            for rows in [1usize, 2, 4, 8] {
                let mut line = String::new();
                let mut ts = Vec::new();
                let runs = std::iter::once(("w4_gemv", W4Kernel::Gemv, 2, 2, false, false, 0))
                    .chain(variants.iter().map(|(nm, st, sk, h, c, p)| {
                        (nm.as_str(), W4Kernel::GemvBulk, *st, *sk, *h, *c, *p)
                    }));
                let mut top = ("", f64::INFINITY);
                for (name, kernel, stages, sk, hint, cluster, persist) in runs {
                    b.set_w4_bulk(false, stages, sk, hint, cluster);
                    b.set_w4_bulk_grid(persist, 0);
                    let mut j = 0usize;
                    let t = time(&b, || {
                        j = (j + 1) % ws.len();
                        b.matmul_w4_with(x, rows, &ws[j], out, kernel)
                            .expect("gemv")
                    });
                    line += &format!(" {name}={:.2}us({:.3})", t * 1e6, bytes / t / copy);
                    ts.push(t);
                    if kernel == W4Kernel::GemvBulk && t < top.1 {
                        top = (name, t);
                    }
                }
                best.push(format!(
                    "RESULT bulk best {pdl_name} N={n} K={k} rows={rows} w4_gemv={:.2}us({:.3} copy, {:.3} same) {}={:.2}us({:.3} copy, {:.3} same) speedup={:.3}",
                    ts[0] * 1e6,
                    bytes / ts[0] / copy,
                    bytes / ts[0] / same_copy,
                    top.0,
                    top.1 * 1e6,
                    bytes / top.1 / copy,
                    bytes / top.1 / same_copy,
                    ts[0] / top.1
                ));
                if rows == 1 {
                    one_row = ts.clone();
                } else {
                    line += " ratio_to_1row:";
                    for (t, t1) in ts.iter().zip(&one_row) {
                        line += &format!(" {:.2}", t / t1);
                    }
                }
                println!("RESULT bulk {pdl_name} N={n} K={k} rows={rows}{line}");
            }
        }
    }
    for l in &best {
        println!("{l}");
    }
    b.set_pdl(true, true);
    b.set_w4_bulk(false, 2, 2, false, false);
    b.set_w4_bulk_grid(0, 0);
    assert_eq!(same, all, "a bulk variant's bits differ from w4_gemv");
}

/// The 1–8-row GEMV's builds (`kernels/w4a16_gemv.cu`, `KILN_W4_GEMV`, branch `gemv5`) against
/// the plain `w4_gemv` in one process ([`CudaBackend::set_w4_gemv`]): first every build's output
/// **bit for bit** against the plain one (asserted; CT sym g128, CT asym g128 and NVFP4, rows 1 /
/// 3 / 8, each launch synchronized and NaN-poisoned), the read ceilings `rd` / `hrd` excepted
/// (no product). Then timings by the DRAM method (CT W4A16 sym g128, bf16, rotating over 4
/// distinct weights, 20 launches back to back, median of 7), µs and fraction of the 1 GiB copy
/// of the same run, per shape the fraction of a copy of the weight's own byte count (`same`), at
/// 1 / 2 / 4 / 8 rows, PDL off then on (trigger after the main loop, the default).
/// `KILN_GEMV_BENCH=v1,v2,...` picks the builds (default: all of `W4_GEMV_VARIANTS`);
/// `KILN_BULK_BENCH_SHAPES` the shapes, as [`w4a16_gemv_bulk`]. Run (GPU machine):
/// `cuda_w4a16_bulk_bench-<hash> --ignored --exact --test-threads=1 --nocapture w4a16_gemv_builds`
#[test]
#[ignore = "needs a GPU: see the header"]
fn w4a16_gemv_builds() {
    use kiln::backend::cuda::{CudaBackend, W4_GEMV_VARIANTS};
    // Every build compiled (a backend compiles only the one that runs otherwise).
    std::env::set_var("KILN_W4_GEMV_BUILDS", "all");
    let mut b = gpu("bf16", "auto");
    println!("device: {}", b.name());
    if !b.set_w4_gemv("base") {
        println!("RESULT gemv5 the GEMV builds are not loaded (f32?): nothing to compare");
        return;
    }
    let names: Vec<String> = match std::env::var("KILN_GEMV_BENCH") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
        _ => W4_GEMV_VARIANTS.iter().map(|v| v.to_string()).collect(),
    };
    let label = |v: &str| {
        if v.is_empty() {
            "base".to_string()
        } else {
            v.to_string()
        }
    };
    // Bits: small and real shapes, three formats.
    let fmts = [
        (
            "sym",
            Fmt::Ct {
                group: 128,
                symmetric: true,
                act_order: false,
            },
        ),
        (
            "asym",
            Fmt::Ct {
                group: 128,
                symmetric: false,
                act_order: false,
            },
        ),
        ("nvfp4", Fmt::Nvfp4),
    ];
    let (mut same, mut all) = (0, 0);
    for (fi, (fname, fmt)) in fmts.iter().enumerate() {
        for (si, &(n, k)) in [(64usize, 1152usize), (17408, 5120), (5120, 17408)]
            .iter()
            .enumerate()
        {
            if *fname == "nvfp4" && si > 0 {
                continue; // NVFP4 on the small shape only (its fast variant is the G16 one)
            }
            let o = Owned::random(*fmt, n, k, 900 + 10 * fi as u64 + si as u64);
            let w = b
                .upload_linear("bits", &LinearView::Packed(o.linear()))
                .expect("upload");
            let x = b.upload(&data(8 * k, 7 + si as u64)).expect("x");
            for rows in [1usize, 3, 8] {
                let nan = vec![f32::NAN; rows * n];
                let mut base = Vec::new();
                for v in std::iter::once("").chain(names.iter().map(String::as_str)) {
                    if CudaBackend::w4_gemv_is_read_only(v) || !b.set_w4_gemv(v) {
                        continue;
                    }
                    let mut out = b.upload(&nan).expect("out");
                    b.matmul_w4_with(&x, rows, &w, &mut out, W4Kernel::Gemv)
                        .expect("gemv");
                    if let Err(e) = b.synchronize() {
                        println!(
                            "RESULT gemv5 FAULT {} {fname} N={n} K={k} rows={rows}: {e}",
                            label(v)
                        );
                        panic!("{} faulted", label(v));
                    }
                    let got = down(&b, &out, rows * n);
                    if v.is_empty() {
                        assert!(got.iter().all(|x| x.is_finite()), "base output not finite");
                        base = got;
                        continue;
                    }
                    all += 1;
                    if bits_equal(&got, &base) {
                        same += 1;
                    } else {
                        println!(
                            "RESULT gemv5 bits {} {fname} N={n} K={k} rows={rows} DIFFERS",
                            label(v)
                        );
                    }
                }
            }
        }
    }
    println!("RESULT gemv5 bits_equal_to_base={same}/{all}");
    assert_eq!(same, all, "a GEMV build's bits differ from the plain build");
    let copy = copy_bandwidth();
    println!("RESULT gemv5 copy_bandwidth_GBps={:.0}", copy / 1e9);
    let shapes: Vec<(usize, usize)> = match std::env::var("KILN_BULK_BENCH_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                let (n, k) = s.trim().split_once('x')?;
                Some((n.parse().ok()?, k.parse().ok()?))
            })
            .collect(),
        Err(_) => vec![(17408, 5120), (5120, 17408), (10240, 5120), (5120, 6144)],
    };
    for (i, &(n, k)) in shapes.iter().enumerate() {
        let ws: Vec<_> = (0..4u64)
            .map(|j| {
                let o = ct_g128(n, k, 700 + 10 * i as u64 + j);
                b.upload_linear("builds", &LinearView::Packed(o.linear()))
                    .expect("upload")
            })
            .collect();
        let x = b.upload(&data(8 * k, 19 + i as u64)).expect("x");
        let mut out = b.alloc(8 * n).expect("out");
        let bytes = b.weight_bytes(&ws[0]) as f64;
        let same_copy = 2.0 * bytes / same_size_copy_seconds(bytes as usize);
        println!(
            "RESULT gemv5 same_size_copy N={n} K={k} bytes={bytes:.0} of_1GiB_copy={:.3}",
            same_copy / copy
        );
        for (pdl_name, pdl) in [("pdl_off", false), ("pdl_on", true)] {
            b.set_pdl(pdl, true);
            for rows in [1usize, 2, 4, 8] {
                let mut line = String::new();
                for v in &names {
                    if !b.set_w4_gemv(v) {
                        continue;
                    }
                    let mut j = 0usize;
                    let t = time(&b, || {
                        j = (j + 1) % ws.len();
                        b.matmul_w4_with(&x, rows, &ws[j], &mut out, W4Kernel::Gemv)
                            .expect("gemv")
                    });
                    line += &format!(
                        " {}={:.2}us({:.3},{:.3})",
                        label(v),
                        t * 1e6,
                        bytes / t / copy,
                        bytes / t / same_copy
                    );
                }
                println!(
                    "RESULT gemv5 {pdl_name} N={n} K={k} rows={rows} us(of_copy,of_same){line}"
                );
            }
        }
    }
    b.set_pdl(true, true);
    b.set_w4_gemv("base");
}
