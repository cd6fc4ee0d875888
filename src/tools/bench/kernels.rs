//! `kiln bench --kernels`: the CPU matmul kernels alone, per weight dtype and batch (µs per
//! call, GFLOP/s, weight GB/s), then the matmul stack of one SmolLM2-135M forward step on
//! synthetic weights of its real shapes (see `bench.rs`'s header for the definitions and the
//! timing rule).

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{load_average, BenchArgs, BenchError, Clock};
use crate::backend::cpu::matmul::{matmul_on, HugePageBytes, Isa, MatmulMode};
use crate::tensor::{TensorView, WeightDType};

/// The modes named by `--mode`.
fn modes(arg: &str) -> Result<Vec<MatmulMode>, BenchError> {
    match arg {
        "exact" => Ok(vec![MatmulMode::Exact]),
        "fast" => Ok(vec![MatmulMode::Fast]),
        "both" => Ok(vec![MatmulMode::Exact, MatmulMode::Fast]),
        other => Err(BenchError::InvalidArgument(format!(
            "`--mode {other}`: expected exact, fast or both"
        ))),
    }
}

/// Median seconds per call of `f` on `clock` (one warm-up call first). Calls are timed in
/// batches of at least ~2 ms so the clock's own cost does not count.
fn time_median(clock: Clock, min_time: f64, mut f: impl FnMut()) -> f64 {
    let origin = Instant::now();
    let t0 = clock.now(origin);
    f();
    let once = (clock.now(origin) - t0).max(1e-7);
    let batch = ((2e-3 / once).ceil() as usize).clamp(1, 10_000);
    let mut samples = Vec::new();
    while samples.len() < 3 || origin.elapsed() < Duration::from_secs_f64(min_time) {
        let t = clock.now(origin);
        for _ in 0..batch {
            f();
        }
        samples.push((clock.now(origin) - t) / batch as f64);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Random stored bytes of an `[n, k]` weight with finite values and sane block scales.
fn synthetic_weight(rng: &mut StdRng, dtype: WeightDType, n: usize, k: usize) -> Vec<u8> {
    let rb = dtype.row_bytes(k).expect("k is a whole number of blocks");
    let mut data = vec![0u8; n * rb];
    match dtype {
        WeightDType::F32 => data
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&rng.random_range(-0.1f32..0.1).to_le_bytes())),
        WeightDType::F16 => data.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&half::f16::from_f32(rng.random_range(-0.1f32..0.1)).to_le_bytes())
        }),
        WeightDType::BF16 => data.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&half::bf16::from_f32(rng.random_range(-0.1f32..0.1)).to_le_bytes())
        }),
        _ => {
            rng.fill(&mut data[..]);
            let scale = half::f16::from_f32(0.01).to_le_bytes();
            let scale_at: &[usize] = match dtype {
                WeightDType::Q8_0 | WeightDType::Q4_0 => &[0],
                WeightDType::Q4_1 | WeightDType::Q4K => &[0, 2],
                WeightDType::Q6K => &[208],
                _ => &[],
            };
            for block in data.chunks_exact_mut(dtype.block_bytes()) {
                for &at in scale_at {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
        }
    }
    data
}

/// One kernel measurement.
struct KernelResult {
    dtype: WeightDType,
    mode: MatmulMode,
    m: usize,
    n: usize,
    k: usize,
    seconds: f64,
    weight_bytes: usize,
}

impl KernelResult {
    fn gflops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64 / self.seconds / 1e9
    }
    fn gbps(&self) -> f64 {
        self.weight_bytes as f64 / self.seconds / 1e9
    }
}

/// `kiln bench --kernels`.
pub(super) fn kernels(args: &BenchArgs) -> Result<(), BenchError> {
    let isa = args.isa.unwrap_or_else(Isa::best);
    if !isa.is_supported() {
        return Err(BenchError::InvalidArgument(format!(
            "this CPU does not run `{isa}`"
        )));
    }
    let modes = modes(&args.mode)?;
    let threads = rayon::current_num_threads();
    let load = load_average().unwrap_or_else(|| "unknown".into());
    if args.clock == Clock::Cpu && threads > 1 {
        return Err(BenchError::InvalidArgument(
            "`--clock cpu` times one thread: use it with `--threads 1`".into(),
        ));
    }
    if !args.json {
        println!(
            "# kiln matmul kernels: isa {isa}, {threads} threads, {:?} clock, load average {load}",
            args.clock
        );
        println!();
        println!("| dtype | mode | m | n × k | µs/call | GFLOP/s | weight GB/s |");
        println!("|---|---|---:|---:|---:|---:|---:|");
    }
    let mut rng = StdRng::seed_from_u64(7);
    // Default: the SmolLM2 down_proj shape; k = 1536 is a whole number of every block size.
    let (n, k) = parse_shape(&args.shape)?;
    let dtypes = [
        WeightDType::F32,
        WeightDType::F16,
        WeightDType::BF16,
        WeightDType::Q8_0,
        WeightDType::Q4_0,
        WeightDType::Q4_1,
        WeightDType::Q4K,
        WeightDType::Q6K,
    ];
    for dtype in dtypes {
        let data = synthetic_weight(&mut rng, dtype, n, k);
        let shape = [n, k];
        let w = TensorView {
            dtype,
            shape: &shape,
            data: &data,
        };
        for &mode in &modes {
            if mode == MatmulMode::Fast && !has_fast_kernel(dtype) {
                continue;
            }
            for m in [1, 16, 128] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let mut out = vec![0.0f32; m * n];
                let seconds = time_median(args.clock, args.min_time, || {
                    matmul_on(isa, mode, &x, m, k, &w, &mut out);
                });
                let r = KernelResult {
                    dtype,
                    mode,
                    m,
                    n,
                    k,
                    seconds,
                    weight_bytes: data.len(),
                };
                print_kernel(args.json, isa, threads, &load, &r);
            }
        }
    }
    stack(args, isa, &modes, &load)
}

