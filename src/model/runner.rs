//! From model files and [`RunnerOptions`] to a [`ModelRunner`]: the one place that names a
//! concrete backend.
//!
//! `engine.device` picks the backend (`cpu`; `auto` means CUDA device 0 when the build has the
//! `cuda` feature and a GPU is visible, else the CPU; `cuda:N` is a clear error in a build
//! without the feature). The CPU KV cache gets `engine.kv_cache_mib` MiB: as many blocks of
//! `engine.block_size` tokens as fit; on GPUs the memory planner ([`crate::model::memory`])
//! sizes it.

use tracing::info;

use crate::backend::{Backend, CpuBackend, KvCacheDType};
use crate::error::ModelError;
use crate::model::files::ModelFiles;
use crate::model::llama::Llama;
use crate::model::options::{Device, RunnerOptions};
use crate::model::step::ModelRunner;
use crate::model::{Architecture, ModelConfig};
use crate::tensor::WeightSource;

/// Load the model in `files` onto the device `opts.device` names.
pub fn build_runner(
    files: &ModelFiles,
    opts: &RunnerOptions,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    build_runner_for(&files.config, files.weights.as_ref(), opts)
}

/// Load `config`'s model from `weights` onto the device `opts.device` names.
pub fn build_runner_for(
    config: &ModelConfig,
    weights: &dyn WeightSource,
    opts: &RunnerOptions,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    match resolve_auto(opts.device) {
        Device::Cpu | Device::Auto => {
            let kv = KvCacheDType::parse(&opts.kv_cache_dtype).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "engine.kv_cache_dtype `{}` (use auto, fp8_e5m2 or fp8_e4m3)",
                    opts.kv_cache_dtype
                ))
            })?;
            if kv != KvCacheDType::Same {
                tracing::warn!(
                    kv_cache_dtype = %opts.kv_cache_dtype,
                    "The CPU keeps its KV cache in f32 and only rounds it through fp8 (the GPU's \
                     numerics, for checking them): no memory is saved."
                );
            }
            let backend = CpuBackend::new(opts.threads)
                .map_err(|e| ModelError::Backend(e.to_string()))?
                .with_kv_storage(kv);
            if config.architecture == Architecture::Qwen3_5 {
                // KV blocks and state slots share `engine.kv_cache_mib`.
                return crate::model::qwen3_5::load_cpu(backend, config, weights, opts);
            }
            let num_blocks =
                blocks_for_budget(&backend, config, opts.block_size, opts.kv_cache_mib)?;
            // The CPU workspace grows with the steps it sees (host memory is not planned); the
            // CPU has no graphs (`engine.cuda_graphs` is ignored).
            load_on(
                backend,
                config,
                weights,
                opts.block_size,
                num_blocks,
                (0, 0),
                None,
            )
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => Err(ModelError::Unsupported(format!(
            "device `cuda:{n}`: this kiln was built without the `cuda` feature (rebuild with \
             `cargo build --release --features cuda`, or set `engine.device = \"cpu\"`)"
        ))),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => load_cuda(n, config, weights, opts),
    }
}

/// `auto` means CUDA device 0 when this build has the `cuda` feature and a GPU is visible,
/// else the CPU.
fn resolve_auto(device: Device) -> Device {
    #[cfg(feature = "cuda")]
    if device == Device::Auto {
        let has_gpu = crate::backend::cuda::device::require_driver().is_ok()
            && crate::backend::cuda::device::list_gpus()
                .map(|(_, g)| !g.is_empty())
                .unwrap_or(false);
        return if has_gpu {
            Device::Cuda(0)
        } else {
            Device::Cpu
        };
    }
    device
}

