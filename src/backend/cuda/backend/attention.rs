//! The CUDA backend's attention launches: the tiled flash-style prefill kernel over a step's
//! prefill tiles, and decode attention over its one-token sequences (or over every token, for
//! [`CudaBackend::paged_attention_split_k`]): the memory-speed kernel of
//! `kernels/attention_decode.cu` for the shapes [`DecodeVariant`] takes (head_dim a multiple of 8
//! up to 256, at most 8 query heads per KV head), the older split-K kernels of
//! `kernels/attention.cu` otherwise (the decode launch itself: `attention_decode.rs`). See
//! `attention_plan.rs` for how a step's tokens are divided.
//!
//! [`CudaBackend::paged_attention_gated`] is the same with Qwen3.5's output gate fused into the
//! epilogues (`out = attn · sigmoid(gate)`, sigmoid in f32 on the unrounded attention value) of the
//! prefill and decode kernels; shapes only the older split-K kernels take fall back to the two
//! separate ops.

use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

use super::{check_len, dev_err, CudaBackend, CudaBuffer, CudaKvCache, CudaStep};
use crate::backend::cuda::attention_plan::{self, DecodeOptions, DecodeVariant, PrefillVariant};
use crate::backend::{AttentionParams, BackendError};

/// Threads per block of the split-K attention kernel; must equal `ATTN_WARPS * 32` in attention.cu.
const ATTN_THREADS: u32 = 4 * 32;
/// Largest head_dim the split-K attention kernel holds (`ATTN_MAX_DIM_PER_LANE * 32`).
const ATTN_MAX_HEAD_DIM: usize = 256;
/// Widest head the block-wide split-K kernel takes; wider heads go to `attention_serial_*`.
const SERIAL_ABOVE_HEAD_DIM: usize = 64;
/// The output gate of gated attention as the kernels read it: element (token t, head h, dim d)
/// at `t * row + h * head + d` of `buf` (compute dtype). `row`/`head` allow a strided view (e.g.
/// into a `[tokens, heads, 2 · head_dim]` q|gate projection); [`OutputGate::contiguous`] is the
/// `[tokens, heads × head_dim]` buffer the Qwen3.5 runner keeps.
#[derive(Clone, Copy)]
pub struct OutputGate<'a> {
    /// The gate values.
    pub buf: &'a CudaBuffer,
    /// Elements between consecutive tokens.
    pub row: usize,
    /// Elements between consecutive heads of a token.
    pub head: usize,
}

impl<'a> OutputGate<'a> {
    /// A `[tokens, heads, head_dim]` gate.
    pub fn contiguous(buf: &'a CudaBuffer, params: &AttentionParams) -> OutputGate<'a> {
        OutputGate {
            buf,
            row: params.num_heads * params.head_dim,
            head: params.head_dim,
        }
    }

    /// Elements the kernels may read for `tokens` tokens (the last token's last head, + 1).
    fn extent(&self, tokens: usize, params: &AttentionParams) -> usize {
        match tokens {
            0 => 0,
            t => (t - 1) * self.row + (params.num_heads - 1) * self.head + params.head_dim,
        }
    }

    /// Kernel arguments: (row, head) as i32, checked to fit.
    pub(super) fn strides(&self) -> Result<(i32, i32), BackendError> {
        let conv = |v: usize| {
            i32::try_from(v).map_err(|_| {
                BackendError::InvalidArgument(format!("attention gate stride {v} over i32"))
            })
        };
        Ok((conv(self.row)?, conv(self.head)?))
    }
}

/// Keys per split-K partition of the split-K attention kernel (at most `ATTN_PART_MAX`, the
/// kernel's shared score row).
const ATTN_PART_LEN: usize = 512;

impl CudaBackend {
    /// [`Backend::paged_attention`] with the split-K kernel for every token, prefill included (the
    /// path before the tiled prefill kernel): for timing comparisons and as a second reference.
    pub fn paged_attention_split_k(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.check_attention(q, cache, layer, step, params, out)?;
        if step.num_tokens == 0 {
            return Ok(());
        }
        self.launch_split_k(q, cache, layer, step, params, out, None, false, None)
    }

