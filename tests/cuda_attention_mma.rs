//! The tensor-core decode attention kernel (kernels/attention_decode_mma.cu, sm_80+, 16-bit
//! compute) on a GPU: against the CPU backend (f32) at head dims 64 / 128 / 256, GQA groups 1 / 3 /
//! 4 / 6 / 8, contexts on both sides of the part boundaries, bf16 / fp8 e5m2 / e4m3 KV, with and
//! without Qwen3.5's fused sigmoid gate; a row's bits against the same row in another batch; its
//! launch options (PDL, the prefetch before the wait, the split of the keys, the e4m3 widening)
//! against each other bit for bit and against the CPU;
//! and its speed over the long-context table of `cuda_long_context` (8K / 32K keys × 1 / 16 / 64
//! sequences), with the older decode kernel (`KILN_DECODE_MMA=0`) and the copy bandwidth in the
//! same run.
//!
//! Run on the GPU machine (built here with `cargo test --release --features cuda --no-run --test
//! cuda_attention_mma`): `cuda_attention_mma-<hash> --ignored --test-threads=1 --nocapture`.
//! (`mma_decode_matches_the_cpu_backend` needs more than 42 s on the H200 machine: 54 cases, each
//! with its CPU reference; the bench ~35 s.) The launch options and splits alone (~10 s with the
//! kernels cached): `cuda_attention_mma-<hash> --ignored --exact
//! mma_decode_launch_options_and_splits --nocapture`.
//! `fill_kernel_cache_bf16_f16` (no GPU) fills `$KILN_KERNEL_CACHE` for `$KILN_CUDA_ARCH` with
//! what these tests load: `KILN_CUDA_ARCH=sm_90 KILN_KERNEL_CACHE=<dir> cuda_attention_mma-<hash>
//! --ignored --exact fill_kernel_cache_bf16_f16`.
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
use kiln::backend::cuda::attention_plan::{DecodeOptions, DecodeSplit};
use kiln::backend::cuda::backend::OutputGate;
use kiln::backend::cuda::kernel_cache::KernelCache;
use kiln::backend::cuda::{nvrtc, CudaBackend, KernelModule};
use kiln::backend::{AttentionParams, Backend, CpuBackend, KvCacheDType, KvCacheSpec, PinnedShape};
use kiln::backend::{StepInput, StepSeq};

/// Decode rows of one step: every sequence has `ctx - 1` cached keys and one new token. 128 / 129
/// and 8192 / 8193 cross a part boundary (parts of 128 keys up to 16 384); 16 385 has parts of 192.
const CONTEXTS: [usize; 11] = [1, 15, 16, 17, 128, 129, 300, 1000, 4097, 8193, 16385];

/// One decode step over `ctxs` on backend `b`: (cache, step, q, gate, params). K, V, q and gate
/// are seeded by (seed, position in their buffers); K/V pre-rounded to the cache's storage.
struct Setup<B: Backend> {
    cache: B::KvCache,
    step: B::Step,
    /// The decode step's input (to pin the step to a graph's context).
    input: StepInput,
    q: B::Buffer,
    gate: Vec<f32>,
    gate_buf: B::Buffer,
    params: AttentionParams,
}

