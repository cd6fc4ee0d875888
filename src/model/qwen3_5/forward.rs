//! One step of the Qwen3.5 forward pass (the math is in the parent module's docs), over a
//! [`Workspace`] of activations and logits the runner keeps for its life (made at the first
//! step for at least the reserved limits, remade only for a larger step), so a step allocates
//! nothing on the device. [`queue`] only queues work (no host synchronization, no allocation,
//! every per-step value read from the step metadata on the device): it is what a decode graph
//! records (`super::run`).

use crate::backend::hybrid::{GatedQkv, GatedQkvOut, GdnParams, HybridBackend};
use crate::error::EngineError;
use crate::model::step_submit::queue_logits;
use crate::model::ModelConfig;

use super::{Mixer, Weights};

/// The runner's persistent buffers for steps of up to `tokens` tokens and `rows` logits rows.
/// Buffers of a mixer no layer has are empty.
pub(super) struct Workspace<B: HybridBackend> {
    pub(super) tokens: usize,
    pub(super) rows: usize,
    /// Residual stream `[tokens, hidden]`, f32.
    x: B::Buffer,
    /// Normed input of the next sub-block, and the mixer / MLP output `[tokens, hidden]`.
    h: B::Buffer,
    delta: B::Buffer,
    /// Gated attention: `[q | gate]` rows `[tokens, 2·q_dim]`, q and normed q, gate, attention
    /// output `[tokens, q_dim]`; k, normed k, v `[tokens, kv_dim]`.
    qg: B::Buffer,
    q: B::Buffer,
    qn: B::Buffer,
    gate: B::Buffer,
    att: B::Buffer,
    k: B::Buffer,
    kn: B::Buffer,
    v: B::Buffer,
    /// GDN: pre-conv and conv rows `[tokens, conv_dim]`; z, delta-rule output, gated-norm
    /// output `[tokens, value_dim]`; b, a `[tokens, value_heads]`.
    mixed: B::Buffer,
    conv: B::Buffer,
    z: B::Buffer,
    o: B::Buffer,
    y: B::Buffer,
    gb: B::Buffer,
    ga: B::Buffer,
    /// MLP gate, up, SiLU·up `[tokens, intermediate]`.
    g_mlp: B::Buffer,
    up: B::Buffer,
    act: B::Buffer,
    /// Gathered logits rows of h `[rows, hidden]` and their f32 logits `[rows, vocab]`.
    last: B::Buffer,
    pub(super) logits: B::Logits,
}

impl<B: HybridBackend> Workspace<B> {
    /// Buffers for `tokens` tokens and `rows` logits rows.
    pub(super) fn new(
        b: &B,
        c: &ModelConfig,
        gdn: &GdnParams,
        w: &Weights<B>,
        tokens: usize,
        rows: usize,
    ) -> Result<Workspace<B>, EngineError> {
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let has = |full: bool| {
            w.layers
                .iter()
                .any(|l| matches!(l.mixer, Mixer::Full(_)) == full)
        };
        let (full, linear) = (has(true), has(false));
        let sz = |on: bool, n: usize| if on { tokens * n } else { 0 };
        Ok(Workspace {
            tokens,
            rows,
            x: b.alloc_f32(tokens * hidden)?,
            h: b.alloc(tokens * hidden)?,
            delta: b.alloc(tokens * hidden)?,
            qg: b.alloc(sz(full, 2 * q_dim))?,
            q: b.alloc(sz(full, q_dim))?,
            qn: b.alloc(sz(full, q_dim))?,
            gate: b.alloc(sz(full, q_dim))?,
            att: b.alloc(sz(full, q_dim))?,
            k: b.alloc(sz(full, kv_dim))?,
            kn: b.alloc(sz(full, kv_dim))?,
            v: b.alloc(sz(full, kv_dim))?,
            mixed: b.alloc(sz(linear, gdn.conv_dim()))?,
            conv: b.alloc(sz(linear, gdn.conv_dim()))?,
            z: b.alloc(sz(linear, gdn.value_dim()))?,
            o: b.alloc(sz(linear, gdn.value_dim()))?,
            y: b.alloc(sz(linear, gdn.value_dim()))?,
            gb: b.alloc(sz(linear, gdn.num_value_heads))?,
            ga: b.alloc(sz(linear, gdn.num_value_heads))?,
            g_mlp: b.alloc(tokens * inter)?,
            up: b.alloc(tokens * inter)?,
            act: b.alloc(tokens * inter)?,
            last: b.alloc(rows * hidden)?,
            logits: b.alloc_logits(rows, c.vocab_size)?,
        })
    }
}

