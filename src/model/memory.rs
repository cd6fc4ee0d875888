//! The GPU memory planner: how many KV blocks fit after the weights and the activation workspace.
//!
//! budget = min(total × `gpu_memory_utilization`, memory free now) − weights − workspace − a
//! fixed overhead. kiln never counts on memory another process holds, and never takes more than
//! its share of the card. The KV cache gets the rest, in whole blocks. If one sequence of `max_model_len` tokens cannot fit, kiln refuses to start and names the
//! largest length that fits (the message users know from vLLM, said before anything runs).

use crate::model::ModelConfig;
use crate::tensor::{gguf_tiles, TensorInfo, WeightSource};

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

/// Device bytes of one stored tensor on a GPU whose compute dtype has `compute_elem` bytes:
/// floats are converted to the compute dtype (`numel × compute_elem`); 2-D GGUF Q4_0 / Q4_1 /
/// Q8_0 / Q4_K / Q6_K weights stay quantized in the gguf tile layout
/// ([`gguf_tiles::device_bytes`]: what is uploaded — the stored size for the 32-element formats,
/// 4.625 / 8.5625 bits per weight for Q4_K / Q6_K — plus the padding of N to 64 and K to 128) when
/// `KILN_GGUF_GPU_WEIGHTS=quantized` asks for it, else they are expanded like the rest; the
/// parts of packed 4-bit linears (I32 / I64 / U8 / I8 / F8 words, zero points, fp8 scales,
/// `g_idx`) stay as stored. Their 16-bit scales are floats and count at `compute_elem`, which is
/// what they are stored as.
pub fn weight_device_bytes(info: &TensorInfo, compute_elem: usize) -> usize {
    weight_device_bytes_with(info, compute_elem, gguf_tiles::keep_quantized_requested())
}

/// [`weight_device_bytes`] with the GGUF choice given: `keep_gguf` counts 2-D GGUF block weights
/// in the gguf tile layout, else at the compute dtype.
fn weight_device_bytes_with(info: &TensorInfo, compute_elem: usize, keep_gguf: bool) -> usize {
    if let (Some(f), &[n, k], true) = (
        gguf_tiles::GgufFormat::of(info.dtype),
        info.shape.as_slice(),
        keep_gguf,
    ) {
        return gguf_tiles::device_bytes(f, n, k);
    }
    if info.dtype.is_weight() {
        info.numel() * compute_elem
    } else {
        info.bytes
    }
}

/// Device bytes of the stored tensor `name`: [`weight_device_bytes`], except for two parts of
/// packed linears that the w4 tiles (`crate::tensor::packed_tiles`) widen: 4-bit zero points
/// (compressed-tensors `<m>.weight_zero_point`, AutoAWQ / GPTQ `<m>.qzeros`: eight nibbles per
/// I32) take one byte per zero, and NVFP4's fp8 `<m>.weight_scale` is stored in the compute
/// dtype (`compute_elem` bytes per scale).
pub fn named_weight_device_bytes(name: &str, info: &TensorInfo, compute_elem: usize) -> usize {
    use crate::tensor::WeightDType;
    let zero_points = name.ends_with(".weight_zero_point") || name.ends_with(".qzeros");
    if zero_points && info.dtype == WeightDType::I32 {
        info.numel() * 8
    } else if name.ends_with(".weight_scale") && info.dtype == WeightDType::F8E4M3 {
        info.numel() * compute_elem
    } else {
        weight_device_bytes(info, compute_elem)
    }
}

/// [`named_weight_device_bytes`] summed over every tensor of `weights` (read without touching
/// their bytes, [`WeightSource::tensor_info`]); tensors that cannot be described are skipped.
pub fn weights_device_bytes(weights: &dyn WeightSource, compute_elem: usize) -> usize {
    weights
        .names()
        .iter()
        .filter_map(|n| {
            weights
                .tensor_info(n)
                .ok()
                .map(|t| named_weight_device_bytes(n, &t, compute_elem))
        })
        .sum()
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
    let attention_partials =
        decode_partial_rows(c, tokens, logit_rows, max_model_len) * (c.head_dim + 2) * 4;
    // f32 logits plus the sampler's f32 penalized copy of each sampled row.
    let logits = logit_rows * c.vocab_size * 8;
    tokens * (per_token * elem + c.hidden_size * 4) + attention_partials + logits
}

