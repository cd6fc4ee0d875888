//! `kiln bench`: performance numbers.
//!
//! - default: the real engine ([`crate::engine::spawn_from_path`]: scheduler, KV cache,
//!   sampler) on a model (default `models/SmolLM2-135M-Instruct.Q4_1.gguf`). For each
//!   `--concurrency C`: `C` requests of `--prompt-tokens` distinct random token ids (no shared
//!   prefix; prefix caching off) are submitted together, greedy, `--gen-tokens` each with EOS
//!   ignored. Prefill tokens/s = `C · prompt / max TTFT`; decode tokens/s =
//!   `C · (gen − 1) / (max total − max TTFT)` (aggregate over the sequences), the same
//!   definitions as llama.cpp's `llama-batched-bench` (S_PP, S_TG).
//! - `--kernels`: the CPU matmul kernels alone. Per weight dtype: µs per call, GFLOP/s
//!   (`2·m·n·k / t`) and weight GB/s (stored bytes / t, the figure that matters for batch 1),
//!   at batch 1, 16 and 128; then the matmul stack of one SmolLM2-135M forward step (30 layers of
//!   Q4_1 projections + the Q8_0 tied embedding as `lm_head`, on synthetic weights of the real
//!   shapes) as tokens/s, which bounds what the whole engine can reach.
//!
//! Timing: each measurement runs a warm-up call, then repeats until at least `--min-time`
//! seconds (and 3 calls) have passed, and reports the median call. The machine's load average
//! is printed beside the numbers, because other processes distort them.

use std::time::{Duration, Instant};

mod kernels;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::cpu::matmul::Isa;
use kernels::mode_name;

/// `kiln bench` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Device of the engine benchmark: `cpu`, `cuda`, `cuda:N` or `auto` (`--kernels`: `cpu`
    /// only).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype on GPUs (`engine.dtype`: auto, bf16, fp16, f32).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// KV-cache storage (`engine.kv_cache_dtype`: auto, fp8_e5m2, fp8_e4m3).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Memory bandwidth of the device in GB/s for the roofline column (default: from the
    /// driver on CUDA; none on the CPU).
    #[arg(long)]
    pub peak_gbps: Option<f64>,
    /// Model file or folder (the engine benchmark).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Prompt length per sequence (engine benchmark).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Generated tokens per sequence (engine benchmark).
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Concurrent sequences, comma-separated (engine benchmark).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub concurrency: Vec<usize>,
    /// Benchmark the matmul kernels alone.
    #[arg(long)]
    pub kernels: bool,
    /// Matmul mode(s) for `--kernels`: exact, fast or both.
    #[arg(long, default_value = "both")]
    pub mode: String,
    /// Instruction set for `--kernels` (scalar, avx2, avx512); default: the best available.
    #[arg(long)]
    pub isa: Option<Isa>,
    /// Minimum seconds per measurement.
    #[arg(long, default_value_t = 0.5)]
    pub min_time: f64,
    /// Clock for `--kernels`: `wall`, or `cpu` (on-CPU time of the benchmarking thread; with
    /// `--threads 1` it ignores time lost to other processes on a loaded machine; Linux only).
    #[arg(long, value_enum, default_value = "wall")]
    pub clock: Clock,
    /// Weight shape `N×K` of the per-dtype kernel table (K a multiple of 256).
    #[arg(long, default_value = "576x1536")]
    pub shape: String,
    /// Replay decode steps from CUDA graphs (`engine.cuda_graphs`; ignored on the CPU).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cuda_graphs: bool,
    /// Build the next step while the device runs the current one (`engine.overlap`; the CPU
    /// computes at submission and ignores it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub overlap: bool,
    /// Longest sequence the engine takes (`engine.max_model_len`; 0: the model's context). The
    /// decode graphs are shaped for it (the attention split of their steps), so a short one
    /// measures what that shaping costs short contexts.
    #[arg(long, default_value_t = 0)]
    pub max_model_len: usize,
    /// Print one JSON object per result line instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seeded random weights of this model instead of a file (`qwen3.5-27b`; GPU only): the
    /// whole model through the Qwen3.5 runner: load, device memory, decode and prefill
    /// tokens/s, batch-1 roofline fraction (see `bench_synthetic`).
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Packing of the `--synthetic` weights: w4a16, nvfp4 or bf16.
    #[arg(long, default_value = "w4a16")]
    pub quant: String,
    /// `--synthetic`: time the linear layers alone (one matmul per weight) instead of the
    /// whole model.
    #[arg(long)]
    pub synthetic_linears: bool,
    /// `--synthetic`: decode batch sizes (sequences of `--prompt-tokens`, `--gen-tokens`
    /// decode steps each).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub synthetic_batches: Vec<usize>,
    /// `--synthetic`: prefill lengths (one sequence in one step each; `0` alone: none).
    #[arg(long, value_delimiter = ',', default_value = "1024,8192")]
    pub synthetic_prefill: Vec<usize>,
}

