//! Shared helpers of the GPU parity tests (`cuda_parity`, `cuda_attention`, `cuda_sampling`):
//! the dtypes a run covers, named tolerances, deterministic data, comparisons, the models.
#![allow(dead_code)] // each test binary uses a subset

pub mod dense;

use std::path::{Path, PathBuf};

use kiln::backend::cuda::CudaBackend;
use kiln::backend::Backend;
use kiln::engine::{Device, EngineConfig};
use kiln::model::files::ModelFiles;
use kiln::model::runner::build_runner_for;
use kiln::model::step::{Feed, ForwardBatch, ForwardOutput, LogitsFor, ModelRunner, SeqSlice};
use kiln::sampling::SamplingRow;
use kiln::tools::probe::{probe, Positions, ProbeOutput};

/// Max |Δ| per compute dtype for single ops on O(1) data.
pub const OP_TOL_F32: f32 = 1e-4;
pub const OP_TOL_F16: f32 = 2e-2;
pub const OP_TOL_BF16: f32 = 8e-2;
/// Attention over an fp8 cache against the CPU rounding K/V through the same encoding: a K/V
/// value that differs by one compute-dtype ulp can round to the neighbouring fp8 value.
pub const OP_TOL_FP8_ATTENTION: f32 = 2e-2;
/// The same with bf16 compute: every K/V value is first rounded to bf16 (8 mantissa bits) and then
/// to fp8, which moves more values to a neighbouring fp8 step than f32 → fp8 directly (the
/// reference); largest when a per-head norm scales k up (Qwen3's k_norm, the fused
/// `qkv_rope_write` case: 9.6e-2 on sm_90 at 2026-12-01, while f32 compute matched to 3e-7).
pub const OP_TOL_FP8_ATTENTION_BF16: f32 = 0.15;

pub fn dtypes() -> Vec<&'static str> {
    // On a compute_70 run bf16 is not available.
    if std::env::var("KILN_CUDA_ARCH").is_ok_and(|a| a.contains("70") || a.contains("75")) {
        vec!["f32", "fp16"]
    } else {
        vec!["f32", "fp16", "bf16"]
    }
}

/// The 16-bit compute dtypes of this run: fp16 alone on a compute_70 / sm_75 run (no bf16 there).
pub fn half_dtypes() -> Vec<&'static str> {
    dtypes().into_iter().filter(|d| *d != "f32").collect()
}

pub fn tol(dtype: &str) -> f32 {
    match dtype {
        "f32" => OP_TOL_F32,
        "fp16" => OP_TOL_F16,
        _ => OP_TOL_BF16,
    }
}

pub fn arch_override() -> Option<kiln::backend::cuda::Arch> {
    std::env::var("KILN_CUDA_ARCH")
        .ok()
        .map(|a| a.parse().expect("KILN_CUDA_ARCH"))
}

pub fn gpu(dtype: &str, kv: &str) -> CudaBackend {
    CudaBackend::new(0, dtype, kv, arch_override()).expect("CUDA backend")
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub fn down<B: Backend>(b: &B, x: &B::Buffer, n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    b.download(x, &mut out).expect("download");
    out
}

/// Q8_0 bytes for `rows × cols` values (scale = max|x| / 127), built here so the test owns them.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for v in block {
            let q = if d > 0.0 { (v / d).round() } else { 0.0 };
            out.push(q as i8 as u8);
        }
    }
    out
}

/// The repository root: the build's, or the working directory when the binary runs elsewhere.
pub fn root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    if built.join("tests/fixtures").is_dir() {
        built.to_path_buf()
    } else {
        std::env::current_dir().expect("cwd")
    }
}