/// Split-K attention partial rows (one `(max, sum)` pair and `head_dim` f32 accumulators each) of
/// a step of `tokens` tokens with at most `seqs` sequences over contexts of up to
/// `max_model_len` keys. The decode kernel (`kernels/attention_decode.cu`, shapes with head_dim a
/// multiple of 8 up to 256 and at most 8 query heads per KV head) runs only for the one-token
/// sequences and splits a row into at most [`decode_attention_slots`] parts; other shapes take
/// the older split-K kernel over every token, in parts of 512 keys.
pub fn decode_partial_rows(
    c: &ModelConfig,
    tokens: usize,
    seqs: usize,
    max_model_len: usize,
) -> usize {
    let kv = c.num_key_value_heads.max(1);
    let group = c.num_attention_heads / kv;
    let decode_kernel = c.head_dim > 0
        && c.head_dim <= 256
        && c.head_dim.is_multiple_of(8)
        && (1..=8).contains(&group);
    let (rows, parts) = if decode_kernel {
        (tokens.min(seqs), decode_attention_slots(max_model_len))
    } else {
        (tokens, max_model_len.div_ceil(512).max(1))
    };
    if parts > 1 {
        rows * c.num_attention_heads * parts
    } else {
        0
    }
}

/// Parts the decode kernel splits a row of `max_ctx` keys into: the host copy of
/// `attention_plan::decode_slots` (CUDA backend; equal by a test there), repeated here because
/// the planner is built without the `cuda` feature too. The tensor-core kernel's per-shape split
/// (`DecodeSplit::for_shape`) never needs more slots (a test in `attention_plan`).
pub fn decode_attention_slots(max_ctx: usize) -> usize {
    // The decode kernel's fewest keys per part and most parts per row.
    const MIN_PART: usize = 128;
    const MAX_PARTS: usize = 128;
    max_ctx.div_ceil(MIN_PART).clamp(1, MAX_PARTS)
}

/// Device bytes allowed per instantiated decode graph (the driver's copy of ~300 kernel nodes
/// and their parameters; measured and logged at each recording, "Decode graph recorded.").
pub const GRAPH_ALLOWANCE_BYTES: usize = 2 << 20;

/// Device bytes the llama runner's decode graphs take beyond its workspace, with `engine.cuda_graphs`
/// on: per bucket (1, 2, 4, … up to `max_num_seqs`) and context class (the short class's
/// `SHORT_CONTEXT` keys when `max_model_len` is longer, then `max_model_len`: `decode_graphs`) its
/// own split-K partials for the class's keys, its step metadata and [`GRAPH_ALLOWANCE_BYTES`];
/// and the one scratch KV block the padding rows use (`bytes_per_block`).
pub fn decode_graph_bytes(
    c: &ModelConfig,
    max_num_seqs: usize,
    max_model_len: usize,
    block_size: usize,
    bytes_per_block: usize,
) -> usize {
    let width = max_model_len.div_ceil(block_size.max(1)).max(1);
    let mut buckets: Vec<usize> = std::iter::successors(Some(1usize), |&b| Some(b * 2))
        .take_while(|&b| b < max_num_seqs)
        .collect();
    buckets.push(max_num_seqs.max(1));
    let per_bucket = |b: usize, keys: usize| {
        let partials = decode_partial_rows(c, b, b, keys) * (c.head_dim + 2) * 4;
        // i32 metadata: 9 per token (ids, positions, slots, sequence, logits row, split-K
        // list and tile slack) and the block tables.
        let meta = (9 * b + b * width) * 4;
        partials + meta + GRAPH_ALLOWANCE_BYTES
    };
    // Every class, whatever `KILN_GRAPH_SHORT_CONTEXT` says: the plan may only overcount.
    let classes = super::llama::decode_graphs::context_classes(max_model_len, true);
    bytes_per_block
        + classes
            .iter()
            .flat_map(|&keys| buckets.iter().map(move |&b| per_bucket(b, keys)))
            .sum::<usize>()
}

/// Inputs of [`split_hybrid`]: a budget to share between a hybrid model's state slots and its
/// KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridSplitInput {
    /// Bytes for KV blocks and state slots together (what [`plan`] gives the KV cache on a
    /// GPU; `engine.kv_cache_mib` on the CPU).
    pub budget_bytes: usize,
    /// Bytes of one state slot (all GDN layers, recurrent + conv).
    pub state_bytes_per_slot: usize,
    /// KV bytes per block (the full-attention layers).
    pub bytes_per_block: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Sequences wanted at once (`engine.max_num_seqs`): one state slot each.
    pub max_num_seqs: usize,
    /// KV tokens one sequence must be able to reach (`max_model_len` on GPUs; one block on
    /// the CPU, which only warns about shorter caches).
    pub min_kv_tokens: usize,
}

/// How a hybrid model's budget is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridSplit {
    /// State slots: the most sequences that can run at once.
    pub num_state_slots: usize,
    /// Bytes of the state slots.
    pub state_bytes: usize,
    /// KV blocks.
    pub num_blocks: usize,
    /// Bytes of the KV blocks.
    pub kv_bytes: usize,
}