/// Queue every layer over the `t` tokens of `step`, then the logits of its first `rows` logits
/// rows into `ws.logits` (nothing when `rows` is 0). A decode graph's step is padded: `t` and
/// `rows` are its bucket size.
#[allow(clippy::too_many_arguments)]
pub(super) fn queue<B: HybridBackend>(
    w: &Weights<B>,
    b: &B,
    c: &ModelConfig,
    gdn: &GdnParams,
    kv_cache: &mut B::KvCache,
    states: &mut B::StateCache,
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
    let (nv, dv) = (gdn.num_value_heads, gdn.value_head_dim);
    let Workspace {
        x,
        h,
        delta,
        qg,
        q,
        qn,
        gate,
        att,
        k,
        kn,
        v,
        mixed,
        conv,
        z,
        o,
        y,
        gb,
        ga,
        g_mlp,
        up,
        act,
        last,
        logits,
        ..
    } = ws;

    b.embedding(&w.embed_tokens, step, x)?;
    b.rms_norm_1p(&*x, &w.layers[0].input_layernorm, h, t, hidden, eps)?;
    for (i, layer) in w.layers.iter().enumerate() {
        match &layer.mixer {
            Mixer::Linear(g) => {
                b.matmul(&*h, t, &g.in_proj_qkv, mixed)?;
                b.matmul(&*h, t, &g.in_proj_z, z)?;
                b.matmul(&*h, t, &g.in_proj_b, gb)?;
                b.matmul(&*h, t, &g.in_proj_a, ga)?;
                b.gdn_conv1d(states, g.state_layer, &*mixed, &g.conv1d, step, conv)?;
                b.gdn_recurrence(
                    states,
                    g.state_layer,
                    &*conv,
                    &*ga,
                    &*gb,
                    &g.a_log,
                    &g.dt_bias,
                    step,
                    gdn,
                    o,
                )?;
                b.gated_rms_norm(&*o, &*z, &g.norm, y, t * nv, dv, eps)?;
                b.matmul(&*y, t, &g.out_proj, delta)?;
            }
            Mixer::Full(a) => {
                b.matmul(&*h, t, &a.q_proj, qg)?;
                b.matmul(&*h, t, &a.k_proj, k)?;
                b.matmul(&*h, t, &a.v_proj, v)?;
                // Split, (1 + w) norms, partial RoPE and the KV write: one kernel on CUDA.
                let x = GatedQkv {
                    qg: &*qg,
                    k: &*k,
                    v: &*v,
                    q_norm: &a.q_norm,
                    k_norm: &a.k_norm,
                    eps,
                    tokens: t,
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                };
                let out = GatedQkvOut {
                    q: &mut *qn,
                    gate: &mut *gate,
                    q_scratch: &mut *q,
                    k_scratch: &mut *kn,
                };
                b.gated_qkv_rope_write(&x, &w.rope, kv_cache, a.kv_layer, step, out)?;
                // Attention with the sigmoid output gate fused (two ops on the CPU).
                b.gated_paged_attention(&*qn, &*gate, t, kv_cache, a.kv_layer, step, &attn, att)?;
                b.matmul(&*att, t, &a.o_proj, delta)?;
            }
        }
        b.add_rms_norm_1p(
            x,
            &*delta,
            &layer.post_attention_layernorm,
            h,
            t,
            hidden,
            eps,
        )?;
        b.matmul(&*h, t, &layer.gate_proj, g_mlp)?;
        b.matmul(&*h, t, &layer.up_proj, up)?;
        b.silu_mul(&*g_mlp, &*up, act, t * inter)?;
        b.matmul(&*act, t, &layer.down_proj, delta)?;
        let next_norm = w.layers.get(i + 1).map_or(&w.norm, |l| &l.input_layernorm);
        b.add_rms_norm_1p(x, &*delta, next_norm, h, t, hidden, eps)?;
    }

    let lm_head = w.lm_head.as_ref().unwrap_or(&w.embed_tokens);
    queue_logits(b, &*h, step, hidden, rows, lm_head, last, logits)
}
