//! Long-context decode attention speed on a GPU (issue 8 item 7): the decode kernel
//! (kernels/attention_decode.cu) over the paged cache at 8K and 32K tokens of context per sequence
//! and 1 / 16 / 64 sequences, bf16 (fp16 on the sm_70 path) and fp8 e5m2 / e4m3 KV, against the
//! device-to-device copy bandwidth measured in the same run; and its cost per layer at short
//! contexts (150 and 1 000 keys, 1 / 16 / 64 rows) for each decode launch option
//! (`DecodeOptions`: the two-pass launch before, the single-pass rule, the in-launch merge, PDL).
//! A benchmark: it prints `RESULT` lines
//! and checks only that every output is finite (the numerics of this kernel are
//! `cuda_attention`'s; the ≥ 70 % target is read from the figures, docs/benchmarks.md).
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run`):
//! `cuda_long_context-<hash> --ignored --test-threads=1 --nocapture`
//! (`decode_kernel_registers_and_occupancy` alone: `cuda_long_context-<hash> --ignored --exact
//! decode_kernel_registers_and_occupancy --nocapture`; it honours `KILN_CUDA_ARCH`).
//!
//! `KILN_LONGCTX_ONLY=<label substring>[|<another>...]` limits the bandwidth test to rows matching
//! one of them (for a profiler; it also drops the short-context rows unless `KILN_LONGCTX_SHORT=1`).
//! `KILN_LONGCTX_LEAN=1` times, on the tensor-core rows, only the default launch on a backend built
//! with `KILN_DMMA_XPART=0` (`lctx_us`: the tensor-core kernel as main had it before branch
//! `lctx2`, its ring drained at each part's end) beside the default (`us`).
//!
//! Measurement switches of branch `lctx3` (each optional): `KILN_LONGCTX_CTX=<keys>,...` and
//! `KILN_LONGCTX_SEQS=<n>,...` replace the contexts (8192, 32768) and sequence counts (1, 16, 64);
//! `KILN_LONGCTX_PLAIN=1` times the default launch only (for a profiler);
//! `KILN_LONGCTX_TIMELINE=1` adds, on tensor-core rows, the kernel alone (`main_us`: the combine
//! not launched), the combine alone over the same partials (`combine_us`) and the default without
//! PDL (`no_pdl_us`); `KILN_LONGCTX_ALT=<label>:<VAR>=<value>[,<VAR>=<value>...]` builds a second
//! backend with those variables set and prints its default launch beside the default
//! (`<label>_us`, `<label>_of_copy`) on tensor-core rows, with the split
//! `KILN_LONGCTX_ALT_SPLIT=<min part>x<max parts>` when set; `KILN_LONGCTX_SAME_COPY=1` adds per
//! row a second ceiling, a device-to-device copy of the row's own K/V byte count timed like the
//! attention (20 back to back, median of 7): `copy_same_us`, and `of_same_copy` = the attention's
//! GB/s over that copy's (read + write, as `copy_gbps`).
//!
//! Rows on the tensor-core kernel (head_dim 128 / 256) also time, on the same data in the same
//! run, the launch before the tensor-core combine and PDL (`DecodeOptions::MMA_LEGACY`:
//! `legacy_us`); at 1 and 64 sequences the default without PDL (`no_pdl_us`) and, for bf16 and
//! e4m3 KV, the default with each other candidate split of the keys (`p<min part>x<max
//! parts>_us`, `DecodeSplit`); e4m3 KV also widened without the sm_89+ conversion instruction
//! (`KILN_DMMA_FP8_CVT=0`: `nocvt_us`, and with the launch before as well: `legacy_nocvt_us`, the
//! "before" of e4m3 rows, since `legacy_us` there runs this branch's widening).
//!
//! `fill_kernel_cache` needs no GPU: it compiles every module (the decode module for every
//! compute dtype and KV storage) for `$KILN_CUDA_ARCH` into `$KILN_KERNEL_CACHE`, so that a GPU
//! run with the same NVRTC version (e.g. the 12.9 of the sm_70 path) reads instead of compiling:
//! `KILN_CUDA_ARCH=compute_70 KILN_KERNEL_CACHE=<dir> cuda_long_context-<hash> --ignored --exact fill_kernel_cache`
//!
//! Bytes counted: every K and V element of every sequence's context, once (`2 · ctx · kv_heads ·
//! head_dim · elem` per sequence and layer): what the kernel must read at least. The shapes are
//! SmolLM2-135M's attention (9 query heads over 3 KV heads, head_dim 64), a Qwen3-like 32 / 8 ×
//! 128 and Qwen3.5-27B's gated attention (24 / 4 × 256). Times are per call with 20 calls queued
//! back to back (launch latency included, as in an eager decode step).
//! Zero-filled K/V: the bytes read are the same whatever they hold.
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
use kiln::backend::cuda::attention_plan::{
    DecodeOptions, DecodeSplit, DecodeVariant, MmaLaunch, DECODE_THREADS,
};
use kiln::backend::cuda::kernel_cache::KernelCache;
use kiln::backend::cuda::{nvrtc, Arch, KernelModule};
use kiln::backend::{AttentionParams, Backend, KvCacheSpec, StepInput, StepSeq};