impl std::fmt::Display for HybridSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "{} state slots, {:.2} GiB; KV cache {:.2} GiB ({} blocks)",
            self.num_state_slots,
            gib(self.state_bytes),
            gib(self.kv_bytes),
            self.num_blocks
        )
    }
}

/// Share `budget_bytes` between state slots and KV blocks: one slot per sequence of
/// `max_num_seqs`, the rest KV blocks; when that leaves fewer than `min_kv_tokens` KV tokens,
/// fewer slots (fewer sequences at once) until one sequence of `min_kv_tokens` fits. Errors say
/// what cannot fit even with one slot.
pub fn split_hybrid(p: &HybridSplitInput) -> Result<HybridSplit, String> {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let need_blocks = p.min_kv_tokens.div_ceil(p.block_size.max(1)).max(1);
    let need_kv = need_blocks * p.bytes_per_block;
    let max_slots = p.budget_bytes.saturating_sub(need_kv) / p.state_bytes_per_slot.max(1);
    let slots = p.max_num_seqs.min(max_slots);
    if slots == 0 {
        return Err(format!(
            "one sequence needs a {:.3} GiB state slot plus {:.3} GiB of KV cache for {} tokens, more than the {:.3} GiB available; raise the cache budget (`engine.kv_cache_mib` on the CPU, `engine.gpu_memory_utilization` on GPUs) or lower `engine.max_model_len`",
            gib(p.state_bytes_per_slot),
            gib(need_kv),
            p.min_kv_tokens,
            gib(p.budget_bytes)
        ));
    }
    let state_bytes = slots * p.state_bytes_per_slot;
    let num_blocks = (p.budget_bytes - state_bytes) / p.bytes_per_block.max(1);
    Ok(HybridSplit {
        num_state_slots: slots,
        state_bytes,
        num_blocks,
        kv_bytes: num_blocks * p.bytes_per_block,
    })
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
    fn packed_zero_points_count_one_byte_per_zero() {
        use crate::tensor::WeightDType;
        // compressed-tensors asym: [N / 8, groups] I32 = N × groups nibbles → N × groups bytes.
        let z = TensorInfo {
            dtype: WeightDType::I32,
            shape: vec![640, 40],
            bytes: 640 * 40 * 4,
        };
        let zeros = 5120 * 40;
        assert_eq!(
            named_weight_device_bytes("l.mlp.up_proj.weight_zero_point", &z, 2),
            zeros
        );
        assert_eq!(
            named_weight_device_bytes("l.mlp.up_proj.qzeros", &z, 2),
            zeros
        );
        // NVFP4's fp8 scales are stored in the compute dtype.
        let s = TensorInfo {
            dtype: WeightDType::F8E4M3,
            shape: vec![5120, 320],
            bytes: 5120 * 320,
        };
        assert_eq!(
            named_weight_device_bytes("l.mlp.up_proj.weight_scale", &s, 2),
            5120 * 320 * 2
        );
        // Other I32 parts (packed words, g_idx) stay as stored.
        assert_eq!(
            named_weight_device_bytes("l.mlp.up_proj.weight_packed", &z, 2),
            640 * 40 * 4
        );
    }

    #[test]
    fn device_bytes_keep_packed_parts_as_stored() {
        use crate::tensor::WeightDType;
        let info = |dtype, shape: &[usize], bytes| TensorInfo {
            dtype,
            shape: shape.to_vec(),
            bytes,
        };
        // A float weight takes the compute dtype, whatever it is stored as.
        assert_eq!(
            weight_device_bytes(&info(WeightDType::F32, &[4, 8], 128), 2),
            64
        );
        assert_eq!(
            weight_device_bytes(&info(WeightDType::BF16, &[4, 8], 64), 2),
            64
        );
        // GGUF Q4_1 kept quantized: 20 bytes per 32 weights when N and K need no padding; K =
        // 576 pads to 640 (the layout's 128-column blocks). Dequantized (the default), they count
        // at the compute dtype.
        let q4_1 = info(WeightDType::Q4_1, &[128, 1024], 128 * 32 * 20);
        assert_eq!(weight_device_bytes_with(&q4_1, 2, true), 128 * 32 * 20);
        assert_eq!(weight_device_bytes_with(&q4_1, 2, false), 128 * 1024 * 2);
        let q8_0 = info(WeightDType::Q8_0, &[64, 576], 64 * 18 * 34);
        assert_eq!(weight_device_bytes_with(&q8_0, 2, true), 64 * 20 * 34);
        // The K-quants as uploaded: Q4_K 4-bit values + 8 scale / min bytes per 128 columns +
        // d / dmin (4 bytes) per 256 = 75,776 bytes at 128 x 1024; Q6_K 8-bit values + 8 scale
        // bytes per 128 + d (2 bytes) per 256, N = 200 padded to 256: 65,536 + 4,096 + 512.
        let q4_k = info(WeightDType::Q4K, &[128, 1024], 128 * 4 * 144);
        assert_eq!(weight_device_bytes_with(&q4_k, 2, true), 75_776);
        assert_eq!(weight_device_bytes_with(&q4_k, 2, false), 128 * 1024 * 2);
        let q6_k = info(WeightDType::Q6K, &[200, 256], 200 * 210);
        assert_eq!(weight_device_bytes_with(&q6_k, 2, true), 70_144);
        assert_eq!(weight_device_bytes_with(&q6_k, 4, false), 200 * 256 * 4);
        // Packed words, zero points and fp8 scales stay as stored.
        assert_eq!(
            weight_device_bytes(&info(WeightDType::I32, &[1024, 640], 1024 * 640 * 4), 2),
            1024 * 640 * 4
        );
        assert_eq!(
            weight_device_bytes(&info(WeightDType::F8E4M3, &[16, 4], 64), 2),
            64
        );
        assert_eq!(
            weight_device_bytes(&info(WeightDType::U8, &[16, 8], 128), 2),
            128
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn decode_partials_use_the_cuda_kernels_split() {
        use crate::backend::cuda::attention_plan::decode_slots;
        for ctx in (1..5000).step_by(7).chain([8192, 32768, 131_072]) {
            assert_eq!(decode_attention_slots(ctx), decode_slots(ctx), "ctx {ctx}");
        }
    }

    #[test]
    fn decode_graphs_count_partials_per_bucket_and_one_scratch_block() {
        use crate::model::llama::tests::tiny_config;
        let c = tiny_config(crate::model::Architecture::Llama);
        // max_model_len 128: one decode part, no partials; buckets 1, 2, 4 (max_num_seqs 4).
        let width = 128 / 16;
        let meta = |b: usize| (9 * b + b * width) * 4;
        let short = decode_graph_bytes(&c, 4, 128, 16, 1000);
        assert_eq!(
            short,
            1000 + 3 * GRAPH_ALLOWANCE_BYTES + meta(1) + meta(2) + meta(4)
        );
        // 2048 keys: 16 decode parts of 128 keys, partials for 1 + 2 + 4 rows; and the short
        // class's graphs (256 keys: 2 parts counted), as many, with tables as wide.
        assert_eq!(decode_attention_slots(2048), 16);
        let long = decode_graph_bytes(&c, 4, 2048, 16, 1000);
        let w2 = 2048 / 16;
        let meta2 = |b: usize| (9 * b + b * w2) * 4;
        let partials = 7 * c.num_attention_heads * 16 * (c.head_dim + 2) * 4;
        let partials_short = 7 * c.num_attention_heads * 2 * (c.head_dim + 2) * 4;
        let class = |p: usize| 3 * GRAPH_ALLOWANCE_BYTES + meta2(1) + meta2(2) + meta2(4) + p;
        assert_eq!(long, 1000 + class(partials) + class(partials_short));
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

    fn split_input() -> HybridSplitInput {
        HybridSplitInput {
            budget_bytes: 8 * GIB,
            // The 27B: 48 × ([48, 128, 128] + 3 × 10240) f32.
            state_bytes_per_slot: 48 * (48 * 128 * 128 + 3 * 10240) * 4,
            // bf16 KV of 16 layers × 2 × 4 heads × 256 = 64 KiB per token, blocks of 16.
            bytes_per_block: 16 << 16,
            block_size: 16,
            max_num_seqs: 16,
            min_kv_tokens: 32_768,
        }
    }

    #[test]
    fn hybrid_budget_gives_every_sequence_a_slot_when_it_can() {
        let s = split_hybrid(&split_input()).unwrap();
        assert_eq!(s.num_state_slots, 16);
        assert_eq!(s.state_bytes, 16 * split_input().state_bytes_per_slot);
        assert_eq!(
            s.num_blocks,
            (8 * GIB - s.state_bytes) / split_input().bytes_per_block
        );
        assert!(s.num_blocks * 16 >= 32_768);
        assert!(s.to_string().starts_with("16 state slots, 2.34 GiB"), "{s}");
    }

    #[test]
    fn hybrid_budget_trades_slots_for_kv_tokens() {
        // 4 GiB: 32K tokens take 2 GiB of KV, so 2 GiB / 149.6 MiB = 13 slots.
        let s = split_hybrid(&HybridSplitInput {
            budget_bytes: 4 * GIB,
            ..split_input()
        })
        .unwrap();
        assert_eq!(s.num_state_slots, 13);
        assert!(s.num_blocks * 16 >= 32_768);
        let err = split_hybrid(&HybridSplitInput {
            budget_bytes: 2 * GIB,
            ..split_input()
        })
        .unwrap_err();
        assert!(err.contains("32768 tokens"), "{err}");
    }
}