fn setup<B: Backend>(
    b: &B,
    ctxs: &[usize],
    heads: usize,
    kv_heads: usize,
    hd: usize,
    kv: &str,
) -> Setup<B> {
    let block = 16;
    let storage = KvCacheDType::parse(kv).expect("kv");
    let per: Vec<usize> = ctxs.iter().map(|c| c.div_ceil(block)).collect();
    let num_blocks: usize = per.iter().sum();
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks,
        block_size: block,
        num_kv_heads: kv_heads,
        head_dim: hd,
    };
    let mut cache = b.create_kv_cache(&spec).expect("cache");
    // Blocks in reverse order per sequence (a table that is not the identity).
    let mut first = 0;
    let tables: Vec<Vec<u32>> = per
        .iter()
        .map(|&n| {
            let t: Vec<u32> = (first..first + n).rev().map(|x| x as u32).collect();
            first += n;
            t
        })
        .collect();
    let step_of = |prefix: bool| {
        let mut seqs = Vec::new();
        let (mut tok, mut positions, mut slots) = (0usize, Vec::new(), Vec::new());
        for (i, &ctx) in ctxs.iter().enumerate() {
            let (cached, len) = if prefix { (0, ctx - 1) } else { (ctx - 1, 1) };
            for p in cached..cached + len {
                positions.push(p as u32);
                slots.push(tables[i][p / block] * block as u32 + (p % block) as u32);
            }
            seqs.push(StepSeq {
                token_start: tok,
                len,
                cached_len: cached,
                block_table: tables[i].clone(),
                state_slot: None,
            });
            tok += len;
        }
        StepInput {
            token_ids: vec![0; tok],
            positions,
            slot_mapping: slots,
            seqs,
            logit_rows: vec![],
            block_size: block,
        }
    };
    let row = kv_heads * hd;
    let kvv = |n: usize, seed: u64| -> Vec<f32> {
        data(n, seed)
            .into_iter()
            .map(|v| storage.round(v))
            .collect()
    };
    let prefix = step_of(true);
    let np = prefix.token_ids.len();
    if np > 0 {
        let ps = b.prepare_step(&prefix).expect("prefix step");
        let k = b.upload(&kvv(np * row, 31)).unwrap();
        let v = b.upload(&kvv(np * row, 32)).unwrap();
        b.write_kv(&mut cache, 0, &k, &v, &ps).unwrap();
    }
    let input = step_of(false);
    let t = input.token_ids.len();
    let step = b.prepare_step(&input).expect("step");
    let k = b.upload(&kvv(t * row, 33)).unwrap();
    let v = b.upload(&kvv(t * row, 34)).unwrap();
    b.write_kv(&mut cache, 0, &k, &v, &step).unwrap();
    let n = t * heads * hd;
    let qv: Vec<f32> = data(n, 35).iter().map(|x| 2.0 * x).collect();
    let gate: Vec<f32> = data(n, 36).iter().map(|x| 3.0 * x).collect();
    Setup {
        cache,
        step,
        input,
        q: b.upload(&qv).unwrap(),
        gate_buf: b.upload(&gate).unwrap(),
        gate,
        params: AttentionParams {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        },
    }
}

fn attend<B: Backend>(b: &B, s: &Setup<B>) -> Vec<f32> {
    let n = s.step_tokens() * s.params.num_heads * s.params.head_dim;
    let mut out = b.upload(&vec![f32::NAN; n]).unwrap();
    b.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out)
        .unwrap();
    down(b, &out, n)
}

impl<B: Backend> Setup<B> {
    fn step_tokens(&self) -> usize {
        self.gate.len() / (self.params.num_heads * self.params.head_dim)
    }
}

fn gated_cuda(g: &CudaBackend, s: &Setup<CudaBackend>) -> Vec<f32> {
    let n = s.gate.len();
    let mut out = g.upload(&vec![f32::NAN; n]).unwrap();
    let gate = OutputGate::contiguous(&s.gate_buf, &s.params);
    g.paged_attention_gated(&s.q, gate, &s.cache, 0, &s.step, &s.params, &mut out)
        .unwrap();
    down(g, &out, n)
}

fn wide_dtypes() -> Vec<&'static str> {
    dtypes().into_iter().filter(|d| *d != "f32").collect()
}