    /// [`Backend::paged_attention`] for a decode-only step with the older split-K kernels of
    /// attention.cu even where the decode kernel takes the shapes: the "before" of the speed
    /// comparisons (`tests/cuda_long_context.rs`).
    pub fn paged_attention_legacy_decode(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.check_attention(q, cache, layer, step, params, out)?;
        if step.num_tokens == 0 {
            return Ok(());
        }
        self.launch_split_k(q, cache, layer, step, params, out, None, true, None)
    }

    /// [`Backend::paged_attention`] for a decode-only step with the decode kernel launched as
    /// `opts` says (every token one row), e.g. [`DecodeOptions::TWO_PASS`], the launch before the
    /// single-pass rule, the in-launch merge and PDL: for the before / after timings and the
    /// equality tests. Errors when the decode kernel does not take the shapes.
    ///
    /// [`Backend::paged_attention`]: crate::backend::Backend::paged_attention
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention_decode_with(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
        opts: DecodeOptions,
    ) -> Result<(), BackendError> {
        self.check_attention(q, cache, layer, step, params, out)?;
        let group = params.num_heads / params.num_kv_heads;
        let Some(variant) = DecodeVariant::for_shape(params.head_dim, group) else {
            return Err(BackendError::Unsupported(format!(
                "decode kernel with head_dim {} and {group} query heads per KV head",
                params.head_dim
            )));
        };
        if step.num_tokens == 0 {
            return Ok(());
        }
        self.launch_decode(
            variant,
            q,
            cache,
            layer,
            step,
            params,
            out,
            None,
            (step.num_tokens, step.max_context),
            None,
            opts,
        )
    }

    /// [`Backend::paged_attention`] with the output gate fused: `out = attn · sigmoid(gate)`
    /// (see the module docs). The prefill tiles and the decode kernel apply the gate in their
    /// epilogue (and the decode combine pass for rows split into parts); when the step needs the
    /// older split-K kernels (head_dim not a multiple of 8, or more than 8 query heads per KV
    /// head), attention then a separate `x · sigmoid(gate)` pass, which needs a contiguous gate.
    ///
    /// [`Backend::paged_attention`]: crate::backend::Backend::paged_attention
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention_gated(
        &self,
        q: &CudaBuffer,
        gate: OutputGate<'_>,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "paged_attention_gated");
        self.check_attention(q, cache, layer, step, params, out)?;
        check_len(
            "attention gate",
            gate.buf.len,
            gate.extent(step.num_tokens, params),
        )?;
        self.expect_compute("attention gate", gate.buf)?;
        if gate.head < params.head_dim {
            return Err(BackendError::InvalidArgument(format!(
                "attention gate head stride {} below head_dim {}",
                gate.head, params.head_dim
            )));
        }
        if step.num_tokens == 0 {
            return Ok(());
        }
        let group = params.num_heads / params.num_kv_heads;
        let prefill =
            PrefillVariant::for_head_dim(params.head_dim).filter(|_| step.prefill_tiles > 0);
        let decode_fits = DecodeVariant::for_shape(params.head_dim, group).is_some();
        let decode_tokens = if prefill.is_some() {
            step.split_tokens
        } else {
            step.num_tokens
        };
        if decode_tokens > 0 && !decode_fits {
            // Only the older split-K kernels take these shapes: the unfused pair.
            let n = step.num_tokens * params.num_heads * params.head_dim;
            if gate.row != params.num_heads * params.head_dim || gate.head != params.head_dim {
                return Err(BackendError::Unsupported(format!(
                    "a strided attention gate with head_dim {} and {group} query heads per KV head",
                    params.head_dim
                )));
            }
            self.launch_split_k(q, cache, layer, step, params, out, None, false, None)?;
            return crate::backend::hybrid::HybridBackend::sigmoid_mul(self, out, gate.buf, n);
        }
        let Some(variant) = prefill else {
            return self.launch_split_k(
                q,
                cache,
                layer,
                step,
                params,
                out,
                None,
                false,
                Some(gate),
            );
        };
        self.launch_prefill(variant, q, cache, layer, step, params, out, Some(gate))?;
        if step.split_tokens > 0 {
            let index = step.split_index();
            self.launch_split_k(
                q,
                cache,
                layer,
                step,
                params,
                out,
                Some(&index),
                false,
                Some(gate),
            )?;
        }
        Ok(())
    }

