//! The llama-family decoder (`llama`: SmolLM2, Llama 2/3; `qwen3`: the same plus per-head
//! RMSNorm of q and k), generic over the [`Backend`], as one [`ModelRunner`].
//!
//! Per layer, with `x` the residual stream `[tokens, hidden]` (HF `LlamaDecoderLayer`):
//! ```text
//! h = rms_norm(x) · input_layernorm
//! q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ            [tokens, heads·head_dim], [tokens, kv_heads·head_dim]
//! (qwen3) q, k = rms_norm per head · q_norm, k_norm
//! q, k = rope(q, k, position)               NeoX rotate_half
//! cache[slot] = k, v;  a = softmax(q·kᵀ/√head_dim, causal) · v   over the paged cache
//! x = x + a·Woᵀ
//! h = rms_norm(x) · post_attention_layernorm
//! x = x + (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ
//! ```
//! then `logits = rms_norm(x) · norm · lm_headᵀ` in f32 for the rows that need them (`lm_head`
//! is `embed_tokens` when the checkpoint has no `lm_head.weight`), sampled on the backend or
//! downloaded raw as each sequence asks. The residual add of each
//! sub-block is fused with the norm that follows it ([`Backend::add_rms_norm`]).
//!
//! Weights are looked up by Hugging Face checkpoint key through [`Prefix`] and uploaded as
//! stored; shapes are checked against the config at load. q|k|v and gate|up are stacked into
//! one weight each where the backend can ([`Backend::upload_weight_rows`]), so a layer runs
//! one GEMM for q, k, v and one for gate, up, then [`Backend::qkv_rope_write`] (per-head norm,
//! RoPE and KV write in one op) and [`Backend::gate_up_swiglu`] (one kernel where the backend fuses
//! the SwiGLU into the matmul, else the matmul and [`Backend::swiglu`]); weights it cannot stack run the
//! unfused ops, with the same results.
//!
//! The activations, the step metadata and the logits live in a [`Workspace`] kept for the
//! runner's life: sized at the first step to at least [`Llama::reserve_workspace`]'s limits
//! (the engine's `max_num_batched_tokens` / `max_num_seqs`, which the GPU memory planner
//! counted), grown only by a larger step, so a steady-state step allocates nothing.

use tracing::info;

use crate::backend::{Backend, KvCacheSpec, RopeSpec};
use crate::error::{EngineError, ModelError};
use crate::model::prefix::Prefix;
use crate::model::step::{CacheGeometry, ForwardBatch, ModelRunner};
use crate::model::step_queue::{queued_runner_methods, QueuedStep};
use crate::model::step_submit::{
    queue_logits, runner_step_input, submit_step, StepBuffers, StepState,
};
use crate::model::{Architecture, ModelConfig};
use crate::tensor::WeightSource;

/// The q, k, v projections: one stacked weight `[q_dim + 2·kv_dim, hidden]`, or three.
enum QkvProj<B: Backend> {
    Fused(B::Weight),
    Split {
        q: B::Weight,
        k: B::Weight,
        v: B::Weight,
    },
}

/// The gate and up projections: one stacked weight `[2·intermediate, hidden]`, or two.
enum GateUpProj<B: Backend> {
    Fused(B::Weight),
    Split { gate: B::Weight, up: B::Weight },
}

/// One decoder layer's weights on the backend.
struct LlamaLayer<B: Backend> {
    input_layernorm: B::Buffer,
    qkv: QkvProj<B>,
    o_proj: B::Weight,
    /// Qwen3 only: `[head_dim]`.
    q_norm: Option<B::Buffer>,
    /// Qwen3 only: `[head_dim]`.
    k_norm: Option<B::Buffer>,
    post_attention_layernorm: B::Buffer,
    gate_up: GateUpProj<B>,
    down_proj: B::Weight,
}

