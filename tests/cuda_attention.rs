//! CUDA paged attention against the CPU backend, on a GPU: the tiled prefill kernel and the split-K
//! kernel over prompts, mixed steps, GQA ratios, head dims, block sizes and KV storages; Qwen3.5's
//! sigmoid output gate fused into both kernels against the unfused ops; and a timing.
//!
//! Run on the GPU machine (binaries built here with `cargo test --features cuda --no-run`):
//! `KILN_TEST_MODEL=/tmp/kiln/SmolLM2-135M-Instruct.Q4_1.gguf cuda_attention-<hash> --ignored --test-threads=1 --nocapture`
//! and, for the V100 (sm_70) path through the driver's JIT of `compute_70` PTX with NVRTC 12.9:
//! `KILN_CUDA_ARCH=compute_70 KILN_CUDA_INCLUDE=<12.9 headers> LD_LIBRARY_PATH=<nvrtc 12.9 lib> cuda_attention-<hash> --ignored --test-threads=1 --nocapture`
//! (the 12.9 lib folder needs a `libnvrtc.so` link to `libnvrtc.so.12`).
//! Each test prints `RESULT` lines that go into docs/gpu-validation.md.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use kiln::backend::cuda::attention_plan::{DecodeOptions, DECODE_SINGLE_PART_KEYS};
use kiln::backend::cuda::backend::OutputGate;
use kiln::backend::cuda::CudaBackend;
use kiln::backend::hybrid::HybridBackend;
use kiln::backend::{AttentionParams, Backend, CpuBackend, KvCacheDType, KvCacheSpec, PinnedShape};
use kiln::model::step::{ForwardBatch, LogitsFor, SeqSlice};

/// One attention parity case: every sequence is `(cached_len, new tokens)`, all in one step.
struct AttnCase {
    seqs: Vec<(usize, usize)>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
}

impl AttnCase {
    fn new(seqs: &[(usize, usize)], heads: usize, kv_heads: usize, hd: usize, bs: usize) -> Self {
        AttnCase {
            seqs: seqs.to_vec(),
            heads,
            kv_heads,
            head_dim: hd,
            block_size: bs,
        }
    }

    fn label(&self) -> String {
        let seqs: Vec<String> = self.seqs.iter().map(|(c, l)| format!("{c}+{l}")).collect();
        format!(
            "seqs=[{}] heads={}/{} head_dim={} block={}",
            seqs.join(","),
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.block_size
        )
    }

    fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.1).sum()
    }
}

/// Prompts of several lengths, a prefill chunk after a cached prefix mixed with decodes (split-K
/// over three partitions through the token index list), GQA ratios 1, 3 and 8, head_dim 32..256
/// (80: a head_dim that is not a multiple of 32; 66: not a multiple of 4, so the split-K kernel
/// takes every token), block sizes 16 and 32, chunks that start mid-block.
fn attn_cases() -> Vec<AttnCase> {
    let mixed = [(700, 300), (5, 1), (1200, 1), (0, 17), (40, 1)];
    let mut v: Vec<AttnCase> = [1, 17, 64, 300, 1100]
        .iter()
        .map(|&len| AttnCase::new(&[(0, len)], 9, 3, 64, 16))
        .collect();
    v.extend([
        AttnCase::new(&mixed, 32, 4, 128, 32),
        AttnCase::new(&mixed, 9, 3, 64, 16),
        AttnCase::new(&[(700, 300), (5, 1), (1200, 1)], 4, 4, 256, 16),
        AttnCase::new(&[(0, 300)], 4, 4, 128, 32),
        AttnCase::new(&[(0, 300)], 32, 4, 128, 16),
        AttnCase::new(&[(0, 300), (33, 45)], 6, 2, 256, 32),
        AttnCase::new(&[(100, 200)], 16, 2, 256, 16),
        AttnCase::new(&[(20, 130)], 6, 2, 80, 16),
        AttnCase::new(&[(0, 70)], 4, 2, 32, 16),
        AttnCase::new(&[(0, 5), (3, 2), (0, 40), (64, 33)], 9, 3, 64, 16),
        AttnCase::new(&[(10, 50), (7, 1)], 4, 2, 66, 16),
    ]);
    v
}

