//! `kiln bench --synthetic qwen3.5-27b --quant w4a16|nvfp4|bf16 --device cuda[:N]`: the seeded
//! random Qwen3.5-27B text weights ([`crate::model::synthetic`], no files) on a GPU.
//!
//! Two modes:
//! - the whole model (default, [`full`]): loaded through the real runner path (planner, KV
//!   cache, GDN state slots), then load time, device memory, decode tokens/s at 1 / 8 / 32
//!   sequences, prefill tokens/s at 1K / 8K, and the batch-1 decode against its roofline;
//! - `--synthetic-linears`: the layer stack's linear layers alone (every linear of the 64
//!   layers plus `lm_head`, one matmul each) at 1 / 8 / 32 rows (decode batches) and 1,024 rows
//!   (a prefill chunk). Attention, the Gated DeltaNet recurrence, norms and sampling are not
//!   run, so its tokens/s are upper bounds from the linears' time. `weights_GBps` = bytes of
//!   the timed weights / time per step.

#[cfg(feature = "cuda")]
pub mod full;

use std::time::Instant;

use super::bench::BenchError;
use crate::engine::Device;

/// The models `--synthetic` knows.
const MODELS: [&str; 1] = ["qwen3.5-27b"];

/// What `kiln bench --synthetic` was asked for.
#[derive(Debug, Clone)]
pub struct SyntheticArgs {
    /// `qwen3.5-27b`.
    pub model: String,
    /// `w4a16`, `nvfp4` or `bf16`.
    pub quant: String,
    /// Compute dtype (`engine.dtype`).
    pub dtype: String,
    /// JSON lines instead of text.
    pub json: bool,
    /// Time the linear layers alone (the former mode) instead of the whole model.
    pub linears_only: bool,
    /// Decode batch sizes (sequences).
    pub batches: Vec<usize>,
    /// Prompt tokens per decode sequence.
    pub prompt_tokens: usize,
    /// Decode steps timed per batch.
    pub gen_tokens: usize,
    /// Prefill lengths (one sequence, one step each).
    pub prefill: Vec<usize>,
    /// Replay the decode steps from the runner's CUDA graphs (`--cuda-graphs`, the engine's
    /// `engine.cuda_graphs`); prefill steps run eagerly either way.
    pub cuda_graphs: bool,
}

/// Run the synthetic benchmark.
pub fn run(args: &SyntheticArgs, device: Device) -> Result<(), BenchError> {
    use crate::model::synthetic::SyntheticQuant;
    let (model, quant) = (args.model.as_str(), args.quant.as_str());
    if !MODELS.contains(&model) {
        return Err(BenchError::InvalidArgument(format!(
            "`--synthetic {model}`: known models are {MODELS:?}"
        )));
    }
    let q = match quant {
        "w4a16" => SyntheticQuant::W4A16,
        "nvfp4" => SyntheticQuant::Nvfp4,
        "bf16" => SyntheticQuant::Bf16,
        other => {
            return Err(BenchError::InvalidArgument(format!(
                "`--quant {other}`: one of w4a16, nvfp4, bf16"
            )))
        }
    };
    let ordinal = match device {
        Device::Cuda(n) => n,
        Device::Auto => 0,
        Device::Cpu => {
            return Err(BenchError::InvalidArgument(
                "`--synthetic` benchmarks a GPU: use `--device cuda` (the CPU reference would \
                 need the whole 27B in host memory and minutes per step)"
                    .into(),
            ))
        }
    };
    if args.linears_only {
        return gpu(ordinal, q, quant, &args.dtype, args.json, Instant::now());
    }
    if args.batches.contains(&0) || args.prompt_tokens == 0 {
        return Err(BenchError::InvalidArgument(
            "`--synthetic-batches` and `--prompt-tokens` must be positive".into(),
        ));
    }
    whole(ordinal, q, args)
}

#[cfg(feature = "cuda")]
fn whole(
    ordinal: usize,
    q: crate::model::synthetic::SyntheticQuant,
    args: &SyntheticArgs,
) -> Result<(), BenchError> {
    full::measure(ordinal, q, &args.quant, args).map(|_| ())
}

#[cfg(not(feature = "cuda"))]
fn whole(
    _ordinal: usize,
    _q: crate::model::synthetic::SyntheticQuant,
    _args: &SyntheticArgs,
) -> Result<(), BenchError> {
    Err(BenchError::InvalidArgument(
        "`--synthetic` needs a build with `--features cuda`".into(),
    ))
}

#[cfg(not(feature = "cuda"))]
fn gpu(
    _ordinal: usize,
    _q: crate::model::synthetic::SyntheticQuant,
    _quant: &str,
    _dtype: &str,
    _json: bool,
    _t0: Instant,
) -> Result<(), BenchError> {
    Err(BenchError::InvalidArgument(
        "`--synthetic` needs a build with `--features cuda`".into(),
    ))
}