impl<B: Backend> LlamaLayer<B> {
    /// Every projection weight of the layer.
    fn matrices(&self) -> Vec<&B::Weight> {
        let mut m = match &self.qkv {
            QkvProj::Fused(w) => vec![w],
            QkvProj::Split { q, k, v } => vec![q, k, v],
        };
        m.push(&self.o_proj);
        match &self.gate_up {
            GateUpProj::Fused(w) => m.push(w),
            GateUpProj::Split { gate, up } => m.extend([gate, up]),
        }
        m.push(&self.down_proj);
        m
    }
}

/// The runner's persistent activations, step metadata and logits (see the module header), for
/// steps of up to `tokens` tokens and `rows` logits rows. Buffers only one path uses (the fused
/// or the unfused projections) are empty when no layer takes that path.
struct Workspace<B: Backend> {
    tokens: usize,
    rows: usize,
    /// Residual stream `[tokens, hidden]`, f32.
    x: B::Buffer,
    /// Normed input of the next sub-block `[tokens, hidden]`.
    h: B::Buffer,
    /// Output of o_proj / down_proj `[tokens, hidden]`.
    delta: B::Buffer,
    /// Fused q|k|v rows `[tokens, q_dim + 2·kv_dim]`.
    qkv: B::Buffer,
    /// Rotated q `[tokens, q_dim]`.
    q: B::Buffer,
    /// Unfused k, v (and Qwen3's normed k) `[tokens, kv_dim]`.
    k: B::Buffer,
    v: B::Buffer,
    k_normed: B::Buffer,
    /// Attention output `[tokens, q_dim]`.
    a: B::Buffer,
    /// Fused gate|up rows `[tokens, 2·intermediate]`.
    gate_up: B::Buffer,
    /// Unfused gate, up `[tokens, intermediate]`.
    gate: B::Buffer,
    up: B::Buffer,
    /// SiLU·up `[tokens, intermediate]`.
    act: B::Buffer,
    /// Gathered logits rows of h `[rows, hidden]`.
    last: B::Buffer,
    /// f32 logits `[rows, vocab]`.
    logits: B::Logits,
}

/// All weights of the model (and its RoPE table) on the backend.
struct LlamaWeights<B: Backend> {
    embed_tokens: B::Weight,
    /// `None`: tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    layers: Vec<LlamaLayer<B>>,
    norm: B::Buffer,
    rope: B::Rope,
}

/// A loaded llama/qwen3 model with its KV cache on backend `B`.
pub struct Llama<B: Backend> {
    backend: B,
    config: ModelConfig,
    weights: LlamaWeights<B>,
    kv_cache: B::KvCache,
    geometry: CacheGeometry,
    /// The workspace (made at the first step), the eager step's metadata, the decode graphs
    /// ([`Llama::with_decode_graphs`]) and the submitted steps.
    steps: StepState<B, Workspace<B>>,
}

impl<B: Backend> Llama<B> {
    /// Make the workspace (at the first step) for at least `tokens` tokens and `rows` logits
    /// rows per step: the engine's `max_num_batched_tokens` and `max_num_seqs`, so a GPU runner
    /// holds the memory the planner counted from its start and never grows it in service.
    pub fn reserve_workspace(mut self, tokens: usize, rows: usize) -> Self {
        self.steps.reserve = (tokens, rows);
        self
    }

    /// Replay decode-only steps from CUDA-style graphs, one per batch bucket (1, 2, 4, … up to
    /// `max_num_seqs`), each recorded at its first use ([`decode_graphs`]). The last KV block
    /// becomes the padding rows' scratch block: the runner reports one block fewer. A backend
    /// without graphs ([`Backend::supports_graphs`]), or a cache of one block, stays eager.
    pub fn with_decode_graphs(mut self, max_num_seqs: usize, max_model_len: usize) -> Self {
        if let Some(g) = decode_graphs::DecodeGraphs::for_runner(
            &self.backend,
            &mut self.geometry,
            self.config.max_position_embeddings,
            max_num_seqs,
            max_model_len,
        ) {
            self.steps.graphs = Some(g);
        }
        self
    }