/// K/V as the cache will hold them: fp8 values are exact in every compute dtype, so feeding
/// pre-rounded K/V to both backends leaves only the compute dtype's error.
fn kv_values(n: usize, seed: u64, kv: &str) -> Vec<f32> {
    let storage = KvCacheDType::parse(kv).expect("kv dtype");
    data(n, seed)
        .into_iter()
        .map(|v| storage.round(v))
        .collect()
}

/// A case's cache (written through `write_kv`: the cached prefixes, then the step's tokens), step
/// and queries, on any backend. Blocks are handed out in a scrambled order.
struct AttnSetup<B: Backend> {
    cache: B::KvCache,
    step: B::Step,
    /// The step's input (to refill the step, e.g. pinned).
    input: kiln::backend::StepInput,
    q: B::Buffer,
    params: AttentionParams,
}

fn attn_setup<B: Backend>(b: &B, c: &AttnCase, kv: &str) -> AttnSetup<B> {
    let bs = c.block_size;
    let need: usize = c.seqs.iter().map(|(cl, l)| (cl + l).div_ceil(bs)).sum();
    let num_blocks = need + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    let mut s = 0x9e3779b97f4a7c15u64;
    for i in (1..ids.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ids.swap(i, (s >> 33) as usize % (i + 1));
    }
    let mut next = 0;
    let tables: Vec<Vec<u32>> = c
        .seqs
        .iter()
        .map(|(cl, l)| {
            let n = (cl + l).div_ceil(bs);
            next += n;
            ids[next - n..next].to_vec()
        })
        .collect();
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks,
        block_size: bs,
        num_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    };
    let row = c.kv_heads * c.head_dim;
    let mut cache = b.create_kv_cache(&spec).expect("cache");
    let batch = |cached: bool| {
        let mut fb = ForwardBatch::default();
        for (i, &(cl, l)) in c.seqs.iter().enumerate() {
            let (cached_len, len) = if cached { (0, cl) } else { (cl, l) };
            fb.seqs.push(SeqSlice {
                start: fb.token_ids.len(),
                len,
                cached_len,
                block_table: tables[i].clone(),
                logits: LogitsFor::None,
                state_slot: None,
            });
            fb.token_ids.extend(std::iter::repeat_n(0, len));
        }
        fb.step_input(bs, num_blocks, 1, 1 << 16).expect("step")
    };
    let prefix = batch(true);
    let np = prefix.num_tokens();
    if np > 0 {
        let pst = b.prepare_step(&prefix).expect("prepare prefix");
        let k = b.upload(&kv_values(np * row, 21, kv)).unwrap();
        let v = b.upload(&kv_values(np * row, 22, kv)).unwrap();
        b.write_kv(&mut cache, 0, &k, &v, &pst).unwrap();
    }
    let input = batch(false);
    let t = input.num_tokens();
    let step = b.prepare_step(&input).expect("prepare");
    let k = b.upload(&kv_values(t * row, 23, kv)).unwrap();
    let v = b.upload(&kv_values(t * row, 24, kv)).unwrap();
    b.write_kv(&mut cache, 0, &k, &v, &step).unwrap();
    // Queries in [-2, 2): a softmax that is neither flat nor one-hot.
    let qv: Vec<f32> = data(t * c.heads * c.head_dim, 25)
        .iter()
        .map(|x| 2.0 * x)
        .collect();
    AttnSetup {
        cache,
        step,
        input,
        q: b.upload(&qv).unwrap(),
        params: AttentionParams {
            num_heads: c.heads,
            num_kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        },
    }
}