/// The model on CUDA device `ordinal`, with its KV cache sized by the memory planner.
/// `KILN_CUDA_ARCH` (e.g. `compute_70`) compiles the kernels for another target than the
/// device's, to run the V100 path on a newer GPU through the driver's JIT.
#[cfg(feature = "cuda")]
fn load_cuda(
    ordinal: usize,
    config: &ModelConfig,
    weights: &dyn WeightSource,
    opts: &RunnerOptions,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    use crate::backend::cuda::{Arch, CudaBackend};
    use crate::model::memory::{decode_graph_bytes, plan, workspace_bytes, PlanInput};

    let cuda_err = |e: crate::backend::cuda::CudaError| {
        ModelError::Backend(format!("device `cuda:{ordinal}`: {e}"))
    };
    let arch_override = match std::env::var("KILN_CUDA_ARCH") {
        Ok(a) => Some(a.parse::<Arch>().map_err(ModelError::Unsupported)?),
        Err(_) => None,
    };
    let backend = CudaBackend::new(ordinal, &opts.dtype, &opts.kv_cache_dtype, arch_override)
        .map_err(cuda_err)?;
    let (free, total) = backend
        .memory_info()
        .map_err(|e| ModelError::Backend(e.to_string()))?;
    let elem = backend.dtype().size();
    let weights_bytes = crate::model::memory::weights_device_bytes(weights, elem);
    let max_model_len = match opts.max_model_len {
        0 => config.max_position_embeddings,
        n => n.min(config.max_position_embeddings),
    };
    let hybrid = config.architecture == Architecture::Qwen3_5;
    let bytes_per_block = backend.kv_bytes_per_block(&if hybrid {
        // Only the full-attention layers of a hybrid model have KV.
        crate::model::qwen3_5::kv_spec(config, opts.block_size, 1)
    } else {
        Llama::<CudaBackend>::kv_spec(config, opts.block_size, 1)
    });
    // Decode graphs (every architecture): their partials and metadata per bucket, and one
    // scratch KV block, counted with the workspace.
    let cuda_graphs = opts.cuda_graphs;
    let graph_bytes = if cuda_graphs {
        decode_graph_bytes(
            config,
            opts.max_num_seqs,
            max_model_len,
            opts.block_size,
            bytes_per_block,
        )
    } else {
        0
    };
    // The hybrid's chunked-prefill workspace, made once at load for `max_num_batched_tokens`.
    let prefill_bytes = if hybrid {
        use crate::backend::hybrid::HybridBackend;
        backend.prefill_workspace_bytes(
            &crate::model::qwen3_5::gdn_params(config)?,
            opts.max_num_batched_tokens,
            opts.max_num_seqs,
        )
    } else {
        0
    };
    let input = PlanInput {
        free_bytes: free,
        total_bytes: total,
        utilization: opts.gpu_memory_utilization,
        weights_bytes,
        workspace_bytes: workspace_bytes(
            config,
            opts.max_num_batched_tokens,
            opts.max_num_seqs,
            max_model_len,
            elem,
        ) + graph_bytes
            + crate::model::qwen3_5::extra_workspace_bytes(
                config,
                opts.max_num_batched_tokens,
                elem,
            )
            + prefill_bytes,
        bytes_per_block,
        block_size: opts.block_size,
        max_model_len,
    };
    let memory = plan(&input).map_err(ModelError::Unsupported)?;
    info!(
        device = %backend.name(),
        plan = %memory,
        cuda_graphs,
        graphs_mib = graph_bytes as f64 / (1 << 20) as f64,
        gdn_prefill_mib = prefill_bytes as f64 / (1 << 20) as f64,
        "GPU memory planned (the workspace includes the decode graphs and the GDN chunked-prefill workspace)."
    );
    if hybrid {
        // The KV budget is shared between state slots and KV blocks (logged there); with
        // graphs the runner adds their scratch block (counted in `graph_bytes`).
        return crate::model::qwen3_5::load_gpu(
            backend,
            config,
            weights,
            opts,
            memory.kv_bytes,
            max_model_len,
        );
    }
    // The workspace the planner counted, made at the first step and kept; with graphs, one
    // more block than planned for the KV cache (the padding rows' scratch block, counted in
    // `graph_bytes`), which the runner hides from the engine.
    let reserve = (opts.max_num_batched_tokens, opts.max_num_seqs);
    let (blocks, graphs) = if cuda_graphs {
        (
            memory.num_blocks + 1,
            Some((opts.max_num_seqs, max_model_len)),
        )
    } else {
        (memory.num_blocks, None)
    };
    load_on(
        backend,
        config,
        weights,
        opts.block_size,
        blocks,
        reserve,
        graphs,
    )
}