#[cfg(feature = "cuda")]
fn gpu(
    ordinal: usize,
    q: crate::model::synthetic::SyntheticQuant,
    quant: &str,
    dtype: &str,
    json: bool,
    t0: Instant,
) -> Result<(), BenchError> {
    use crate::backend::cuda::CudaBackend;
    use crate::backend::Backend;
    use crate::model::synthetic::qwen3_5_27b_weights;
    use crate::tensor::TensorView;

    let fail = |what: &str, e: &dyn std::fmt::Display| {
        BenchError::InvalidArgument(format!("--synthetic: {what}: {e}"))
    };
    let b = CudaBackend::new(ordinal, dtype, "auto", None).map_err(|e| fail("CUDA backend", &e))?;
    let (free0, total) = b.memory_info().map_err(|e| fail("memory info", &e))?;
    let src = qwen3_5_27b_weights(q, 1);
    // (module or tensor name, weight, rows × cols) of every matmul weight; vectors kept alive.
    let mut linears = Vec::new();
    let mut embed = None;
    let mut vectors = Vec::new();
    let part = [
        ".weight_scale",
        ".weight_zero_point",
        ".weight_shape",
        ".weight_global_scale",
    ];
    for name in src.names() {
        if let Some(module) = name.strip_suffix(".weight_packed") {
            let view = src.linear(module).map_err(|e| fail(module, &e))?;
            let w = b
                .upload_linear(module, &view)
                .map_err(|e| fail(module, &e))?;
            linears.push((module.to_owned(), w));
        } else if part.iter().any(|s| name.ends_with(s)) {
            // Parts of the packed linears above.
        } else {
            let view = src.tensor(&name).map_err(|e| fail(&name, &e))?;
            if view.shape.len() == 2 {
                let w = b.upload_weight(&name, &view).map_err(|e| fail(&name, &e))?;
                if name.contains("embed_tokens") {
                    embed = Some(w);
                } else {
                    linears.push((name.clone(), w));
                }
            } else {
                let flat = [view.numel()];
                let flat_view = TensorView {
                    dtype: view.dtype,
                    shape: &flat,
                    data: view.data,
                };
                let v = b
                    .upload_vector(&name, &flat_view)
                    .map_err(|e| fail(&name, &e))?;
                vectors.push(v);
            }
        }
    }
    b.synchronize().map_err(|e| fail("sync", &e))?;
    let load_s = t0.elapsed().as_secs_f64();
    let (free1, _) = b.memory_info().map_err(|e| fail("memory info", &e))?;
    let gib = |x: usize| x as f64 / (1u64 << 30) as f64;
    let used = free0.saturating_sub(free1);
    let weight_bytes: usize = linears.iter().map(|(_, w)| b.weight_bytes(w)).sum();
    let embed_bytes = embed.as_ref().map_or(0, |w| b.weight_bytes(w));
    if json {
        println!(
            "{}",
            serde_json::json!({"bench": "synthetic", "model": "qwen3.5-27b", "quant": quant,
                "device": b.name(), "device_used_gib": gib(used), "linear_gib": gib(weight_bytes),
                "embedding_gib": gib(embed_bytes), "vectors": vectors.len(), "load_s": load_s})
        );
    } else {
        println!("device: {} ({:.1} GiB)", b.name(), gib(total));
        println!(
            "qwen3.5-27b {quant}: device memory used {:.2} GiB (matmul weights {:.2} GiB, embeddings {:.2} GiB, {} vectors), loaded in {load_s:.1} s",
            gib(used),
            gib(weight_bytes),
            gib(embed_bytes),
            vectors.len()
        );
        println!("linear stack only (no attention / GDN / norms): one matmul per weight");
    }
    let max_rows = 1024usize;
    let widest = linears
        .iter()
        .map(|(_, w)| w_dims(&b, w))
        .fold((0, 0), |a, d| (a.0.max(d.0), a.1.max(d.1)));
    let x = b
        .upload(&vec![0.01f32; max_rows * widest.1])
        .map_err(|e| fail("input", &e))?;
    let mut out = b
        .alloc(max_rows * widest.0)
        .map_err(|e| fail("output", &e))?;
    for rows in [1usize, 8, 32, 1024] {
        let mut step = || -> Result<(), BenchError> {
            for (name, w) in &linears {
                b.matmul(&x, rows, w, &mut out)
                    .map_err(|e| fail(name, &e))?;
            }
            Ok(())
        };
        step()?;
        b.synchronize().map_err(|e| fail("sync", &e))?;
        let reps = if rows >= 1024 { 3 } else { 10 };
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            step()?;
            b.synchronize().map_err(|e| fail("sync", &e))?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let t = times[reps / 2];
        let gbps = weight_bytes as f64 / t / 1e9;
        if json {
            println!(
                "{}",
                serde_json::json!({"bench": "synthetic-linears", "quant": quant, "rows": rows,
                    "step_ms": t * 1e3, "tokens_per_s_bound": rows as f64 / t, "weights_GBps": gbps})
            );
        } else {
            println!(
                "  rows {rows:>5}: {:>8.2} ms per step of linears, ≤ {:>9.0} tokens/s, weights {gbps:.0} GB/s",
                t * 1e3,
                rows as f64 / t
            );
        }
    }
    Ok(())
}

/// (rows, cols) of a weight: output features and input features.
#[cfg(feature = "cuda")]
fn w_dims(
    b: &crate::backend::cuda::CudaBackend,
    w: &<crate::backend::cuda::CudaBackend as crate::backend::Backend>::Weight,
) -> (usize, usize) {
    b.weight_shape(w)
}