    /// What the decode graphs have done; `None` when this runner has none.
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.steps.graphs.as_ref().map(|g| g.stats())
    }

    /// The KV-cache geometry `config` needs for `num_blocks` blocks of `block_size` tokens.
    pub fn kv_spec(config: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_layers: config.num_hidden_layers,
            num_blocks,
            block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Queue one step: its metadata, `feeds` (token, sampling row of the last queued step)
    /// copied on the device from that step's sampled ids, the layers and the logits, then the
    /// sampling (queued, not waited for). Raw logits rows (`Last` / `All`) are downloaded here.
    fn run(
        &mut self,
        batch: &ForwardBatch,
        feeds: &[(u32, u32)],
    ) -> Result<QueuedStep<B>, EngineError> {
        let input = runner_step_input(batch, &self.geometry, &self.config)?;
        if input.num_tokens() == 0 {
            return Ok(QueuedStep::empty());
        }
        let Llama {
            backend,
            config,
            weights,
            kv_cache,
            steps,
            ..
        } = self;
        let (backend, config, weights) = (&*backend, &*config, &*weights);
        submit_step(
            backend,
            steps,
            batch,
            &input,
            feeds,
            config.vocab_size,
            |tokens, rows| Workspace::new(backend, config, weights, tokens, rows),
            |ws, st, t, rows| weights.queue(backend, config, kv_cache, ws, st, t, rows),
        )
    }
}

impl<B: Backend> StepBuffers<B> for Workspace<B> {
    fn capacity(&self) -> (usize, usize) {
        (self.tokens, self.rows)
    }

    fn logits(&self) -> &B::Logits {
        &self.logits
    }
}

impl<B: Backend> Workspace<B> {
    /// Buffers for `tokens` tokens and `rows` logits rows of `c`'s model with `weights`' layout.
    fn new(
        b: &B,
        c: &ModelConfig,
        weights: &LlamaWeights<B>,
        tokens: usize,
        rows: usize,
    ) -> Result<Workspace<B>, EngineError> {
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let any_split_qkv = weights
            .layers
            .iter()
            .any(|l| matches!(l.qkv, QkvProj::Split { .. }));
        let any_fused_qkv = weights
            .layers
            .iter()
            .any(|l| matches!(l.qkv, QkvProj::Fused(_)));
        let any_split_mlp = weights
            .layers
            .iter()
            .any(|l| matches!(l.gate_up, GateUpProj::Split { .. }));
        let any_fused_mlp = weights
            .layers
            .iter()
            .any(|l| matches!(l.gate_up, GateUpProj::Fused(_)));
        let qk_norm = weights.layers.iter().any(|l| l.k_norm.is_some());
        let sized = |on: bool, n: usize| if on { tokens * n } else { 0 };
        Ok(Workspace {
            tokens,
            rows,
            x: b.alloc_f32(tokens * hidden)?,
            h: b.alloc(tokens * hidden)?,
            delta: b.alloc(tokens * hidden)?,
            qkv: b.alloc(sized(any_fused_qkv, q_dim + 2 * kv_dim))?,
            q: b.alloc(tokens * q_dim)?,
            k: b.alloc(sized(any_split_qkv, kv_dim))?,
            v: b.alloc(sized(any_split_qkv, kv_dim))?,
            k_normed: b.alloc(sized(any_split_qkv && qk_norm, kv_dim))?,
            a: b.alloc(tokens * q_dim)?,
            gate_up: b.alloc(sized(any_fused_mlp, 2 * inter))?,
            gate: b.alloc(sized(any_split_mlp, inter))?,
            up: b.alloc(sized(any_split_mlp, inter))?,
            act: b.alloc(tokens * inter)?,
            last: b.alloc(rows * hidden)?,
            logits: b.alloc_logits(rows, c.vocab_size)?,
        })
    }
}