/// Blocks of `block_size` tokens that fit in `mib` MiB on `backend` (at least one).
fn blocks_for_budget<B: Backend>(
    backend: &B,
    config: &ModelConfig,
    block_size: usize,
    mib: usize,
) -> Result<usize, ModelError> {
    if block_size == 0 {
        return Err(ModelError::Unsupported("`engine.block_size` = 0".into()));
    }
    let per_block = backend.kv_bytes_per_block(&Llama::<B>::kv_spec(config, block_size, 1));
    let num_blocks = mib * (1 << 20) / per_block.max(1);
    if num_blocks == 0 {
        return Err(ModelError::Unsupported(format!(
            "`engine.kv_cache_mib` = {mib} cannot hold one KV block ({per_block} bytes for {block_size} tokens)"
        )));
    }
    info!(
        kv_cache_mib = mib,
        blocks = num_blocks,
        block_size,
        tokens = num_blocks * block_size,
        "KV cache sized."
    );
    Ok(num_blocks)
}

/// The architecture's model on `backend`, its workspace reserved for `reserve` = (tokens,
/// logits rows) per step, with decode graphs for `graphs = Some((max_num_seqs, max_model_len))`
/// (the last of the `num_blocks` blocks then becomes their scratch block).
fn load_on<B: Backend>(
    backend: B,
    config: &ModelConfig,
    weights: &dyn WeightSource,
    block_size: usize,
    num_blocks: usize,
    reserve: (usize, usize),
    graphs: Option<(usize, usize)>,
) -> Result<Box<dyn ModelRunner>, ModelError> {
    match config.architecture {
        Architecture::Llama | Architecture::Qwen3 => {
            let model = Llama::load(backend, config, weights, block_size, num_blocks)?
                .reserve_workspace(reserve.0, reserve.1);
            Ok(Box::new(match graphs {
                Some((seqs, len)) => model.with_decode_graphs(seqs, len),
                None => model,
            }))
        }
        // Qwen3.5 is loaded before this point (`build_runner_for` on the CPU, `load_cuda`),
        // with its state slots sized beside the KV cache.
        Architecture::Qwen3_5 => Err(ModelError::Unsupported(format!(
            "the qwen3_5 hybrid architecture needs its state slots planned (internal: reached \
             load_on on {})",
            backend.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::tests::{tiny_config, tiny_weights};
    use crate::tensor::WeightDType;

    #[test]
    fn cpu_runner_sizes_its_cache_from_the_budget() {
        let c = tiny_config(Architecture::Llama);
        let w = tiny_weights(&c, 1, WeightDType::F32);
        let opts = RunnerOptions {
            device: Device::Cpu,
            threads: 1,
            block_size: 16,
            kv_cache_mib: 1,
            ..Default::default()
        };
        let r = build_runner_for(&c, &w, &opts).unwrap();
        // 2 layers × K,V × 16 tokens × 2 heads × 8 dims × 4 bytes = 4096 bytes per block.
        assert_eq!(r.cache_geometry().num_blocks, (1 << 20) / 4096);
        assert_eq!(r.cache_geometry().block_size, 16);
        assert_eq!(r.vocab_size(), 40);
        assert!(r.device_name().starts_with("cpu"));
    }

    #[test]
    fn cuda_without_a_cuda_backend_is_a_clear_error() {
        let c = tiny_config(Architecture::Llama);
        let w = tiny_weights(&c, 1, WeightDType::F32);
        let opts = RunnerOptions {
            device: Device::Cuda(1),
            ..Default::default()
        };
        let err = build_runner_for(&c, &w, &opts).err().unwrap();
        assert!(err.to_string().contains("cuda:1"), "{err}");
        let tiny = RunnerOptions {
            device: Device::Cpu,
            kv_cache_mib: 0,
            ..Default::default()
        };
        assert!(build_runner_for(&c, &w, &tiny)
            .err()
            .unwrap()
            .to_string()
            .contains("kv_cache_mib"));
    }
}