/// GB/s of a device-to-device copy of `bytes` (read + write counted), median of 10.
fn copy_gbps(bytes: usize) -> f64 {
    let ctx = cudarc::driver::CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let src = stream.alloc_zeros::<u8>(bytes).expect("alloc");
    let mut dst = stream.alloc_zeros::<u8>(bytes).expect("alloc");
    stream.memcpy_dtod(&src, &mut dst).expect("copy");
    stream.synchronize().expect("sync");
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        stream.memcpy_dtod(&src, &mut dst).expect("copy");
        stream.synchronize().expect("sync");
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    2.0 * bytes as f64 / times[5] / 1e9
}

/// Seconds per device-to-device copy of `bytes` with 20 copies queued back to back, median of 7
/// (the timing method of the attention calls): the ceiling of `KILN_LONGCTX_SAME_COPY=1` for a
/// cell's own byte count (at 8K keys and one row its K/V fits the L2, as the attention's does).
fn copy_seconds(bytes: usize) -> f64 {
    let ctx = cudarc::driver::CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let src = stream.alloc_zeros::<u8>(bytes).expect("alloc");
    let mut dst = stream.alloc_zeros::<u8>(bytes).expect("alloc");
    let reps = 20;
    let mut run = || {
        for _ in 0..reps {
            stream.memcpy_dtod(&src, &mut dst).expect("copy");
        }
        stream.synchronize().expect("sync");
    };
    run();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[3]
}

/// Which decode attention a timing runs.
#[derive(Clone, Copy)]
enum Mode {
    /// `paged_attention` (the decode kernel, default options).
    Default,
    /// The older split-K kernels of attention.cu.
    Legacy,
    /// The decode kernel launched with these options.
    With(DecodeOptions),
}