impl<B: Backend> LlamaWeights<B> {
    /// Queue every layer over the `t` tokens of `step` (the step's metadata on the device), then
    /// the f32 logits of its `rows` logit rows into `ws.logits`, where they stay. Only device
    /// work, with no host synchronization and no allocation: this is what a decode graph
    /// records ([`decode_graphs`]).
    #[allow(clippy::too_many_arguments)]
    fn queue(
        &self,
        b: &B,
        c: &ModelConfig,
        kv_cache: &mut B::KvCache,
        ws: &mut Workspace<B>,
        step: &B::Step,
        t: usize,
        rows: usize,
    ) -> Result<(), EngineError> {
        let (hidden, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let (nh, nkv, inter) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.intermediate_size,
        );
        let attn = c.attention_params();
        if t <= self.fused_decode_rows(b) {
            return self.queue_fused(b, c, kv_cache, ws, step, t, rows);
        }
        b.embedding(&self.embed_tokens, step, &mut ws.x)?;
        b.rms_norm(
            &ws.x,
            &self.layers[0].input_layernorm,
            &mut ws.h,
            t,
            hidden,
            eps,
        )?;
        for (i, layer) in self.layers.iter().enumerate() {
            let qk_norm = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => Some((qn, kn, eps)),
                _ => None,
            };
            match &layer.qkv {
                QkvProj::Fused(w) => {
                    b.matmul(&ws.h, t, w, &mut ws.qkv)?;
                    b.qkv_rope_write(
                        &ws.qkv, &mut ws.q, kv_cache, i, &self.rope, step, &attn, qk_norm,
                    )?;
                }
                QkvProj::Split { q, k, v } => {
                    b.matmul(&ws.h, t, k, &mut ws.k)?;
                    b.matmul(&ws.h, t, v, &mut ws.v)?;
                    if let Some((qn, kn, _)) = qk_norm {
                        // `a` is free until the attention output: the raw q goes there.
                        b.matmul(&ws.h, t, q, &mut ws.a)?;
                        b.rms_norm(&ws.a, qn, &mut ws.q, t * nh, hd, eps)?;
                        b.rms_norm(&ws.k, kn, &mut ws.k_normed, t * nkv, hd, eps)?;
                        std::mem::swap(&mut ws.k, &mut ws.k_normed);
                    } else {
                        b.matmul(&ws.h, t, q, &mut ws.q)?;
                    }
                    b.rope(&mut ws.q, &mut ws.k, &self.rope, step, nh, nkv, hd)?;
                    b.write_kv(kv_cache, i, &ws.k, &ws.v, step)?;
                }
            }
            b.paged_attention(&ws.q, kv_cache, i, step, &attn, &mut ws.a)?;
            b.matmul(&ws.a, t, &layer.o_proj, &mut ws.delta)?;
            b.add_rms_norm(
                &mut ws.x,
                &ws.delta,
                &layer.post_attention_layernorm,
                &mut ws.h,
                t,
                hidden,
                eps,
            )?;
            match &layer.gate_up {
                GateUpProj::Fused(w) => {
                    b.gate_up_swiglu(&ws.h, t, w, &mut ws.gate_up, &mut ws.act, inter)?;
                }
                GateUpProj::Split { gate, up } => {
                    b.matmul(&ws.h, t, gate, &mut ws.gate)?;
                    b.matmul(&ws.h, t, up, &mut ws.up)?;
                    b.silu_mul(&ws.gate, &ws.up, &mut ws.act, t * inter)?;
                }
            }
            b.matmul(&ws.act, t, &layer.down_proj, &mut ws.delta)?;
            let next_norm = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |l| &l.input_layernorm);
            b.add_rms_norm(&mut ws.x, &ws.delta, next_norm, &mut ws.h, t, hidden, eps)?;
        }
        let lm_head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        queue_logits(
            b,
            &ws.h,
            step,
            hidden,
            rows,
            lm_head,
            &mut ws.last,
            &mut ws.logits,
        )
    }
}