/// `N×K` (or `NxK`) → (N, K), K a multiple of 256.
fn parse_shape(s: &str) -> Result<(usize, usize), BenchError> {
    let bad = || {
        BenchError::InvalidArgument(format!(
            "`--shape {s}`: expected N×K with K a multiple of 256"
        ))
    };
    let (n, k) = s.split_once(['x', '×']).ok_or_else(bad)?;
    let (n, k): (usize, usize) = (
        n.trim().parse().map_err(|_| bad())?,
        k.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || k == 0 || k % 256 != 0 {
        return Err(bad());
    }
    Ok((n, k))
}

/// Whether `mode = Fast` has integer kernels for `dtype` (others run exact).
fn has_fast_kernel(dtype: WeightDType) -> bool {
    matches!(
        dtype,
        WeightDType::Q8_0 | WeightDType::Q4_0 | WeightDType::Q4_1
    )
}

pub(super) fn mode_name(mode: MatmulMode) -> &'static str {
    match mode {
        MatmulMode::Exact => "exact",
        MatmulMode::Fast => "fast",
    }
}

fn print_kernel(json: bool, isa: Isa, threads: usize, load: &str, r: &KernelResult) {
    if json {
        let v = serde_json::json!({
            "bench": "kernel", "isa": isa.as_str(), "threads": threads, "load": load,
            "dtype": format!("{:?}", r.dtype), "mode": mode_name(r.mode), "m": r.m, "n": r.n,
            "k": r.k, "us_per_call": r.seconds * 1e6, "gflops": r.gflops(), "weight_gbps": r.gbps(),
        });
        println!("{v}");
    } else {
        println!(
            "| {:?} | {} | {} | {} × {} | {:.1} | {:.1} | {:.2} |",
            r.dtype,
            mode_name(r.mode),
            r.m,
            r.n,
            r.k,
            r.seconds * 1e6,
            r.gflops(),
            r.gbps()
        );
    }
}

/// The matmuls of one SmolLM2-135M forward step, on synthetic weights of its real shapes and
/// dtypes (as stored in `SmolLM2-135M-Instruct.Q4_1.gguf`).
fn stack(args: &BenchArgs, isa: Isa, modes: &[MatmulMode], load: &str) -> Result<(), BenchError> {
    const LAYERS: usize = 30;
    const HIDDEN: usize = 576;
    const KV: usize = 192;
    const FFN: usize = 1536;
    const VOCAB: usize = 49152;
    let mut rng = StdRng::seed_from_u64(11);
    // Per layer: q, k, v, o, gate, up, down as [n, k].
    let layer_shapes = [
        [HIDDEN, HIDDEN],
        [KV, HIDDEN],
        [KV, HIDDEN],
        [HIDDEN, HIDDEN],
        [FFN, HIDDEN],
        [FFN, HIDDEN],
        [HIDDEN, FFN],
    ];
    // Stored like the CPU backend stores weights: in huge-page-backed memory.
    let mut weights: Vec<(WeightDType, [usize; 2], HugePageBytes)> = Vec::new();
    for _ in 0..LAYERS {
        for s in layer_shapes {
            let data = synthetic_weight(&mut rng, WeightDType::Q4_1, s[0], s[1]);
            weights.push((WeightDType::Q4_1, s, HugePageBytes::copy_from(&data)));
        }
    }
    let embed = synthetic_weight(&mut rng, WeightDType::Q8_0, VOCAB, HIDDEN);
    weights.push((
        WeightDType::Q8_0,
        [VOCAB, HIDDEN],
        HugePageBytes::copy_from(&embed),
    ));
    let threads = rayon::current_num_threads();
    if !args.json {
        println!();
        println!("# SmolLM2-135M matmul stack (30 × 7 Q4_1 projections + the Q8_0 lm_head)");
        println!();
        println!("| mode | step | tokens | ms/step | tokens/s (matmuls only) |");
        println!("|---|---|---:|---:|---:|");
    }
    // (what, tokens per step, rows that need logits)
    let scenarios = [
        ("decode, 1 sequence", 1, 1),
        ("decode, 16 sequences", 16, 16),
        ("prefill, 128-token prompt", 128, 1),
    ];
    for &mode in modes {
        for (what, m, logits) in scenarios {
            let x: Vec<f32> = (0..m * FFN)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let mut out = vec![0.0f32; m * FFN.max(VOCAB)];
            let seconds = time_median(args.clock, args.min_time, || {
                for (dtype, shape, data) in &weights {
                    let w = TensorView {
                        dtype: *dtype,
                        shape,
                        data,
                    };
                    let (n, k) = (shape[0], shape[1]);
                    let rows = if n == VOCAB { logits } else { m };
                    matmul_on(isa, mode, &x[..rows * k], rows, k, &w, &mut out[..rows * n]);
                }
            });
            let tps = m as f64 / seconds;
            if args.json {
                let v = serde_json::json!({
                    "bench": "stack", "model": "SmolLM2-135M (synthetic Q4_1)", "isa": isa.as_str(),
                    "threads": threads, "load": load, "mode": mode_name(mode), "scenario": what,
                    "tokens_per_step": m, "ms_per_step": seconds * 1e3, "tokens_per_s": tps,
                });
                println!("{v}");
            } else {
                println!(
                    "| {} | {what} | {m} | {:.2} | {:.0} |",
                    mode_name(mode),
                    seconds * 1e3,
                    tps
                );
            }
        }
    }
    Ok(())
}