/// Seconds per `paged_attention` call over `seqs` decode rows of `ctx` tokens each (median of
/// 7 runs of `reps` calls queued back to back).
fn attention_seconds(
    b: &kiln::backend::cuda::CudaBackend,
    seqs: usize,
    ctx: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    mode: Mode,
) -> f64 {
    let block = 16;
    let per_seq = ctx.div_ceil(block);
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks: seqs * per_seq,
        block_size: block,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let mut cache = b.create_kv_cache(&spec).expect("cache");
    let input = StepInput {
        token_ids: vec![0; seqs],
        positions: vec![(ctx - 1) as u32; seqs],
        slot_mapping: (0..seqs)
            .map(|i| ((i * per_seq) * block + ctx - 1) as u32)
            .collect(),
        seqs: (0..seqs)
            .map(|i| StepSeq {
                token_start: i,
                len: 1,
                cached_len: ctx - 1,
                block_table: ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect(),
                state_slot: None,
            })
            .collect(),
        logit_rows: (0..seqs as u32).collect(),
        block_size: block,
    };
    let step = b.prepare_step(&input).expect("step");
    let q = b.upload(&data(seqs * heads * head_dim, 3)).expect("q");
    let k = b.upload(&data(seqs * kv_heads * head_dim, 4)).expect("k");
    let mut out = b.alloc(seqs * heads * head_dim).expect("out");
    b.write_kv(&mut cache, 0, &k, &k, &step).expect("write");
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    let reps = 20;
    let mut run = || {
        for _ in 0..reps {
            match mode {
                Mode::Legacy => {
                    b.paged_attention_legacy_decode(&q, &cache, 0, &step, &params, &mut out)
                }
                Mode::Default => b.paged_attention(&q, &cache, 0, &step, &params, &mut out),
                Mode::With(o) => {
                    b.paged_attention_decode_with(&q, &cache, 0, &step, &params, &mut out, o)
                }
            }
            .expect("attention");
        }
        b.synchronize().expect("sync");
    };
    run();
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    // The kernel ran over the whole context: every output is finite (q·k over written keys
    // and zero keys alike); not checked when a measurement launched one half only.
    let half = matches!(mode, Mode::With(o) if o.mma_only.is_some());
    let got = down(b, &out, seqs * heads * head_dim);
    assert!(
        half || got.iter().all(|v| v.is_finite()),
        "non-finite attention output"
    );
    times[3]
}