impl<B: Backend> LlamaWeights<B> {
    /// Largest step the fused decode layer ([`LlamaWeights::queue_fused`]) takes: what the
    /// backend says for every layer's weights ([`Backend::fused_decode_rows`]), 0 when a layer
    /// has split q/k/v or gate/up projections or per-head q/k norms.
    fn fused_decode_rows(&self, b: &B) -> usize {
        let mut rows = usize::MAX;
        for l in &self.layers {
            let (QkvProj::Fused(qkv), GateUpProj::Fused(gu)) = (&l.qkv, &l.gate_up) else {
                return 0;
            };
            if l.q_norm.is_some() {
                return 0;
            }
            rows = rows.min(b.fused_decode_rows(&[qkv, &l.o_proj, gu, &l.down_proj]));
        }
        if rows == usize::MAX {
            0
        } else {
            rows
        }
    }

    /// [`LlamaWeights::queue`] for a step of at most [`LlamaWeights::fused_decode_rows`] tokens:
    /// per layer the input norm, the q|k|v matmul and the attention input (RoPE, KV write) in one
    /// op ([`Backend::norm_matmul_rope_write`]), attention, o_proj adding into the residual
    /// ([`Backend::matmul_residual`]), the post-attention norm in the gate|up matmul with its
    /// SwiGLU ([`Backend::norm_gate_up_swiglu`]) and down_proj adding into the residual: 4 ops
    /// (plus attention's) where the unfused layer has 7. The same values as the unfused layer,
    /// bit for bit, where the backend promises it (CUDA under `KILN_DENSE_MATMUL=mma`, the default
    /// on sm_80+ with 16-bit compute: `tests/cuda_fused_invariance.rs`).
    #[allow(clippy::too_many_arguments)]
    fn queue_fused(
        &self,
        b: &B,
        c: &ModelConfig,
        kv_cache: &mut B::KvCache,
        ws: &mut Workspace<B>,
        step: &B::Step,
        t: usize,
        rows: usize,
    ) -> Result<(), EngineError> {
        let (hidden, eps, inter) = (c.hidden_size, c.rms_norm_eps, c.intermediate_size);
        let attn = c.attention_params();
        b.embedding(&self.embed_tokens, step, &mut ws.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (QkvProj::Fused(qkv), GateUpProj::Fused(gu)) = (&layer.qkv, &layer.gate_up) else {
                return Err(EngineError::Internal(
                    "fused decode layer over split projections".into(),
                ));
            };
            b.norm_matmul_rope_write(
                &ws.x,
                &layer.input_layernorm,
                eps,
                t,
                hidden,
                qkv,
                &mut ws.h,
                &mut ws.qkv,
                &mut ws.q,
                kv_cache,
                i,
                &self.rope,
                step,
                &attn,
            )?;
            b.paged_attention(&ws.q, kv_cache, i, step, &attn, &mut ws.a)?;
            b.matmul_residual(&ws.a, t, &layer.o_proj, &mut ws.delta, &mut ws.x, hidden)?;
            b.norm_gate_up_swiglu(
                &ws.x,
                &layer.post_attention_layernorm,
                eps,
                t,
                hidden,
                gu,
                &mut ws.h,
                &mut ws.gate_up,
                &mut ws.act,
                inter,
            )?;
            b.matmul_residual(
                &ws.act,
                t,
                &layer.down_proj,
                &mut ws.delta,
                &mut ws.x,
                hidden,
            )?;
        }
        if rows == 0 {
            return Ok(());
        }
        b.rms_norm(&ws.x, &self.norm, &mut ws.h, t, hidden, eps)?;
        let lm_head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        queue_logits(
            b,
            &ws.h,
            step,
            hidden,
            rows,
            lm_head,
            &mut ws.last,
            &mut ws.logits,
        )
    }
}

impl<B: Backend> ModelRunner for Llama<B> {
    queued_runner_methods!();

    fn weight_bytes(&self) -> u64 {
        let (b, w) = (&self.backend, &self.weights);
        let layers: usize = w
            .layers
            .iter()
            .map(|l| {
                l.matrices()
                    .iter()
                    .map(|m| b.weight_bytes(m))
                    .sum::<usize>()
            })
            .sum();
        let head = w.lm_head.as_ref().unwrap_or(&w.embed_tokens);
        (layers + b.weight_bytes(head)) as u64
    }
}

pub(crate) mod decode_graphs;
mod load;
pub use decode_graphs::GraphStats;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tiny;