/// How a kernel measurement is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// Elapsed time.
    Wall,
    /// Time the measuring thread spent on a CPU (only meaningful with one worker thread).
    Cpu,
}

impl Clock {
    /// Seconds on this clock since an arbitrary origin.
    fn now(self, origin: Instant) -> f64 {
        match self {
            Clock::Wall => origin.elapsed().as_secs_f64(),
            Clock::Cpu => thread_cpu_seconds().unwrap_or(f64::NAN),
        }
    }
}

/// On-CPU seconds of the calling thread (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`).
#[cfg(target_os = "linux")]
fn thread_cpu_seconds() -> Option<f64> {
    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock_id: i32, tp: *mut Timespec) -> i32;
    }
    /// `CLOCK_THREAD_CPUTIME_ID` in `<time.h>` on Linux.
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` (two 64-bit fields on 64-bit Linux, as
    // declared) through a valid pointer to a local, and reads nothing else.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// Thread CPU time is read through Linux's `clock_gettime` only.
#[cfg(not(target_os = "linux"))]
fn thread_cpu_seconds() -> Option<f64> {
    None
}

/// Why `kiln bench` could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// The thread pool could not start.
    #[error("cannot start the thread pool: {0}")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),
    /// The engine could not start (model, config).
    #[error("engine: {0}")]
    Start(#[from] crate::engine::StartError),
    /// A benchmark request failed.
    #[error("request failed: {0}")]
    Request(#[from] crate::error::EngineError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Run `kiln bench`.
pub fn run(args: &BenchArgs) -> Result<(), BenchError> {
    let device: crate::engine::Device = args
        .device
        .parse()
        .map_err(|e| BenchError::InvalidArgument(format!("`--device {}`: {e}", args.device)))?;
    if let Some(model) = &args.synthetic {
        let synthetic = super::bench_synthetic::SyntheticArgs {
            model: model.clone(),
            quant: args.quant.clone(),
            dtype: args.dtype.clone(),
            json: args.json,
            linears_only: args.synthetic_linears,
            batches: args.synthetic_batches.clone(),
            prompt_tokens: args.prompt_tokens,
            gen_tokens: args.gen_tokens,
            prefill: args
                .synthetic_prefill
                .iter()
                .copied()
                .filter(|&p| p > 0)
                .collect(),
            cuda_graphs: args.cuda_graphs,
        };
        return super::bench_synthetic::run(&synthetic, device);
    }
    if args.kernels && device != crate::engine::Device::Cpu {
        return Err(BenchError::InvalidArgument(
            "`--kernels` benchmarks the CPU matmul kernels: use `--device cpu`".into(),
        ));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .thread_name(|i| format!("kiln-bench-{i}"))
        .build()?;
    if args.kernels {
        pool.install(|| kernels::kernels(args))
    } else {
        drop(pool);
        engine(args, device)
    }
}

/// One `--concurrency` result of the engine benchmark.
struct EngineResult {
    concurrency: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    max_ttft: Duration,
    max_total: Duration,
}

/// `kiln bench` on the real engine.
fn engine(args: &BenchArgs, device: crate::engine::Device) -> Result<(), BenchError> {
    use crate::engine::{spawn_from_path, EngineConfig};
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        return Err(BenchError::InvalidArgument(
            "`--concurrency` needs counts ≥ 1".into(),
        ));
    }
    if args.prompt_tokens == 0 || args.gen_tokens < 2 {
        return Err(BenchError::InvalidArgument(
            "`--prompt-tokens` must be ≥ 1 and `--gen-tokens` ≥ 2".into(),
        ));
    }
    let model = args.model.clone().unwrap_or_else(|| {
        std::path::Path::new("models").join(crate::model::fetch::DEFAULT_MODEL_FILE)
    });
    let max_c = *args.concurrency.iter().max().unwrap_or(&1);
    let cfg = EngineConfig {
        device,
        dtype: args.dtype.clone(),
        kv_cache_dtype: args.kv_cache_dtype.clone(),
        threads: args.threads,
        max_num_seqs: max_c,
        max_num_batched_tokens: (max_c * args.prompt_tokens).clamp(2048, 16384),
        enable_prefix_caching: false,
        cuda_graphs: args.cuda_graphs,
        overlap: args.overlap,
        max_model_len: args.max_model_len,
        ..EngineConfig::default()
    };
    let engine = spawn_from_path(&model, cfg)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let load = load_average().unwrap_or_else(|| "unknown".into());
    let mode = crate::backend::cpu::matmul::MatmulMode::from_env();
    let weight_bytes = engine.info().weight_bytes;
    let peak = args.peak_gbps.or_else(|| device_peak_gbps(device));
    if !args.json {
        println!(
            "# kiln engine: {}, model {}, matmul {} (CPU), cuda_graphs {}, overlap {}, prompt {} tokens, {} generated, load average {load}",
            engine.info().device,
            model.display(),
            mode_name(mode),
            args.cuda_graphs,
            args.overlap,
            args.prompt_tokens,
            args.gen_tokens
        );
        println!(
            "# weights read per decode step: {:.1} MB; peak bandwidth: {}",
            weight_bytes as f64 / 1e6,
            peak.map_or("unknown (--peak-gbps)".into(), |p| format!("{p:.0} GB/s"))
        );
        println!();
        println!("| sequences | prefill tokens/s | decode tokens/s | decode weight GB/s | of peak | max TTFT ms | max total ms |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
    }
    // Warm-up: page the weights in, start the threads.
    runtime.block_on(run_batch(&engine, 1, 8, 4, 1))?;
    for (round, &c) in args.concurrency.iter().enumerate() {
        // Warm-up at this size too, with prompts as long as the measured ones: a decode graph
        // for this batch is recorded here, not in the measured run, and the prefill path of
        // this prompt length (cuBLAS shapes, kernels loaded on first use) has run once.
        runtime.block_on(run_batch(
            &engine,
            c,
            args.prompt_tokens,
            4,
            500 + round as u64,
        ))?;
        let r = runtime.block_on(run_batch(
            &engine,
            c,
            args.prompt_tokens,
            args.gen_tokens,
            1000 + round as u64,
        ))?;
        // Every decode step streams the weights once for all sequences of the batch.
        let weight_gbps = r.decode_tokens_per_s / r.concurrency as f64 * weight_bytes as f64 / 1e9;
        let of_peak = peak.map(|p| weight_gbps / p);
        if args.json {
            let v = serde_json::json!({
                "bench": "engine", "device": engine.info().device, "model": model.display().to_string(),
                "matmul": mode_name(mode), "cuda_graphs": args.cuda_graphs, "overlap": args.overlap, "load": load, "concurrency": r.concurrency,
                "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                "prefill_tokens_per_s": r.prefill_tokens_per_s,
                "decode_tokens_per_s": r.decode_tokens_per_s,
                "max_ttft_ms": r.max_ttft.as_secs_f64() * 1e3, "max_total_ms": r.max_total.as_secs_f64() * 1e3,
                "weight_bytes": weight_bytes, "decode_weight_gbps": weight_gbps, "peak_gbps": peak,
                "decode_of_peak": of_peak,
            });
            println!("{v}");
        } else {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.1} |",
                r.concurrency,
                r.prefill_tokens_per_s,
                r.decode_tokens_per_s,
                weight_gbps,
                of_peak.map_or("–".into(), |f| format!("{:.1}%", 100.0 * f)),
                r.max_ttft.as_secs_f64() * 1e3,
                r.max_total.as_secs_f64() * 1e3
            );
        }
    }
    engine.shutdown();
    Ok(())
}

/// The theoretical memory bandwidth of `device` from the driver, when it is a GPU.
fn device_peak_gbps(device: crate::engine::Device) -> Option<f64> {
    #[cfg(feature = "cuda")]
    if let crate::engine::Device::Cuda(n) = device {
        let (_, gpus) = crate::backend::cuda::device::list_gpus().ok()?;
        return gpus
            .into_iter()
            .find(|g| g.ordinal == n)?
            .peak_bandwidth_gbps;
    }
    let _ = device;
    None
}

/// Submit `c` requests of `prompt` random token ids at once, each generating exactly `gen`
/// tokens, and wait for all of them.
async fn run_batch(
    engine: &crate::engine::EngineHandle,
    c: usize,
    prompt: usize,
    gen: usize,
    seed: u64,
) -> Result<EngineResult, BenchError> {
    use crate::engine::{GenerateRequest, Prompt, SamplingParams};
    let mut rng = StdRng::seed_from_u64(seed);
    let pending: Vec<_> = (0..c)
        .map(|_| {
            // Ordinary vocabulary ids of SmolLM2-sized vocabularies; different per request,
            // so no two prompts share a KV block.
            let ids: Vec<u32> = (0..prompt).map(|_| rng.random_range(1000..30000)).collect();
            engine.submit(GenerateRequest {
                prompt: Prompt::TokenIds(ids),
                sampling: SamplingParams {
                    max_tokens: Some(gen as u32),
                    ignore_eos: true,
                    ..SamplingParams::default()
                },
                deadline: None,
            })
        })
        .collect();
    let mut max_ttft = Duration::ZERO;
    let mut max_total = Duration::ZERO;
    for p in pending {
        let done = p.await?;
        if done.usage.completion_tokens as usize != gen {
            return Err(BenchError::InvalidArgument(format!(
                "a request generated {} tokens, not {gen} (max_model_len too small?)",
                done.usage.completion_tokens
            )));
        }
        max_ttft = max_ttft.max(done.timings.ttft);
        max_total = max_total.max(done.timings.total);
    }
    let decode_time = (max_total - max_ttft).as_secs_f64().max(1e-9);
    Ok(EngineResult {
        concurrency: c,
        prefill_tokens_per_s: (c * prompt) as f64 / max_ttft.as_secs_f64().max(1e-9),
        decode_tokens_per_s: (c * (gen - 1)) as f64 / decode_time,
        max_ttft,
        max_total,
    })
}

/// Load average (1, 5, 15 minutes) from `/proc/loadavg`, if readable.
pub fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}