#[test]
#[ignore = "needs a GPU: see the header"]
fn long_context_decode_attention_reads_kv_near_copy_bandwidth() {
    let copy = copy_gbps(1 << 30);
    println!("RESULT long_context copy_gbps={copy:.0} (1 GiB device-to-device, read + write)");
    let wide = if dtypes().contains(&"bf16") {
        "bf16"
    } else {
        "fp16"
    };
    // `KILN_LONGCTX_ONLY=<substring>`: only the long-context rows whose label ("heads=24/4x256
    // ctx=32768 seqs=16 kv=auto") contains it, no short-context rows and no older kernel (to put
    // one shape under a profiler).
    let only = std::env::var("KILN_LONGCTX_ONLY").ok();
    // `KILN_LONGCTX_LEAN=1`: on the tensor-core rows only this branch's before / after columns
    // (not the older launches, splits and widenings), to fit a short GPU call.
    let lean = std::env::var("KILN_LONGCTX_LEAN").is_ok_and(|v| v == "1");
    let matches = |label: &str| {
        only.as_ref()
            .is_none_or(|o| o.split('|').any(|x| label.contains(x)))
    };
    // Candidate splits for the tensor-core kernel (the default's is printed as `us`).
    let splits =
        [(128usize, 128usize), (128, 64), (128, 32), (256, 64)].map(|(min_part, max_parts)| {
            DecodeSplit {
                min_part,
                max_parts,
            }
        });
    let list = |var: &str, default: &[usize]| -> Vec<usize> {
        std::env::var(var).map_or(default.to_vec(), |v| {
            v.split(',').map(|x| x.trim().parse().expect(var)).collect()
        })
    };
    let ctxs = list("KILN_LONGCTX_CTX", &[8192, 32768]);
    let seq_counts = list("KILN_LONGCTX_SEQS", &[1, 16, 64]);
    let plain = std::env::var("KILN_LONGCTX_PLAIN").is_ok_and(|v| v == "1");
    let timeline = std::env::var("KILN_LONGCTX_TIMELINE").is_ok_and(|v| v == "1");
    let same_copy = std::env::var("KILN_LONGCTX_SAME_COPY").is_ok_and(|v| v == "1");
    // `KILN_LONGCTX_ALT=<label>:<VAR>=<value>,...`: (label, assignments).
    let alt_spec = std::env::var("KILN_LONGCTX_ALT").ok().map(|v| {
        let (label, vars) = v
            .split_once(':')
            .expect("KILN_LONGCTX_ALT=<label>:<VAR>=<value>,...");
        let vars: Vec<(String, String)> = vars
            .split(',')
            .map(|a| {
                let (k, x) = a.split_once('=').expect("<VAR>=<value>");
                (k.trim().to_string(), x.trim().to_string())
            })
            .collect();
        (label.to_string(), vars)
    });
    // `KILN_LONGCTX_ALT_SPLIT=<min part>x<max parts>`: the alternative backend's launches with
    // that split of the keys (`DecodeSplit`) instead of the per-shape default.
    let alt_split = std::env::var("KILN_LONGCTX_ALT_SPLIT").ok().map(|v| {
        let (a, b) = v.split_once('x').expect("<min part>x<max parts>");
        DecodeSplit {
            min_part: a.parse().expect("min part"),
            max_parts: b.parse().expect("max parts"),
        }
    });
    for kv in ["auto", "fp8_e5m2", "fp8_e4m3"] {
        // Skip a KV type no selected row can use (every entry names a `kv=` prefix, none of kv).
        if only.as_ref().is_some_and(|o| {
            o.split('|').all(|x| {
                x.split_once("kv=")
                    .is_some_and(|(_, v)| !kv.starts_with(v.trim_end()))
            })
        }) {
            continue;
        }
        let b = gpu(wide, kv);
        let alt = alt_spec.as_ref().map(|(label, vars)| {
            // Each variable set for the alternative backend, then put back as it was (a value
            // exported for the whole run stays the default backend's).
            let was: Vec<Option<String>> =
                vars.iter().map(|(k, _)| std::env::var(k).ok()).collect();
            for (k, x) in vars {
                std::env::set_var(k, x);
            }
            let c = gpu(wide, kv);
            for ((k, _), w) in vars.iter().zip(was) {
                match w {
                    Some(w) => std::env::set_var(k, w),
                    None => std::env::remove_var(k),
                }
            }
            (label.clone(), c)
        });
        // e4m3 also without the tensor-core kernel's hardware widening (`KILN_DMMA_FP8_CVT=0`).
        let cvt = (kv == "fp8_e4m3" && !lean && !plain).then(|| {
            std::env::set_var("KILN_DMMA_FP8_CVT", "0");
            let c = gpu(wide, kv);
            std::env::remove_var("KILN_DMMA_FP8_CVT");
            c
        });
        let elem = if kv == "auto" { 2 } else { 1 };
        // Lean runs: a backend whose tensor-core kernel drains its ring at each part's end
        // (`KILN_DMMA_XPART=0`), for the "before" of branch `lctx2`.
        let no_xpart = lean.then(|| {
            std::env::set_var("KILN_DMMA_XPART", "0");
            let c = gpu(wide, kv);
            std::env::remove_var("KILN_DMMA_XPART");
            c
        });
        // Short context (SmolLM2's ~150 keys; 1 000): launch and latency bound. "two_pass" is
        // the decode launch before the single-pass rule, the in-launch merge and PDL
        // (DecodeOptions::TWO_PASS); "single" adds the single-pass rule only; "merge" the
        // single-pass rule and the in-launch merge without PDL; "pdl_no_prefetch" those with PDL
        // but no K/V staged before the wait; "now" the default launch (all four); "attention_cu" the older split-K kernel (attention.cu). Same data, same run.
        // `KILN_LONGCTX_SHORT=1` keeps them with a filter set.
        let keep_short = std::env::var("KILN_LONGCTX_SHORT").is_ok_and(|v| v == "1");
        let short: &[usize] = if only.is_some() && !keep_short {
            &[]
        } else {
            &[150, 1000]
        };
        let single = DecodeOptions {
            pdl: false,
            merge_in_launch: false,
            ..DecodeOptions::default()
        };
        let merge = DecodeOptions {
            pdl: false,
            ..DecodeOptions::default()
        };
        let no_prefetch = DecodeOptions {
            prefetch: false,
            ..DecodeOptions::default()
        };
        for &ctx in short {
            for seqs in [1usize, 16, 64] {
                let t = |m| attention_seconds(&b, seqs, ctx, 9, 3, 64, m) * 1e6;
                let (two, one, mer, pdl, now) = (
                    t(Mode::With(DecodeOptions::TWO_PASS)),
                    t(Mode::With(single)),
                    t(Mode::With(merge)),
                    t(Mode::With(no_prefetch)),
                    t(Mode::Default),
                );
                let old = if seqs == 1 { t(Mode::Legacy) } else { f64::NAN };
                println!(
                    "RESULT short_context heads=9/3x64 ctx={ctx} seqs={seqs} dtype={wide} kv={kv} us_per_layer={now:.1} two_pass_us={two:.1} single_us={one:.1} merge_us={mer:.1} pdl_no_prefetch_us={pdl:.1} attention_cu_us={old:.1}"
                );
            }
        }
        // SmolLM2, a Qwen3-like 32/8 × 128 and the Qwen3.5-27B gated-attention layers 24/4 × 256.
        for (heads, kv_heads, hd) in [(9, 3, 64), (32, 8, 128), (24, 4, 256)] {
            for &ctx in &ctxs {
                for &seqs in &seq_counts {
                    let label =
                        format!("heads={heads}/{kv_heads}x{hd} ctx={ctx} seqs={seqs} kv={kv}");
                    if !matches(&label) {
                        continue;
                    }
                    let secs = attention_seconds(&b, seqs, ctx, heads, kv_heads, hd, Mode::Default);
                    let bytes = (2 * seqs * ctx * kv_heads * hd * elem) as f64;
                    let gbps = bytes / secs / 1e9;
                    // The tensor-core kernel's launch before this branch, and the variants.
                    let mut mma = String::new();
                    if same_copy {
                        // A copy of the cell's own K/V byte count (read + write counted, as the
                        // 1 GiB figure): the attention's GB/s against it.
                        let c = copy_seconds(bytes as usize);
                        mma += &format!(
                            " copy_same_us={:.1} of_same_copy={:.0}%",
                            c * 1e6,
                            100.0 * gbps / (2.0 * bytes / c / 1e9)
                        );
                    }
                    let on_mma = b.uses_decode_mma(hd, heads / kv_heads);
                    if let Some((label, c)) = alt.as_ref().filter(|_| on_mma) {
                        let mode = alt_split.map_or(Mode::Default, |s| {
                            Mode::With(DecodeOptions {
                                mma_split: Some(s),
                                ..DecodeOptions::default()
                            })
                        });
                        let v = attention_seconds(c, seqs, ctx, heads, kv_heads, hd, mode);
                        mma += &format!(
                            " {label}_us={:.1} {label}_of_copy={:.0}%",
                            v * 1e6,
                            100.0 * bytes / v / 1e9 / copy
                        );
                    }
                    if timeline && on_mma {
                        let t = |o| {
                            attention_seconds(&b, seqs, ctx, heads, kv_heads, hd, Mode::With(o))
                                * 1e6
                        };
                        let only = |l| DecodeOptions {
                            mma_only: Some(l),
                            ..DecodeOptions::default()
                        };
                        let (main, comb) = (t(only(MmaLaunch::Main)), t(only(MmaLaunch::Combine)));
                        let no_pdl = t(DecodeOptions {
                            pdl: false,
                            prefetch: false,
                            ..DecodeOptions::default()
                        });
                        mma += &format!(
                            " main_us={main:.1} combine_us={comb:.1} no_pdl_us={no_pdl:.1}"
                        );
                    }
                    if !plain && lean && on_mma {
                        // `KILN_LONGCTX_LEAN=1`: the default launch on a backend whose kernel
                        // drains its ring at each part's end (main's before branch `lctx2`).
                        let nx = no_xpart.as_ref().expect("lean backend");
                        let lctx =
                            attention_seconds(nx, seqs, ctx, heads, kv_heads, hd, Mode::Default);
                        mma += &format!(
                            " lctx_us={:.1} lctx_of_copy={:.0}% speedup={:.2}",
                            lctx * 1e6,
                            100.0 * bytes / lctx / 1e9 / copy,
                            lctx / secs
                        );
                    } else if !plain && on_mma {
                        let t = |o| {
                            attention_seconds(&b, seqs, ctx, heads, kv_heads, hd, Mode::With(o))
                        };
                        let legacy = t(DecodeOptions::MMA_LEGACY);
                        mma += &format!(
                            " legacy_us={:.1} legacy_of_copy={:.0}% speedup={:.2}",
                            legacy * 1e6,
                            100.0 * bytes / legacy / 1e9 / copy,
                            legacy / secs
                        );
                        if let Some(c) = &cvt {
                            let v =
                                attention_seconds(c, seqs, ctx, heads, kv_heads, hd, Mode::Default);
                            // The launch and the widening before this branch together.
                            let w = attention_seconds(
                                c,
                                seqs,
                                ctx,
                                heads,
                                kv_heads,
                                hd,
                                Mode::With(DecodeOptions::MMA_LEGACY),
                            );
                            mma += &format!(
                                " nocvt_us={:.1} nocvt_of_copy={:.0}% legacy_nocvt_us={:.1} legacy_nocvt_of_copy={:.0}%",
                                v * 1e6,
                                100.0 * bytes / v / 1e9 / copy,
                                w * 1e6,
                                100.0 * bytes / w / 1e9 / copy
                            );
                        }
                        if seqs != 16 {
                            let no_pdl = t(DecodeOptions {
                                pdl: false,
                                prefetch: false,
                                ..DecodeOptions::default()
                            });
                            mma += &format!(" no_pdl_us={:.1}", no_pdl * 1e6);
                        }
                        if seqs != 16 && kv != "fp8_e5m2" {
                            let own = DecodeSplit::for_shape(kv_heads, hd, elem);
                            for s in splits.iter().filter(|&&s| s != own) {
                                let v = t(DecodeOptions {
                                    mma_split: Some(*s),
                                    ..DecodeOptions::default()
                                });
                                mma +=
                                    &format!(" p{}x{}_us={:.1}", s.min_part, s.max_parts, v * 1e6);
                            }
                        }
                    }
                    // The older kernel once per shape and context (it is slow: 16 rows only).
                    let before = if seqs == 16 && kv != "fp8_e4m3" && only.is_none() && !plain {
                        let old =
                            attention_seconds(&b, seqs, ctx, heads, kv_heads, hd, Mode::Legacy);
                        format!(" before_gbps={:.0}", bytes / old / 1e9)
                    } else {
                        String::new()
                    };
                    println!(
                        "RESULT long_context heads={heads}/{kv_heads}x{hd} ctx={ctx} seqs={seqs} \
                         dtype={wide} kv={kv} us={:.1} kv_mb={:.1} gbps={gbps:.0} of_copy={:.0}%{before}{mma}",
                        secs * 1e6,
                        bytes / 1e6,
                        100.0 * gbps / copy
                    );
                }
            }
        }
    }
}