pub fn models() -> Vec<PathBuf> {
    let root = root();
    let mut m: Vec<PathBuf> = [
        "tests/fixtures/tiny-llama",
        "tests/fixtures/tiny-qwen3",
        "tests/fixtures/tiny-llama-q4_0.gguf",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "tests/fixtures/tiny-llama-q8_0.gguf",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    if let Ok(p) = std::env::var("KILN_TEST_MODEL") {
        m.push(PathBuf::from(p));
    }
    m
}

pub fn runner(files: &ModelFiles, device: Device, dtype: &str, kv: &str) -> Box<dyn ModelRunner> {
    let engine = EngineConfig {
        device,
        dtype: dtype.into(),
        kv_cache_dtype: kv.into(),
        max_model_len: 1024,
        max_num_batched_tokens: 512,
        gpu_memory_utilization: 0.1,
        ..EngineConfig::default()
    };
    build_runner_for(
        &files.config,
        files.weights.as_ref(),
        &engine.runner_options(),
    )
    .expect("runner")
}

/// (max |Δ| over all logits, min cosine per position, greedy tokens equal before the first
/// difference) of `got` against `want`.
pub fn compare(want: &ProbeOutput, got: &ProbeOutput) -> (f32, f64, usize) {
    let (mut worst, mut worst_cos) = (0f32, 1f64);
    for ((_, a), (_, b)) in want.logits.iter().zip(&got.logits) {
        worst = worst.max(max_diff(a, b));
        worst_cos = worst_cos.min(cosine(a, b));
    }
    let agree = want
        .greedy
        .iter()
        .zip(&got.greedy)
        .take_while(|(a, b)| a == b)
        .count();
    (worst, worst_cos, agree)
}

pub const ITERS: usize = 20;
pub const REPS: usize = 7;

/// Median seconds per call of `f` (after one warm-up batch): host wall clock around `ITERS`
/// back-to-back launches on the backend's stream and a synchronize, median of `REPS`.
pub fn time(b: &CudaBackend, mut f: impl FnMut()) -> f64 {
    for _ in 0..ITERS {
        f();
    }
    b.synchronize().expect("sync");
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let s = std::time::Instant::now();
            for _ in 0..ITERS {
                f();
            }
            b.synchronize().expect("sync");
            s.elapsed().as_secs_f64() / ITERS as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

/// Device-to-device copy bandwidth (read + write bytes per second) of 1 GiB.
pub fn copy_bandwidth() -> f64 {
    let ctx = cudarc::driver::CudaContext::new(0).expect("context");
    let s = ctx.default_stream();
    let bytes = 1usize << 30;
    let src = s.alloc_zeros::<u8>(bytes).expect("alloc");
    let mut dst = s.alloc_zeros::<u8>(bytes).expect("alloc");
    s.memcpy_dtod(&src, &mut dst).expect("copy");
    s.synchronize().expect("sync");
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let st = std::time::Instant::now();
            for _ in 0..5 {
                s.memcpy_dtod(&src, &mut dst).expect("copy");
            }
            s.synchronize().expect("sync");
            st.elapsed().as_secs_f64() / 5.0
        })
        .collect();
    t.sort_by(f64::total_cmp);
    2.0 * bytes as f64 / t[REPS / 2]
}