    pub(super) fn check_attention(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &CudaBuffer,
    ) -> Result<(), BackendError> {
        params.check_fits(&cache.spec, layer)?;
        if params.head_dim > ATTN_MAX_HEAD_DIM {
            return Err(BackendError::InvalidArgument(format!(
                "attention head_dim {} is over the CUDA kernels' {ATTN_MAX_HEAD_DIM}",
                params.head_dim
            )));
        }
        let n = step.num_tokens * params.num_heads * params.head_dim;
        check_len("attention q", q.len, n)?;
        check_len("attention output", out.len, n)
    }

    /// The tiled prefill kernel over the step's prefill tiles (see attention_plan.rs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_prefill(
        &self,
        variant: PrefillVariant,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
        gate: Option<OutputGate<'_>>,
    ) -> Result<(), BackendError> {
        let spec = cache.spec;
        let f = self.k.prefill(variant);
        let (g_row, g_head) = gate.map(|g| g.strides()).transpose()?.unwrap_or((0, 0));
        let null: u64 = 0;
        let tiles = step.tiles();
        let tables = step.block_tables();
        let (nh, nkv, hd, bs, mb) = (
            params.num_heads as i32,
            params.num_kv_heads as i32,
            params.head_dim as i32,
            spec.block_size as i32,
            step.max_blocks as i32,
        );
        let scale = params.scale;
        let mut b = self.stream.launch_builder(f);
        b.arg(&q.data)
            .arg(&cache.k[layer])
            .arg(&cache.v[layer])
            .arg(&tables)
            .arg(&tiles)
            .arg(&mut out.data);
        b.arg(&nh).arg(&nkv).arg(&hd).arg(&bs).arg(&mb).arg(&scale);
        match &gate {
            Some(g) => b.arg(&g.buf.data),
            None => b.arg(&null),
        };
        b.arg(&g_row).arg(&g_head);
        let group = params.num_heads / params.num_kv_heads;
        let cfg = LaunchConfig {
            grid_dim: (
                step.prefill_tiles as u32,
                params.num_kv_heads as u32,
                variant.row_chunks(group) as u32,
            ),
            block_dim: (attention_plan::PREFILL_THREADS, 1, 1),
            shared_mem_bytes: variant.shared_bytes(params.head_dim) as u32,
        };
        // SAFETY: tiles are [prefill_tiles, 4] built by AttentionPlan from the checked StepInput:
        // each covers tokens < num_tokens of one sequence whose block table (ids < num_blocks)
        // holds every position up to the tile's last; head_dim ≤ variant.max_head_dim and a
        // multiple of 4 (for_head_dim); shared memory is sized by shared_bytes, and variants above
        // 48 KB had their limit raised in `new`; the gate (or null) holds every (token, head, dim)
        // the tiles write at its strides (checked by paged_attention_gated).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// Decode attention over `index` (token indices, one block row each) or, with `None`, over
    /// every token of the step: the memory-speed kernel of attention_decode.cu when the shapes fit
    /// [`DecodeVariant`], else the older split-K kernels (merged by attention_combine when they
    /// split).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_split_k(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
        index: Option<&CudaView<'_, i32>>,
        legacy: bool,
        gate: Option<OutputGate<'_>>,
    ) -> Result<(), BackendError> {
        let spec = cache.spec;
        let (n_rows, max_context) = match index {
            Some(_) => (step.split_tokens, step.split_max_context),
            None => (step.num_tokens, step.max_context),
        };
        let group = params.num_heads / params.num_kv_heads;
        let variant = DecodeVariant::for_shape(params.head_dim, group).filter(|_| !legacy);
        if let Some(variant) = variant {
            // The prefetch before `griddepcontrol.wait` is bounded by each sequence's cached
            // length in the kernels, so rows of a sequence with several tokens in this step (every
            // token a row: `index` None) keep it too.
            return self.launch_decode(
                variant,
                q,
                cache,
                layer,
                step,
                params,
                out,
                index,
                (n_rows, max_context),
                gate,
                DecodeOptions::default(),
            );
        }
        if gate.is_some() {
            return Err(BackendError::Unsupported(
                "the output gate is fused into the decode kernel only".into(),
            ));
        }
        // A pinned step (a replayed graph) sizes the split for its pinned context, so its grid
        // never follows the data; the extra parts cover no keys, write an empty partial
        // (max = -inf) and are skipped by the merge, which leaves the result bit for bit as with
        // the parts the data needs (a scale of exp(0) = 1 on the one part is exact).
        let n_parts = max_context
            .max(step.pinned_context)
            .div_ceil(ATTN_PART_LEN)
            .max(1);
        let rows = n_rows * params.num_heads * n_parts;
        // Partial (max, sum, acc) per split, in the step's own scratch (grown to its largest
        // call so far); with one part the kernel writes `out` directly and never touches them,
        // so null pointers — most eager decode steps.
        let mut guard = if n_parts > 1 {
            Some(step.partials(&self.stream, rows, params.head_dim)?)
        } else {
            None
        };
        let mut partials = guard.as_mut().and_then(|g| g.as_mut());
        let null: u64 = 0;
        // The block-wide kernel for heads up to 64 wide (faster at short contexts); the serial one
        // above (faster for wide heads at long contexts; see attention.cu). A function of the
        // shapes only, so a graph's kernel never changes with the data.
        let f = if params.head_dim > SERIAL_ABOVE_HEAD_DIM {
            &self.k.attention_split_k_serial
        } else {
            &self.k.attention_split_k
        };
        let tables = step.block_tables();
        let token_seq = step.token_seq();
        let positions = step.positions();
        let (nh, nkv, hd, bs, mb, pl_len) = (
            params.num_heads as i32,
            params.num_kv_heads as i32,
            params.head_dim as i32,
            spec.block_size as i32,
            step.max_blocks as i32,
            ATTN_PART_LEN as i32,
        );
        let scale = params.scale;
        let mut b = self.stream.launch_builder(f);
        b.arg(&q.data)
            .arg(&cache.k[layer])
            .arg(&cache.v[layer])
            .arg(&tables);
        b.arg(&token_seq).arg(&positions);
        match index {
            Some(ix) => b.arg(ix),
            None => b.arg(&null),
        };
        b.arg(&mut out.data);
        match partials.as_mut() {
            Some((pm, pl, pacc)) => b.arg(pm).arg(pl).arg(pacc),
            None => b.arg(&null).arg(&null).arg(&null),
        };
        b.arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&bs)
            .arg(&mb)
            .arg(&pl_len)
            .arg(&scale);
        let cfg = LaunchConfig {
            grid_dim: (params.num_heads as u32, n_rows as u32, n_parts as u32),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block tables are [n_seqs, max_blocks] with ids checked against num_blocks;
        // every token's position is < its sequence's context, covered by its table; `index`
        // holds n_rows token indices < num_tokens (or is null: rows are the tokens); partial
        // buffers hold n_rows × num_heads × n_parts (× head_dim) floats when n_parts > 1 (null,
        // and unread, otherwise), and n_parts covers the largest context among the rows'
        // sequences.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        if let Some((pm, pl, pacc)) = &partials {
            let f = &self.k.attention_combine;
            let np = n_parts as i32;
            let mut b = self.stream.launch_builder(f);
            b.arg(pm).arg(pl).arg(pacc);
            match index {
                Some(ix) => b.arg(ix),
                None => b.arg(&null),
            };
            b.arg(&mut out.data).arg(&nh).arg(&hd).arg(&np);
            let cfg = LaunchConfig {
                grid_dim: (params.num_heads as u32, n_rows as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads the partials written above, writes `out` rows of head_dim at the
            // same token indices.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        Ok(())
    }
}