/// What the driver says about every decode kernel variant as this device loads it (registers per
/// thread, local memory per thread, static shared memory, resident blocks per SM at
/// `DECODE_THREADS` threads): the occupancy behind the bandwidth figures. Fails when a variant
/// spills to local memory or fits fewer than 2 blocks per SM.
#[test]
#[ignore = "needs a GPU: see the header"]
fn decode_kernel_registers_and_occupancy() {
    let ctx = cudarc::driver::CudaContext::new(0).expect("context");
    let (major, minor) = ctx.compute_capability().expect("compute capability");
    let arch = arch_override().unwrap_or(Arch::from_compute_capability(major as u32, minor as u32));
    let include = nvrtc::find_include_dir(None).expect("headers");
    let cache = KernelCache::from_env();
    let wide = if dtypes().contains(&"bf16") {
        "bf16"
    } else {
        "f16"
    };
    let mut bad = Vec::new();
    for c in ["same", "e5m2", "e4m3"] {
        let m = KernelModule::AttentionDecode;
        let (image, _) = nvrtc::load_or_compile(
            m,
            arch,
            &include,
            cache.as_ref(),
            false,
            &m.defines(wide, c),
        )
        .expect("compile attention_decode.cu");
        let module = ctx.load_module(nvrtc::to_cudarc(image)).expect("load");
        for v in DecodeVariant::all() {
            let name = v.kernel_name(wide, c);
            let f = module.load_function(&name).expect("entry point");
            let regs = f.num_regs().expect("attr");
            let local = f.local_size_bytes().expect("attr");
            let smem = f.shared_size_bytes().expect("attr");
            let blocks = f
                .occupancy_max_active_blocks_per_multiprocessor(DECODE_THREADS, 0, None)
                .expect("occupancy");
            println!(
                "RESULT decode_kernel arch={arch} name={name} regs={regs} local_bytes={local} \
                 static_smem={smem} blocks_per_sm={blocks} warps_per_sm={}",
                blocks * DECODE_THREADS / 32
            );
            if local > 0 || blocks < 2 {
                bad.push(format!("{name}: local {local} B, {blocks} blocks/SM"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Compiles every kernel module for `$KILN_CUDA_ARCH` into `$KILN_KERNEL_CACHE` (no GPU needed;
/// see the header). Checks that every entry then reads back from the cache.
#[test]
#[ignore = "a helper for GPU runs: see the header"]
fn fill_kernel_cache() {
    let arch = arch_override().expect("KILN_CUDA_ARCH");
    let cache = KernelCache::from_env().expect("KILN_KERNEL_CACHE");
    let include = nvrtc::find_include_dir(None).expect("headers");
    let dtypes: &[&str] = if arch.major >= 8 {
        &["f32", "f16", "bf16"]
    } else {
        &["f32", "f16"]
    };
    // `KILN_FILL_ONLY=<file>:<dtype>` (e.g. `attention_decode_mma.cu:bf16`): only that module
    // for that compute dtype (to add a variant built with other switches).
    let fill_only = std::env::var("KILN_FILL_ONLY").ok();
    let dtypes: Vec<&str> = match fill_only.as_deref().and_then(|f| f.split_once(':')) {
        Some((_, t)) => dtypes.iter().copied().filter(|d| *d == t).collect(),
        None => dtypes.to_vec(),
    };
    let mut jobs = Vec::new();
    for m in KernelModule::ALL {
        if fill_only
            .as_deref()
            .is_some_and(|f| !f.starts_with(&format!("{}:", m.file_name())))
        {
            continue;
        }
        if m.defines("f32", "same").is_empty() {
            jobs.push((m, Vec::new()));
        } else {
            for t in &dtypes {
                for c in ["same", "e5m2", "e4m3"] {
                    jobs.push((m, m.defines(t, c)));
                }
            }
        }
    }
    std::thread::scope(|s| {
        for (m, defines) in &jobs {
            let (include, cache) = (&include, &cache);
            s.spawn(move || {
                nvrtc::load_or_compile(*m, arch, include, Some(cache), false, defines)
                    .expect("compile");
            });
        }
    });
    for (m, defines) in &jobs {
        let (_, source) =
            nvrtc::load_or_compile(*m, arch, &include, Some(&cache), false, defines).expect("read");
        assert_eq!(
            source,
            nvrtc::Source::Cache,
            "{} {defines:?}",
            m.file_name()
        );
    }
    println!(
        "RESULT fill_kernel_cache arch={arch} entries={}",
        jobs.len()
    );
}
