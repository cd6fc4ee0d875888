//! The GPU memory planner: how many KV blocks fit after the weights and the activation workspace.
//!
//! budget = min(total × `gpu_memory_utilization`, memory free now) − weights − workspace − a
//! fixed overhead. kiln never counts on memory another process holds, and never takes more than
//! its share of the card. The KV cache gets the rest, in whole blocks. If one sequence of `max_model_len` tokens cannot fit, kiln refuses to start and names the
//! largest length that fits (the message users know from vLLM, said before anything runs).

use crate::model::ModelConfig;

/// Slack for the CUDA context, cuBLAS workspaces and allocator rounding, in bytes.
pub const FIXED_OVERHEAD_BYTES: usize = 256 << 20;

/// The outcome of planning, logged at start in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of weights on the device.
    pub weights_bytes: usize,
    /// Bytes reserved for activations of one `max_num_batched_tokens` step.
    pub workspace_bytes: usize,
    /// Bytes of KV cache.
    pub kv_bytes: usize,
    /// KV blocks.
    pub num_blocks: usize,
    /// Tokens the KV cache holds (`num_blocks × block_size`).
    pub kv_tokens: usize,
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "weights {:.2} GiB, workspace {:.2} GiB, KV cache {:.2} GiB = {} tokens ({} blocks)",
            gib(self.weights_bytes),
            gib(self.workspace_bytes),
            gib(self.kv_bytes),
            self.kv_tokens,
            self.num_blocks
        )
    }
}

/// Inputs of [`plan`], all in bytes or tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInput {
    /// Device memory free before loading (`cuMemGetInfo`).
    pub free_bytes: usize,
    /// Device memory in total.
    pub total_bytes: usize,
    /// `engine.gpu_memory_utilization`.
    pub utilization: f32,
    /// Weights as they will sit on the device.
    pub weights_bytes: usize,
    /// Activation workspace (see [`workspace_bytes`]).
    pub workspace_bytes: usize,
    /// KV bytes per block, all layers, K and V.
    pub bytes_per_block: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// The longest sequence that must fit alone.
    pub max_model_len: usize,
}

/// Plan the KV cache, or explain why `max_model_len` cannot fit.
pub fn plan(p: &PlanInput) -> Result<MemoryPlan, String> {
    let share = (p.total_bytes as f64 * p.utilization as f64) as usize;
    let allowed = share.min(p.free_bytes);
    let used_elsewhere = p.total_bytes.saturating_sub(p.free_bytes);
    let fixed = p.weights_bytes + p.workspace_bytes + FIXED_OVERHEAD_BYTES;
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let kv_bytes = allowed.checked_sub(fixed).ok_or_else(|| {
        format!(
            "the model does not fit: weights {:.2} GiB + workspace {:.2} GiB + {:.2} GiB overhead exceed the {:.2} GiB kiln may use ({} of {:.2} GiB, of which {:.2} GiB are held by others); lower `engine.max_num_batched_tokens` or raise `engine.gpu_memory_utilization`",
            gib(p.weights_bytes),
            gib(p.workspace_bytes),
            gib(FIXED_OVERHEAD_BYTES),
            gib(allowed),
            p.utilization,
            gib(p.total_bytes),
            gib(used_elsewhere)
        )
    })?;
    let num_blocks = kv_bytes / p.bytes_per_block.max(1);
    let kv_tokens = num_blocks * p.block_size;
    if kv_tokens < p.max_model_len {
        let need = p.max_model_len.div_ceil(p.block_size) * p.bytes_per_block;
        return Err(format!(
            "to serve one request of `max_model_len` = {} tokens, {:.2} GiB of KV cache is needed, more than the {:.2} GiB available; the largest length that fits is {} (set `engine.max_model_len` to it or less, lower `engine.max_num_batched_tokens`, or raise `engine.gpu_memory_utilization`)",
            p.max_model_len,
            gib(need),
            gib(kv_bytes),
            kv_tokens
        ));
    }
    Ok(MemoryPlan {
        weights_bytes: p.weights_bytes,
        workspace_bytes: p.workspace_bytes,
        kv_bytes: num_blocks * p.bytes_per_block,
        num_blocks,
        kv_tokens,
    })
}

/// Activation bytes of one step of `tokens` tokens for a llama-family model with `logit_rows`
/// rows of logits and an attention split over `max_model_len` keys, at `elem` bytes per element.
pub fn workspace_bytes(
    c: &ModelConfig,
    tokens: usize,
    logit_rows: usize,
    max_model_len: usize,
    elem: usize,
) -> usize {
    let q_dim = c.num_attention_heads * c.head_dim;
    let kv_dim = c.num_key_value_heads * c.head_dim;
    // The llama runner's workspace: normed input, projection output (hidden each), fused q|k|v,
    // rotated q, attention output, fused gate|up, activation in the compute dtype; the residual
    // stream in f32 (`Backend::alloc_f32`).
    let per_token = 2 * c.hidden_size + 3 * q_dim + 2 * kv_dim + 3 * c.intermediate_size;
    let parts = max_model_len.div_ceil(512).max(1);
    let attention_partials = tokens * c.num_attention_heads * parts * (c.head_dim + 2) * 4;
    // f32 logits plus the sampler's f32 penalized copy of each sampled row.
    let logits = logit_rows * c.vocab_size * 8;
    tokens * (per_token * elem + c.hidden_size * 4) + attention_partials + logits
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    fn input() -> PlanInput {
        PlanInput {
            free_bytes: 31 * GIB,
            total_bytes: 32 * GIB,
            utilization: 0.95,
            weights_bytes: 20 * GIB,
            workspace_bytes: GIB,
            bytes_per_block: 1 << 20,
            block_size: 16,
            max_model_len: 8192,
        }
    }

    #[test]
    fn kv_gets_what_is_left_in_whole_blocks() {
        let p = plan(&input()).expect("fits");
        // min(0.95 × 32 GiB, 31 GiB free) = 30.4 GiB; minus 20 weights, 1 workspace, 0.25 overhead.
        let expected = ((32.0 * 0.95 - 21.25) * 1024.0) as usize;
        assert!((p.num_blocks as i64 - expected as i64).abs() <= 1, "{p:?}");
        assert_eq!(p.kv_tokens, p.num_blocks * 16);
        assert_eq!(p.kv_bytes, p.num_blocks << 20);
    }

    #[test]
    fn too_long_a_context_names_the_largest_that_fits() {
        let err = plan(&PlanInput {
            max_model_len: 262_144,
            ..input()
        })
        .unwrap_err();
        let p = plan(&input()).expect("fits");
        assert!(err.contains("262144"), "{err}");
        assert!(
            err.contains(&format!("largest length that fits is {}", p.kv_tokens)),
            "{err}"
        );
    }

    #[test]
    fn memory_held_by_others_is_not_counted_on() {
        let crowded = plan(&PlanInput {
            free_bytes: 25 * GIB,
            ..input()
        })
        .expect("fits");
        // min(30.4, 25) − 21.25 = 3.75 GiB.
        assert_eq!(crowded.num_blocks, (3.75 * 1024.0) as usize);
    }

    #[test]
    fn weights_beyond_the_budget_are_refused() {
        let err = plan(&PlanInput {
            weights_bytes: 40 * GIB,
            ..input()
        })
        .unwrap_err();
        assert!(err.contains("does not fit"), "{err}");
    }
}