/// The new kernel against the CPU backend on every (head dim, group, KV storage, 16-bit dtype),
/// every context of [`CONTEXTS`] as a row of one step; the gated output against the CPU's
/// attention · sigmoid(gate); the 8 193-key row alone against the same row in the batch, bit for
/// bit. Fails when the device is sm_80+ and the shapes did not take the tensor-core kernel.
#[test]
#[ignore = "needs a GPU: see the header"]
fn mma_decode_matches_the_cpu_backend() {
    // Every width takes the tensor-core kernel by default now (`KILN_DECODE_MMA=128` would keep
    // width 64 on attention_decode.cu); `all` is set so this test checks it at every width whatever
    // the default.
    std::env::set_var("KILN_DECODE_MMA", "all");
    let cpu = CpuBackend::new(0).expect("cpu");
    let shapes = [
        (4, 4, 64),
        (9, 3, 64),
        (8, 1, 64),
        (16, 4, 128),
        (24, 4, 128),
        (8, 8, 128),
        (24, 4, 256),
        (9, 3, 256),
        (16, 2, 256),
    ];
    let mut failures = Vec::new();
    for kv in ["auto", "fp8_e5m2", "fp8_e4m3"] {
        // The CPU's outputs (plain and gated) per shape, then every 16-bit dtype on one backend.
        let wants: Vec<(Vec<f32>, Vec<f32>)> = shapes
            .iter()
            .map(|&(heads, kv_heads, hd)| {
                let cs = setup(&cpu, &CONTEXTS, heads, kv_heads, hd, kv);
                let want = attend(&cpu, &cs);
                let gated = want
                    .iter()
                    .zip(&cs.gate)
                    .map(|(a, g)| a * (1.0 / (1.0 + (-g).exp())))
                    .collect();
                (want, gated)
            })
            .collect();
        for dtype in wide_dtypes() {
            let g = gpu(dtype, kv);
            for (&(heads, kv_heads, hd), (want, want_gated)) in shapes.iter().zip(&wants) {
                let group = heads / kv_heads;
                let used = g.uses_decode_mma(hd, group);
                let gs = setup(&g, &CONTEXTS, heads, kv_heads, hd, kv);
                let got = attend(&g, &gs);
                let got_gated = gated_cuda(&g, &gs);
                let limit = tol(dtype);
                let row = heads * hd;
                let per_ctx: Vec<String> = CONTEXTS
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let r = i * row..(i + 1) * row;
                        format!("{c}:{:.1e}", max_diff(&want[r.clone()], &got[r]))
                    })
                    .collect();
                let d = max_diff(want, &got);
                let dg = max_diff(want_gated, &got_gated);
                let ok = d <= limit
                    && dg <= limit
                    && got.iter().chain(&got_gated).all(|v| v.is_finite());
                println!(
                    "RESULT mma_decode heads={heads}/{kv_heads}x{hd} dtype={dtype} kv={kv} mma={used} max_abs_diff={d:.3e} gated={dg:.3e} tol={limit:.0e} per_ctx=[{}] {}",
                    per_ctx.join(" "),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{heads}/{kv_heads}x{hd} {dtype} {kv}: {d} / {dg}"));
                }
                if !used {
                    failures.push(format!(
                        "{heads}/{kv_heads}x{hd} {dtype} {kv}: not on the tensor-core kernel"
                    ));
                }
                // The 8 193-key row alone equals its row in a batch that starts with it (same
                // data: both setups seed by position, and the row is first in both).
                let alone = setup(&g, &[8193], heads, kv_heads, hd, kv);
                let with = setup(&g, &[8193, 300, 17, 16385], heads, kv_heads, hd, kv);
                let (a, w) = (attend(&g, &alone), attend(&g, &with));
                let same = a
                    .iter()
                    .zip(&w[..row])
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                println!("RESULT mma_decode_batch_invariance heads={heads}/{kv_heads}x{hd} dtype={dtype} kv={kv} bit_identical={same}");
                if !same {
                    failures.push(format!(
                        "{heads}/{kv_heads}x{hd} {dtype} {kv}: batch invariance"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Splits the launch tests and the speed table compare: the default and the candidates for it.
const SPLITS: [(&str, DecodeSplit); 7] = [
    ("p128x128", DecodeSplit::OLD),
    (
        "p128x64",
        DecodeSplit {
            min_part: 128,
            max_parts: 64,
        },
    ),
    (
        "p128x32",
        DecodeSplit {
            min_part: 128,
            max_parts: 32,
        },
    ),
    (
        "p128x96",
        DecodeSplit {
            min_part: 128,
            max_parts: 96,
        },
    ),
    (
        "p128x256",
        DecodeSplit {
            min_part: 128,
            max_parts: 256,
        },
    ),
    (
        "p64x256",
        DecodeSplit {
            min_part: 64,
            max_parts: 256,
        },
    ),
    (
        "p256x128",
        DecodeSplit {
            min_part: 256,
            max_parts: 128,
        },
    ),
];

/// The tensor-core kernel's launch options (`DecodeOptions`) on the 128- and 256-wide shapes,
/// bf16 and e4m3 KV, rows of 1 … 20 000 keys: the default launch (PDL, prefetch before the wait,
/// the tensor-core combine, the per-shape split) twice, without the prefetch, without PDL
/// (`TWO_PASS`), with the step pinned to a 32K context (a graph's shapes) and with the per-shape
/// split named explicitly — the same bits every time; every split of [`SPLITS`] (default launch
/// and `TWO_PASS`, same bits) and the launch before this branch (`MMA_LEGACY`) against the CPU
/// backend; the gated output of the default launch against the CPU's attention ·
/// sigmoid(gate); e4m3 widened without the sm_89+ conversion (`KILN_DMMA_FP8_CVT=0`) and the kernel
/// built with the per-row chunk copies and the scalar merge (`KILN_DMMA_ISSUE=generic`,
/// `KILN_DMMA_VEC_MERGE=0`) and every launch on the paired entry points and none
/// (`KILN_DMMA_PAIR_ROWS=1000000` / `0`) against the default, bit for bit. Fails when the shapes did not take
/// the tensor-core kernel.
#[test]
#[ignore = "needs a GPU: see the header"]
fn mma_decode_launch_options_and_splits() {
    let cpu = CpuBackend::new(0).expect("cpu");
    let ctxs = [1usize, 150, 256, 257, 1000, 8193, 20000];
    let mut failures = Vec::new();
    for (heads, kv_heads, hd) in [(32, 8, 128), (24, 4, 256)] {
        for kv in ["auto", "fp8_e4m3"] {
            let cs = setup(&cpu, &ctxs, heads, kv_heads, hd, kv);
            let want = attend(&cpu, &cs);
            let want_gated: Vec<f32> = want
                .iter()
                .zip(&cs.gate)
                .map(|(a, g)| a * (1.0 / (1.0 + (-g).exp())))
                .collect();
            let g = gpu("bf16", kv);
            if !g.uses_decode_mma(hd, heads / kv_heads) {
                failures.push(format!(
                    "{heads}/{kv_heads}x{hd} {kv}: not on the tensor-core kernel"
                ));
                continue;
            }
            let mut gs = setup(&g, &ctxs, heads, kv_heads, hd, kv);
            let n = want.len();
            let run = |s: &Setup<CudaBackend>, o: Option<DecodeOptions>| {
                let mut out = g.upload(&vec![f32::NAN; n]).unwrap();
                match o {
                    Some(o) => g.paged_attention_decode_with(
                        &s.q, &s.cache, 0, &s.step, &s.params, &mut out, o,
                    ),
                    None => g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out),
                }
                .unwrap();
                down(&g, &out, n)
            };
            let same = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() && x.is_finite())
            };
            let limit = tol("bf16");
            let label = format!("heads={heads}/{kv_heads}x{hd} kv={kv}");
            let default1 = run(&gs, None);
            let default2 = run(&gs, None);
            let no_prefetch = run(
                &gs,
                Some(DecodeOptions {
                    prefetch: false,
                    ..DecodeOptions::default()
                }),
            );
            let two_pass = run(
                &gs,
                Some(DecodeOptions {
                    single_part_keys: DecodeOptions::default().single_part_keys,
                    ..DecodeOptions::TWO_PASS
                }),
            );
            let legacy = run(&gs, Some(DecodeOptions::MMA_LEGACY));
            // The default launch on a backend built with `vars` set (then removed).
            let with_vars = |vars: &[(&str, &str)]| {
                vars.iter().for_each(|(k, v)| std::env::set_var(k, v));
                let h = gpu("bf16", kv);
                vars.iter().for_each(|(k, _)| std::env::remove_var(k));
                let hs = setup(&h, &ctxs, heads, kv_heads, hd, kv);
                let mut out = h.upload(&vec![f32::NAN; n]).unwrap();
                h.paged_attention(&hs.q, &hs.cache, 0, &hs.step, &hs.params, &mut out)
                    .unwrap();
                down(&h, &out, n)
            };
            // e4m3 widened by the byte tricks instead of the conversion instruction: same bits.
            let nocvt = (kv == "fp8_e4m3").then(|| with_vars(&[("KILN_DMMA_FP8_CVT", "0")]));
            // The chunk copies by the per-row table walk and the scalar end-of-part merge (the
            // kernel before branch `lctx3`): same bits.
            let before = with_vars(&[("KILN_DMMA_ISSUE", "generic"), ("KILN_DMMA_VEC_MERGE", "0")]);
            // Every launch on the paired entry points and none (`KILN_DMMA_PAIR_ROWS`; two warps
            // per warp of work, split by 32-dim blocks): same bits.
            let paired = with_vars(&[("KILN_DMMA_PAIR_ROWS", "1000000")]);
            let unpaired = with_vars(&[("KILN_DMMA_PAIR_ROWS", "0")]);
            let gated = gated_cuda(&g, &gs);
            let mut checks = vec![
                ("default_twice", same(&default1, &default2)),
                ("no_prefetch=default", same(&no_prefetch, &default1)),
                ("no_pdl=default", same(&two_pass, &default1)),
            ];
            if let Some(v) = &nocvt {
                checks.push(("e4m3_no_cvt=default", same(v, &default1)));
            }
            checks.push((
                "generic_issue_scalar_merge=default",
                same(&before, &default1),
            ));
            checks.push(("paired=default", same(&paired, &default1)));
            checks.push(("unpaired=default", same(&unpaired, &default1)));
            let mut diffs = vec![
                ("default", max_diff(&want, &default1)),
                ("legacy", max_diff(&want, &legacy)),
                ("gated", max_diff(&want_gated, &gated)),
            ];
            for (name, split) in SPLITS {
                let with = |base: DecodeOptions| DecodeOptions {
                    mma_split: Some(split),
                    ..base
                };
                let a = run(&gs, Some(with(DecodeOptions::default())));
                let b = run(
                    &gs,
                    Some(with(DecodeOptions {
                        single_part_keys: DecodeOptions::default().single_part_keys,
                        ..DecodeOptions::TWO_PASS
                    })),
                );
                checks.push((name, same(&a, &b)));
                diffs.push((name, max_diff(&want, &a)));
                if split == DecodeSplit::for_shape(kv_heads, hd, if kv == "auto" { 2 } else { 1 }) {
                    checks.push(("default_split", same(&a, &default1)));
                }
            }
            g.update_step_pinned(&mut gs.step, &gs.input, &PinnedShape { max_context: 32768 })
                .unwrap();
            checks.push(("pinned_32k=eager", same(&run(&gs, None), &default1)));
            for (name, ok) in &checks {
                println!("RESULT mma_decode_options {label} {name} bit_identical={ok}");
                if !ok {
                    failures.push(format!("{label} {name}"));
                }
            }
            for (name, d) in &diffs {
                let ok = *d <= limit;
                println!(
                    "RESULT mma_decode_options {label} {name} max_abs_diff={d:.3e} tol={limit:.0e} {}",
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{label} {name}: {d}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Seconds per `paged_attention` call over `seqs` rows of `ctx` keys (median of 7 runs of 20
/// calls queued back to back; launch and combine included), zero K/V as in cuda_long_context.
fn seconds(
    b: &CudaBackend,
    seqs: usize,
    ctx: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> f64 {
    let block = 16;
    let per_seq = ctx.div_ceil(block);
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks: seqs * per_seq,
        block_size: block,
        num_kv_heads: kv_heads,
        head_dim: hd,
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
        logit_rows: vec![],
        block_size: block,
    };
    let step = b.prepare_step(&input).expect("step");
    let q = b.upload(&data(seqs * heads * hd, 3)).expect("q");
    let k = b.upload(&data(seqs * kv_heads * hd, 4)).expect("k");
    let mut out = b.alloc(seqs * heads * hd).expect("out");
    b.write_kv(&mut cache, 0, &k, &k, &step).expect("write");
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let reps = 20;
    let mut run = || {
        for _ in 0..reps {
            b.paged_attention(&q, &cache, 0, &step, &params, &mut out)
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
    let got = down(b, &out, seqs * heads * hd);
    assert!(
        got.iter().all(|v| v.is_finite()),
        "non-finite attention output"
    );
    times[3]
}

/// The long-context table: GB/s of K/V read (every element of every context once) and its share
/// of the device-to-device copy bandwidth, for the tensor-core kernel and the older one
/// (`KILN_DECODE_MMA=0`), same run. `KILN_LONGCTX_ONLY=<label substring>` limits the rows.
#[test]
#[ignore = "needs a GPU: see the header"]
fn mma_decode_reads_kv_near_copy_bandwidth() {
    // copy_bandwidth() is in bytes per second.
    let copy = copy_bandwidth() / 1e9;
    println!("RESULT mma_long_context copy_gbps={copy:.0}");
    let only = std::env::var("KILN_LONGCTX_ONLY").ok();
    let skip_old = std::env::var("KILN_MMA_BENCH_NEW_ONLY").is_ok();
    for kv in ["auto", "fp8_e5m2", "fp8_e4m3"] {
        // `all`: head width 64 too (the backend's default keeps it on attention_decode.cu).
        std::env::set_var("KILN_DECODE_MMA", "all");
        let new = gpu("bf16", kv);
        std::env::set_var("KILN_DECODE_MMA", "0");
        let old = gpu("bf16", kv);
        std::env::remove_var("KILN_DECODE_MMA");
        let elem = if kv == "auto" { 2 } else { 1 };
        for (heads, kv_heads, hd) in [(9, 3, 64), (32, 8, 128), (24, 4, 256)] {
            assert!(
                new.uses_decode_mma(hd, heads / kv_heads),
                "not on the tensor-core kernel"
            );
            assert!(!old.uses_decode_mma(hd, heads / kv_heads));
            for ctx in [8192usize, 32768] {
                for seqs in [1usize, 16, 64] {
                    let label =
                        format!("heads={heads}/{kv_heads}x{hd} ctx={ctx} seqs={seqs} kv={kv}");
                    if only.as_ref().is_some_and(|o| !label.contains(o.as_str())) {
                        continue;
                    }
                    let bytes = (2 * seqs * ctx * kv_heads * hd * elem) as f64;
                    let t_new = seconds(&new, seqs, ctx, heads, kv_heads, hd);
                    let t_old = if skip_old {
                        f64::NAN
                    } else {
                        seconds(&old, seqs, ctx, heads, kv_heads, hd)
                    };
                    let (g_new, g_old) = (bytes / t_new / 1e9, bytes / t_old / 1e9);
                    println!(
                        "RESULT mma_long_context {label} us={:.1} gbps={g_new:.0} of_copy={:.0}% old_us={:.1} old_gbps={g_old:.0} old_of_copy={:.0}% speedup={:.2}",
                        t_new * 1e6,
                        100.0 * g_new / copy,
                        t_old * 1e6,
                        100.0 * g_old / copy,
                        t_old / t_new
                    );
                }
            }
        }
    }
}

/// No GPU: compiles every module these tests load (bf16 and f16 compute, every KV storage) for
/// `$KILN_CUDA_ARCH` into `$KILN_KERNEL_CACHE` (entries already there and valid are kept).
#[test]
#[ignore = "a helper for GPU runs: see the header"]
fn fill_kernel_cache_bf16_f16() {
    let arch = arch_override().expect("KILN_CUDA_ARCH");
    let cache = KernelCache::from_env().expect("KILN_KERNEL_CACHE");
    let include = nvrtc::find_include_dir(None).expect("headers");
    let mut jobs = Vec::new();
    for m in KernelModule::ALL.into_iter().filter(|m| m.builds_for(arch)) {
        if m.defines("f32", "same").is_empty() {
            jobs.push((m, Vec::new()));
        } else {
            for t in ["bf16", "f16"] {
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
    println!("RESULT fill_kernel_cache jobs={}", jobs.len());
}