/// The tiled prefill kernel (and the split-K kernel forced for every token, as a second opinion)
/// against the CPU backend on every case, compute dtype and KV storage.
#[test]
#[ignore = "needs a GPU: see the header"]
fn prefill_attention_matches_the_cpu_backend() {
    let cpu = CpuBackend::new(0).expect("cpu");
    let cases = attn_cases();
    let kvs = ["auto", "fp8_e5m2", "fp8_e4m3"];
    let want: Vec<Vec<Vec<f32>>> = kvs
        .iter()
        .map(|kv| {
            cases
                .iter()
                .map(|c| {
                    let s = attn_setup(&cpu, c, kv);
                    let n = c.num_tokens() * c.heads * c.head_dim;
                    let mut out = cpu.alloc(n).unwrap();
                    cpu.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out)
                        .unwrap();
                    down(&cpu, &out, n)
                })
                .collect()
        })
        .collect();
    let mut failures = Vec::new();
    for dtype in dtypes() {
        for (ki, kv) in kvs.iter().enumerate() {
            let g = gpu(dtype, kv);
            for (c, want) in cases.iter().zip(&want[ki]) {
                let s = attn_setup(&g, c, kv);
                let n = c.num_tokens() * c.heads * c.head_dim;
                // Poisoned outputs: a token no kernel writes stays NaN.
                let mut tiled = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut tiled)
                    .unwrap();
                let mut split = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention_split_k(&s.q, &s.cache, 0, &s.step, &s.params, &mut split)
                    .unwrap();
                let (tiled, split) = (down(&g, &tiled, n), down(&g, &split, n));
                let (dt, ds) = (max_diff(want, &tiled), max_diff(want, &split));
                let limit = tol(dtype);
                let ok = dt <= limit && tiled.iter().all(|v| v.is_finite());
                println!(
                    "RESULT attention {} dtype={dtype} kv={kv} max_abs_diff={dt:.3e} split_k_max_abs_diff={ds:.3e} tol={limit:.0e} {}",
                    c.label(),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{} {dtype} {kv}: {dt}", c.label()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

fn median_us(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One 2048-token prompt, 32 heads / 8 KV heads, head_dim 128, in bf16 (fp16 where bf16 is not
/// available): the split-K kernel (the path before the tiled one) against the tiled kernel. Stream
/// synchronize + Instant around each call, median of 7 after a warm-up.
#[test]
#[ignore = "needs a GPU: see the header"]
fn prefill_attention_timing() {
    let dtype = if dtypes().contains(&"bf16") {
        "bf16"
    } else {
        "fp16"
    };
    let c = AttnCase::new(&[(0, 2048)], 32, 8, 128, 16);
    let n = c.num_tokens() * c.heads * c.head_dim;
    for kv in ["auto", "fp8_e5m2"] {
        let g = gpu(dtype, kv);
        let s = attn_setup(&g, &c, kv);
        let mut tiled = g.alloc(n).unwrap();
        let mut split = g.alloc(n).unwrap();
        let time = |force_split: bool, out: &mut <CudaBackend as Backend>::Buffer| {
            let mut runs = Vec::new();
            for i in 0..8 {
                g.synchronize().unwrap();
                let t0 = std::time::Instant::now();
                if force_split {
                    g.paged_attention_split_k(&s.q, &s.cache, 0, &s.step, &s.params, out)
                } else {
                    g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, out)
                }
                .unwrap();
                g.synchronize().unwrap();
                if i > 0 {
                    runs.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            median_us(runs)
        };
        let split_us = time(true, &mut split);
        let tiled_us = time(false, &mut tiled);
        let d = max_diff(&down(&g, &split, n), &down(&g, &tiled, n));
        // Causal FLOPs: QKᵀ and PV over T(T+1)/2 (query, key) pairs per head.
        let t = c.num_tokens() as f64;
        let flops = 4.0 * t * (t + 1.0) / 2.0 * (c.heads * c.head_dim) as f64;
        println!(
            "RESULT attention_prefill_us dtype={dtype} kv={kv} {} split_k_us={split_us:.0} tiled_us={tiled_us:.0} speedup={:.1}x tiled_tflops={:.2} tiled_vs_split_k_max_abs_diff={d:.3e}",
            c.label(),
            split_us / tiled_us,
            flops / tiled_us / 1e6
        );
        assert!(d <= tol(dtype), "tiled and split-K disagree by {d}");
    }
}

/// Contexts every decode case covers, one decode row each in one step: a single key, block-size
/// edges, a part edge (128 keys per part below 16K), 1 000 keys (8 parts) and 8K (64 parts).
const DECODE_CONTEXTS: [usize; 8] = [1, 15, 16, 17, 129, 255, 1000, 8192];

/// The decode kernel (kernels/attention_decode.cu) against the CPU backend: head dims 64, 128,
/// 256 (and 80, narrower than its class), GQA ratios 1, 3 and 6 (and 8), every context of
/// [`DECODE_CONTEXTS`] as a decode row of one step, block size 16 (the engine's default) and 32,
/// every compute dtype and KV storage. Also a step of prefill chunks sent through
/// `paged_attention_split_k` (every token a decode row: several query tokens per sequence, causal
/// among them, the speculative-decoding shape), and the 8K row alone against the same row in the
/// batch (the split depends on the context only: bit-identical).
#[test]
#[ignore = "needs a GPU: see the header"]
fn decode_attention_matches_the_cpu_backend() {
    let cpu = CpuBackend::new(0).expect("cpu");
    let decode: Vec<(usize, usize)> = DECODE_CONTEXTS.iter().map(|&c| (c - 1, 1)).collect();
    let mut cases = Vec::new();
    for (hd, bs) in [(64, 16), (128, 16), (256, 16), (80, 32)] {
        for (heads, kv_heads) in [(4, 4), (9, 3), (24, 4), (16, 2)] {
            cases.push(AttnCase::new(&decode, heads, kv_heads, hd, bs));
        }
    }
    // q_len > 1 per sequence through the decode kernel (paged_attention_split_k below).
    let verify = AttnCase::new(&[(40, 5), (0, 16), (1000, 3), (7, 1)], 24, 4, 256, 16);
    let kvs = ["auto", "fp8_e5m2", "fp8_e4m3"];
    let reference = |c: &AttnCase, kv: &str| {
        let s = attn_setup(&cpu, c, kv);
        let n = c.num_tokens() * c.heads * c.head_dim;
        let mut out = cpu.alloc(n).unwrap();
        cpu.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out)
            .unwrap();
        down(&cpu, &out, n)
    };
    let mut failures = Vec::new();
    for kv in kvs {
        let want: Vec<Vec<f32>> = cases.iter().map(|c| reference(c, kv)).collect();
        let want_verify = reference(&verify, kv);
        for dtype in dtypes() {
            let g = gpu(dtype, kv);
            let limit = tol(dtype);
            for (c, want) in cases.iter().zip(&want) {
                let s = attn_setup(&g, c, kv);
                let n = c.num_tokens() * c.heads * c.head_dim;
                let mut got = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut got)
                    .unwrap();
                let got = down(&g, &got, n);
                // Worst row by context, so a failing context is named.
                let row = c.heads * c.head_dim;
                let per_ctx: Vec<String> = DECODE_CONTEXTS
                    .iter()
                    .enumerate()
                    .map(|(i, ctx)| {
                        let r = i * row..(i + 1) * row;
                        format!("{ctx}:{:.1e}", max_diff(&want[r.clone()], &got[r]))
                    })
                    .collect();
                let d = max_diff(want, &got);
                let ok = d <= limit && got.iter().all(|v| v.is_finite());
                println!(
                    "RESULT attention_decode {} dtype={dtype} kv={kv} max_abs_diff={d:.3e} tol={limit:.0e} per_ctx=[{}] {}",
                    c.label(),
                    per_ctx.join(" "),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{} {dtype} {kv}: {d}", c.label()));
                }
            }
            // Several query tokens per sequence, every one a decode-kernel row.
            let s = attn_setup(&g, &verify, kv);
            let n = verify.num_tokens() * verify.heads * verify.head_dim;
            let mut got = g.upload(&vec![f32::NAN; n]).unwrap();
            g.paged_attention_split_k(&s.q, &s.cache, 0, &s.step, &s.params, &mut got)
                .unwrap();
            let got = down(&g, &got, n);
            let d = max_diff(&want_verify, &got);
            let ok = d <= limit && got.iter().all(|v| v.is_finite());
            println!(
                "RESULT attention_decode_multi_token {} dtype={dtype} kv={kv} max_abs_diff={d:.3e} tol={limit:.0e} {}",
                verify.label(),
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failures.push(format!("multi-token {dtype} {kv}: {d}"));
            }
            // The 8K row alone equals the same row inside the batch, bit for bit.
            let batch = &cases[1];
            let alone = AttnCase::new(
                &[(8191, 1)],
                batch.heads,
                batch.kv_heads,
                batch.head_dim,
                batch.block_size,
            );
            let run = |c: &AttnCase| {
                let s = attn_setup(&g, c, kv);
                let n = c.num_tokens() * c.heads * c.head_dim;
                let mut out = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out)
                    .unwrap();
                down(&g, &out, n)
            };
            // The data differ between the two setups (seeded by position in the buffers), so
            // compare against a batch whose first rows are the alone case's: run it as the batch
            // [(8191, 1), rest...].
            let mut seqs = vec![(8191usize, 1usize)];
            seqs.extend(decode.iter().copied().filter(|&(c, _)| c != 8191));
            let with = AttnCase::new(
                &seqs,
                batch.heads,
                batch.kv_heads,
                batch.head_dim,
                batch.block_size,
            );
            let (a, w) = (run(&alone), run(&with));
            let row = batch.heads * batch.head_dim;
            let same = a[..row]
                .iter()
                .zip(&w[..row])
                .all(|(x, y)| x.to_bits() == y.to_bits());
            println!(
                "RESULT attention_decode_batch_invariance {} dtype={dtype} kv={kv} bit_identical={same}",
                alone.label()
            );
            if !same {
                failures.push(format!("batch invariance {dtype} {kv}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Several decode rows per sequence in one launch (every token a decode-kernel row, as a
/// speculative verification step of 2–16 draft tokens would run) with the K/V prefetch before
/// `griddepcontrol.wait` on: the kernels bound the prefetch by each sequence's cached length
/// (this step's keys, just written by `write_kv`, are read after the wait), so the rows match the
/// CPU backend, and the default launch gives the same bits as the launch without the prefetch,
/// without PDL and (tensor-core shapes) with the ring drained at each part's end
/// (`KILN_DMMA_XPART=0`). Long rows (8K + 16 draft tokens,
/// 4K + 2, 300 + 5, 20 + 3), SmolLM2's 9/3 × 64 (attention_decode.cu), a Qwen3-like 32/8 × 128 and
/// the 27B's 24/4 × 256 (attention_decode_mma.cu), 16-bit and e4m3 KV, every compute dtype.
#[test]
#[ignore = "needs a GPU: see the header"]
fn multi_row_decode_with_prefetch_matches_the_cpu_backend() {
    let cpu = CpuBackend::new(0).expect("cpu");
    let seqs = [(8000usize, 16usize), (4000, 2), (300, 5), (20, 3)];
    let mut failures = Vec::new();
    for (heads, kv_heads, hd) in [(9, 3, 64), (32, 8, 128), (24, 4, 256)] {
        let c = AttnCase::new(&seqs, heads, kv_heads, hd, 16);
        let n = c.num_tokens() * heads * hd;
        for kv in ["auto", "fp8_e4m3"] {
            let want = {
                let s = attn_setup(&cpu, &c, kv);
                let mut out = cpu.alloc(n).unwrap();
                cpu.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut out)
                    .unwrap();
                down(&cpu, &out, n)
            };
            for dtype in dtypes() {
                let g = gpu(dtype, kv);
                let s = attn_setup(&g, &c, kv);
                let run = |opts: DecodeOptions| {
                    let mut out = g.upload(&vec![f32::NAN; n]).unwrap();
                    g.paged_attention_decode_with(
                        &s.q, &s.cache, 0, &s.step, &s.params, &mut out, opts,
                    )
                    .unwrap();
                    down(&g, &out, n)
                };
                let same = |a: &[f32], b: &[f32]| {
                    a.iter()
                        .zip(b)
                        .all(|(x, y)| x.to_bits() == y.to_bits() && x.is_finite())
                };
                // Through the public path too (paged_attention_split_k: every token a row).
                let mut split = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention_split_k(&s.q, &s.cache, 0, &s.step, &s.params, &mut split)
                    .unwrap();
                let split = down(&g, &split, n);
                let default = run(DecodeOptions::default());
                let no_prefetch = run(DecodeOptions {
                    prefetch: false,
                    ..DecodeOptions::default()
                });
                let no_pdl = run(DecodeOptions {
                    pdl: false,
                    prefetch: false,
                    ..DecodeOptions::default()
                });
                let mut checks = vec![
                    ("split_k=default", same(&split, &default)),
                    ("no_prefetch=default", same(&no_prefetch, &default)),
                    ("no_pdl=default", same(&no_pdl, &default)),
                ];
                if g.uses_decode_mma(hd, heads / kv_heads) {
                    // The tensor-core kernel with its ring drained at each part's end.
                    std::env::set_var("KILN_DMMA_XPART", "0");
                    let h = gpu(dtype, kv);
                    std::env::remove_var("KILN_DMMA_XPART");
                    let hs = attn_setup(&h, &c, kv);
                    let mut out = h.upload(&vec![f32::NAN; n]).unwrap();
                    h.paged_attention_decode_with(
                        &hs.q,
                        &hs.cache,
                        0,
                        &hs.step,
                        &hs.params,
                        &mut out,
                        DecodeOptions::default(),
                    )
                    .unwrap();
                    checks.push(("no_xpart=default", same(&down(&h, &out, n), &default)));
                }
                let d = max_diff(&want, &default);
                let limit = tol(dtype);
                let close = d <= limit;
                let bits: Vec<String> = checks.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                let ok = close && checks.iter().all(|c| c.1);
                println!(
                    "RESULT attention_decode_multi_row_prefetch {} dtype={dtype} kv={kv} max_abs_diff={d:.3e} tol={limit:.0e} bits=[{}] {}",
                    c.label(),
                    bits.join(" "),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{} {dtype} {kv}: {d} {bits:?}", c.label()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The decode kernel's launch options give the same bits as the launch before them
/// (`DecodeOptions::TWO_PASS`: partials merged by a second kernel, no PDL, no prefetch): the
/// in-launch merge (the last block of a (row, KV head) merges) with PDL and the first K/V tile
/// staged before the wait against the two-pass merge for the same
/// split, for the single-pass rule (rows ≤ DECODE_SINGLE_PART_KEYS keys in one part) and without
/// it; the default launch twice (whichever block merges, the same bits), and with the step
/// pinned to a 32K context (a graph's shapes: more partial slots and blocks than the data needs).
/// Rows of 1 … 20 000 keys around the 256-key bound and the part sizes, SmolLM2's 9/3 × 64, a
/// Qwen3-like 32/8 × 128 and the 27B's 24/4 × 256, 16-bit and e4m3 KV, every compute dtype. The
/// numerics against the CPU are `decode_attention_matches_the_cpu_backend` (default launch).
#[test]
#[ignore = "needs a GPU: see the header"]
fn decode_launch_options_give_the_two_pass_bits() {
    let ctxs = [1usize, 150, 255, 256, 257, 1000, 8192, 20000];
    let decode: Vec<(usize, usize)> = ctxs.iter().map(|&c| (c - 1, 1)).collect();
    let single = DECODE_SINGLE_PART_KEYS;
    let two_pass = |single_part_keys| DecodeOptions {
        single_part_keys,
        merge_in_launch: false,
        pdl: false,
        prefetch: false,
        ..DecodeOptions::TWO_PASS
    };
    let in_launch = |single_part_keys| DecodeOptions {
        single_part_keys,
        merge_in_launch: true,
        pdl: true,
        prefetch: true,
        ..DecodeOptions::default()
    };
    let mut failures = Vec::new();
    for (heads, kv_heads, hd) in [(9, 3, 64), (32, 8, 128), (24, 4, 256)] {
        let c = AttnCase::new(&decode, heads, kv_heads, hd, 16);
        let n = c.num_tokens() * heads * hd;
        for kv in ["auto", "fp8_e4m3"] {
            for dtype in dtypes() {
                let g = gpu(dtype, kv);
                let mut s = attn_setup(&g, &c, kv);
                let run = |s: &AttnSetup<CudaBackend>, opts: Option<DecodeOptions>| {
                    let mut out = g.upload(&vec![f32::NAN; n]).unwrap();
                    match opts {
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
                let before = run(&s, Some(DecodeOptions::TWO_PASS));
                let merged_split = run(&s, Some(in_launch(0)));
                let single_two = run(&s, Some(two_pass(single)));
                let default1 = run(&s, None);
                let default2 = run(&s, None);
                let explicit = run(&s, Some(in_launch(single)));
                g.update_step_pinned(&mut s.step, &s.input, &PinnedShape { max_context: 32768 })
                    .unwrap();
                let pinned = run(&s, None);
                // The single-pass rule changes only the rows ≤ the bound (one part instead of
                // several): the longer rows keep the bits of the split.
                let row = heads * hd;
                let long_from = ctxs.iter().position(|&x| x > single).unwrap() * row;
                let checks = [
                    ("in_launch_merge=two_pass", same(&merged_split, &before)),
                    (
                        "single_pass_in_launch=two_pass",
                        same(&default1, &single_two),
                    ),
                    ("default_twice", same(&default1, &default2)),
                    ("default=explicit_options", same(&default1, &explicit)),
                    ("pinned_32k=eager", same(&pinned, &default1)),
                    (
                        "long_rows_unchanged",
                        same(&default1[long_from..], &before[long_from..]),
                    ),
                ];
                let short_diff = max_diff(&default1[..long_from], &before[..long_from]);
                for (name, ok) in checks {
                    println!(
                        "RESULT decode_launch_options {} dtype={dtype} kv={kv} {name} bit_identical={ok}",
                        c.label()
                    );
                    if !ok {
                        failures.push(format!("{} {dtype} {kv} {name}", c.label()));
                    }
                }
                println!(
                    "RESULT decode_launch_options {} dtype={dtype} kv={kv} short_rows_single_vs_split_max_abs_diff={short_diff:.3e} tol={:.0e}",
                    c.label(),
                    tol(dtype)
                );
                if short_diff > tol(dtype) {
                    failures.push(format!(
                        "{} {dtype} {kv} short rows {short_diff}",
                        c.label()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// The output gate fused into the attention kernels (`gated_paged_attention`: prefill tiles, the
/// decode kernel's direct rows and its combine pass) against the CPU backend's unfused pair
/// (attention, then `sigmoid_mul`) and against the GPU's own unfused pair; also a strided gate
/// view (each head's gate the first half of a `[tokens, heads, 2 · head_dim]` row, as a q|gate
/// projection lays it out). Every compute dtype, bf16/fp8 KV; head dims 64/128/256, GQA 3 and 6,
/// a decode at 1 200 keys (combine pass), at 6 keys (one part) and prefill chunks.
#[test]
#[ignore = "needs a GPU: see the header"]
fn gated_attention_fused_matches_the_unfused_ops() {
    let cpu = CpuBackend::new(0).expect("cpu");
    let mixed = [(700, 300), (5, 1), (1200, 1), (0, 17), (40, 1)];
    let cases = [
        AttnCase::new(&mixed, 9, 3, 64, 16),
        AttnCase::new(&mixed, 24, 4, 256, 16),
        AttnCase::new(&[(1200, 1), (5, 1), (8191, 1)], 32, 8, 128, 16),
        AttnCase::new(&[(0, 40), (1200, 1)], 6, 2, 80, 32),
    ];
    let mut failures = Vec::new();
    for kv in ["auto", "fp8_e5m2", "fp8_e4m3"] {
        for c in &cases {
            let n = c.num_tokens() * c.heads * c.head_dim;
            // Gates in [-4, 4): sigmoid from ~0.02 to ~0.98.
            let gate: Vec<f32> = data(n, 26).iter().map(|x| 8.0 * x).collect();
            let s = attn_setup(&cpu, c, kv);
            let g_cpu = cpu.upload(&gate).unwrap();
            let mut out = cpu.alloc(n).unwrap();
            cpu.gated_paged_attention(
                &s.q,
                &g_cpu,
                c.num_tokens(),
                &s.cache,
                0,
                &s.step,
                &s.params,
                &mut out,
            )
            .unwrap();
            let want = down(&cpu, &out, n);
            // The same gate values laid out as the first half of each head of a q|gate row.
            let hd = c.head_dim;
            let mut wide = vec![0.0f32; 2 * n];
            for (i, chunk) in gate.chunks(hd).enumerate() {
                wide[2 * i * hd..2 * i * hd + hd].copy_from_slice(chunk);
            }
            for dtype in dtypes() {
                let g = gpu(dtype, kv);
                let s = attn_setup(&g, c, kv);
                let gbuf = g.upload(&gate).unwrap();
                let mut fused = g.upload(&vec![f32::NAN; n]).unwrap();
                g.gated_paged_attention(
                    &s.q,
                    &gbuf,
                    c.num_tokens(),
                    &s.cache,
                    0,
                    &s.step,
                    &s.params,
                    &mut fused,
                )
                .unwrap();
                let mut unfused = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention(&s.q, &s.cache, 0, &s.step, &s.params, &mut unfused)
                    .unwrap();
                g.sigmoid_mul(&mut unfused, &gbuf, n).unwrap();
                let wbuf = g.upload(&wide).unwrap();
                let strided_gate = OutputGate {
                    buf: &wbuf,
                    row: 2 * c.heads * hd,
                    head: 2 * hd,
                };
                let mut strided = g.upload(&vec![f32::NAN; n]).unwrap();
                g.paged_attention_gated(
                    &s.q,
                    strided_gate,
                    &s.cache,
                    0,
                    &s.step,
                    &s.params,
                    &mut strided,
                )
                .unwrap();
                let (fused, unfused, strided) = (
                    down(&g, &fused, n),
                    down(&g, &unfused, n),
                    down(&g, &strided, n),
                );
                let (d_cpu, d_unf) = (max_diff(&want, &fused), max_diff(&unfused, &fused));
                let same_strided = fused
                    .iter()
                    .zip(&strided)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                // Fused and unfused differ by one rounding of the attention value to the compute
                // dtype (the fused gate multiplies the f32 value): within the op tolerance.
                let limit = tol(dtype);
                let ok = d_cpu <= limit
                    && d_unf <= limit
                    && same_strided
                    && fused.iter().all(|v| v.is_finite());
                println!(
                    "RESULT gated_attention {} dtype={dtype} kv={kv} fused_vs_cpu={d_cpu:.3e} fused_vs_gpu_unfused={d_unf:.3e} strided_bit_identical={same_strided} tol={limit:.0e} {}",
                    c.label(),
                    if ok { "ok" } else { "FAIL" }
                );
                if !ok {
                    failures.push(format!("{} {dtype} {kv}: {d_cpu} / {d_unf}", c.label()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Seconds to create a backend (every kernel file compiled by NVRTC, or read from the kernel
/// cache, and loaded): run it twice with the same empty `KILN_KERNEL_CACHE` folder for the cold
/// and the warm start (docs/benchmarks.md).
#[test]
#[ignore = "needs a GPU: see the header"]
fn backend_start_seconds() {
    let cache = std::env::var("KILN_KERNEL_CACHE").unwrap_or_else(|_| "(default)".into());
    let entries = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let before = entries(&cache);
    let t0 = std::time::Instant::now();
    let g = gpu(dtypes()[dtypes().len() - 1], "auto");
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT backend_start seconds={secs:.2} cache={cache} entries_before={before} entries_after={} device={}",
        entries(&cache),
        g.name()
    );
}