/// `v` as the GPU holds it in `dtype`.
pub fn round(dtype: &str, v: f32) -> f32 {
    match dtype {
        "bf16" => half::bf16::from_f32(v).to_f32(),
        "fp16" => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Max |Δ| / max |reference| of `got` (`[rows, N]`) on the checked columns.
pub fn rel_err(got: &[f32], n: usize, cols: &[usize], want: &[Vec<f64>]) -> f64 {
    let (mut d, mut m) = (0f64, 0f64);
    for (r, row) in want.iter().enumerate() {
        for (i, &c) in cols.iter().enumerate() {
            let g = f64::from(got[r * n + c]);
            if !g.is_finite() {
                return f64::INFINITY;
            }
            d = d.max((g - row[i]).abs());
            m = m.max(row[i].abs());
        }
    }
    d / m.max(1e-30)
}

/// Whether `a` and `b` hold the same f32 bit patterns.
pub fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Append one sequence to `batch`: its new `tokens` (after the batch's own), following
/// `cached_len` cached ones, in KV blocks `block_table`, asking `logits`, in recurrent state slot
/// `state_slot` (hybrid models; `None` for the others).
pub fn push_seq(
    batch: &mut ForwardBatch,
    tokens: &[u32],
    cached_len: usize,
    block_table: Vec<u32>,
    logits: LogitsFor,
    state_slot: Option<u32>,
) {
    batch.seqs.push(SeqSlice {
        start: batch.token_ids.len(),
        len: tokens.len(),
        cached_len,
        block_table,
        logits,
        state_slot,
    });
    batch.token_ids.extend(tokens);
}

/// The greedy tokens (sampled on the device) of `prompts` run together on `r` for `steps`
/// steps: one prefill step of every prompt, sequence i in KV blocks `tables[i]` (and state slot i
/// when `slots`), then one decode step per token. `[sequence][step]`.
pub fn batched_greedy(
    r: &mut dyn ModelRunner,
    prompts: &[Vec<u32>],
    tables: &[Vec<u32>],
    steps: usize,
    slots: bool,
) -> Vec<Vec<u32>> {
    let greedy = || LogitsFor::Sample(SamplingRow::greedy());
    let slot = |i: usize| slots.then_some(i as u32);
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut batch = ForwardBatch::default();
    for (i, p) in prompts.iter().enumerate() {
        push_seq(&mut batch, p, 0, tables[i].clone(), greedy(), slot(i));
    }
    for step in 0..steps {
        let sampled = r.forward(&batch).expect("forward").samples;
        assert_eq!(sampled.len(), prompts.len());
        let mut next = ForwardBatch::default();
        for (i, p) in prompts.iter().enumerate() {
            let id = sampled[i].as_ref().expect("sampled").token_id;
            outs[i].push(id);
            let table = tables[i].clone();
            push_seq(&mut next, &[id], p.len() + step, table, greedy(), slot(i));
        }
        batch = next;
    }
    outs
}

/// The model of the whole-model GPU tests: `KILN_TEST_MODEL`, else the tracked tiny llama fixture.
pub fn test_model_path() -> PathBuf {
    std::env::var("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("tests/fixtures/tiny-llama"))
}

/// Two runs of the same steps (eager and replayed from graphs): whether every step sampled the
/// same ids (a sampling error counts as `None`), whether the raw logits are equal bit for bit,
/// and their max |Δ|.
pub fn compare_steps(a: &[ForwardOutput], b: &[ForwardOutput]) -> (bool, bool, f32) {
    let ids = |o: &ForwardOutput| {
        o.samples
            .iter()
            .map(|s| s.as_ref().map(|s| s.token_id).ok())
            .collect::<Vec<_>>()
    };
    let (mut same_tokens, mut same_logits, mut worst) = (true, true, 0f32);
    for (x, y) in a.iter().zip(b) {
        same_tokens &= ids(x) == ids(y);
        same_logits &= bits_equal(&x.logits, &y.logits);
        worst = worst.max(max_diff(&x.logits, &y.logits));
    }
    (same_tokens, same_logits, worst)
}

/// What the graph tests ask of sequence `i`: even sequences are sampled on the device
/// (greedy), odd ones return their last row of raw logits.
pub fn alternate_logits(i: usize) -> LogitsFor {
    if i.is_multiple_of(2) {
        LogitsFor::Sample(SamplingRow::greedy())
    } else {
        LogitsFor::Last
    }
}

/// The next token of each of `n` sequences asked as `alternate_logits`: the device's sample
/// for even ones, the argmax of the returned logits row (lowest id on ties) for odd ones.
pub fn next_tokens(out: &ForwardOutput, n: usize, vocab: usize) -> Vec<u32> {
    let (mut sample, mut row) = (out.samples.iter(), 0);
    (0..n)
        .map(|i| {
            if i.is_multiple_of(2) {
                sample
                    .next()
                    .expect("sample")
                    .as_ref()
                    .expect("sampled")
                    .token_id
            } else {
                let l = &out.logits[row * vocab..(row + 1) * vocab];
                row += 1;
                (0..vocab)
                    .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
                    .unwrap() as u32
            }
        })
        .collect()
}

/// The f64 reference outputs `[rows][cols.len()]` of a `[N, k]` weight on input `x` (`[rows, k]`)
/// for its columns `cols`: column n's weights from `dequant(n, row)` (exactly, in f32), the
/// products and their sums in f64 (the oracle of the quantized-matmul tests).
pub fn reference_outputs(
    x: &[f32],
    rows: usize,
    k: usize,
    cols: &[usize],
    dequant: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<Vec<f64>> {
    use rayon::prelude::*;
    let per_col: Vec<Vec<f64>> = cols
        .par_iter()
        .map(|&n| {
            let mut w = vec![0f32; k];
            dequant(n, &mut w);
            (0..rows)
                .map(|r| {
                    x[r * k..(r + 1) * k]
                        .iter()
                        .zip(&w)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum()
                })
                .collect()
        })
        .collect();
    (0..rows)
        .map(|r| per_col.iter().map(|c| c[r]).collect())
        .collect()
}

/// The `[rows, n]` output of `matmul` (a product of `b` on the first `rows` rows of `x`, `[.., k]`,
/// uploaded), written over an output poisoned with NaN first, downloaded.
pub fn run_poisoned(
    b: &CudaBackend,
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
    matmul: impl FnOnce(&<CudaBackend as Backend>::Buffer, &mut <CudaBackend as Backend>::Buffer),
) -> Vec<f32> {
    let xb = b.upload(&x[..rows * k]).expect("upload x");
    let mut out = b.alloc(rows * n).expect("alloc out");
    let nan = b.upload(&vec![f32::NAN; rows * n]).expect("poison");
    b.add(&mut out, &nan, rows * n).expect("poison add");
    matmul(&xb, &mut out);
    down(b, &out, rows * n)
}

/// Whole model, f32 compute against the CPU f32 reference: max |Δlogit| (both dequantize the same
/// weights exactly; only the summation order differs), with all 16 greedy tokens equal.
pub const MODEL_F32_MAX_ABS: f32 = 1e-3;
/// Whole model, 16-bit compute: min cosine of the logits per position.
pub const MODEL_HALF_MIN_COS: f64 = 0.999;

/// The 40-token prompt of the whole-model comparisons: ids `(37 i + 11) mod min(vocab, 5000)`.
pub fn model_prompt(vocab: usize) -> Vec<u32> {
    let vocab = vocab as u32;
    (0..40u32)
        .map(|i| (i * 37 + 11) % vocab.min(5000))
        .collect()
}

/// `probe` of a fresh runner of `files` (`device`, compute `dtype`, KV `kv`) over `prompt`: the
/// logits of every position and 16 greedy tokens.
pub fn probe16(
    files: &ModelFiles,
    device: Device,
    dtype: &str,
    kv: &str,
    prompt: &[u32],
) -> ProbeOutput {
    probe(
        runner(files, device, dtype, kv).as_mut(),
        prompt,
        &Positions::All,
        16,
    )
    .expect("probe")
}

/// Whether a whole-model comparison ([`compare`]'s worst |Δ|, worst cosine, greedy agreement out
/// of 16) passes at compute `dtype`: [`MODEL_F32_MAX_ABS`] and all 16 tokens at f32,
/// [`MODEL_HALF_MIN_COS`] at 16 bits.
pub fn model_matches(dtype: &str, worst: f32, worst_cos: f64, agree: usize) -> bool {
    match dtype {
        "f32" => worst <= MODEL_F32_MAX_ABS && agree == 16,
        _ => worst_cos >= MODEL_HALF_MIN_COS,
    }
}

/// The sampled ids of `n` sequences over the prefill `first` and `steps` decode steps on `r`:
/// `next(k, ids)` builds decode step k (1..=steps) from the previous step's ids (it keeps the
/// sequences' lengths). Each step's forward before the next (`pipelined` false), or each step
/// submitted ahead with placeholder ids that the device replaces by the previous step's samples
/// (`Feed` row i into token i; `pipelined` true). `[sequence][step]`.
pub fn step_tokens(
    r: &mut dyn ModelRunner,
    first: ForwardBatch,
    n: usize,
    steps: usize,
    pipelined: bool,
    mut next: impl FnMut(usize, &[u32]) -> ForwardBatch,
) -> Vec<Vec<u32>> {
    let ids = |o: &ForwardOutput| -> Vec<u32> {
        o.samples
            .iter()
            .map(|s| s.as_ref().expect("sampled").token_id)
            .collect()
    };
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    if !pipelined {
        let mut batch = first;
        for k in 0..=steps {
            eprintln!("PROGRESS sync n={n} step {k}");
            let got = ids(&r.forward(&batch).expect("forward"));
            for (i, &t) in got.iter().enumerate() {
                out[i].push(t);
            }
            if k < steps {
                batch = next(k + 1, &got);
            }
        }
        return out;
    }
    let feeds: Vec<Feed> = (0..n).map(|i| Feed { token: i, row: i }).collect();
    let mut in_flight = r.submit(&first, &[]).expect("submit");
    for k in 0..=steps {
        eprintln!("PROGRESS pipelined n={n} step {k}");
        // Placeholder ids: the device writes the sampled ones before the step reads them.
        let ahead = (k < steps).then(|| {
            let b = next(k + 1, &vec![0; n]);
            r.submit(&b, &feeds).expect("submit ahead")
        });
        let got = ids(&r.collect(in_flight).expect("collect"));
        for (i, &t) in got.iter().enumerate() {
            out[i].push(t);
        }
        match ahead {
            Some(s) => in_flight = s,
            None => break,
        }
    }
    out
}
