//! One step of the Qwen3.5 forward pass (the math is in the parent module's docs).

use crate::backend::hybrid::{GdnParams, HybridBackend};
use crate::backend::StepInput;
use crate::error::EngineError;
use crate::model::step::{ForwardBatch, ForwardOutput, LogitsFor};
use crate::model::ModelConfig;

use super::{Mixer, Weights};

/// Run every layer over the step's tokens; logits rows as `Llama` returns them (raw rows for
/// `Last` / `All`, device-sampled tokens for `Sample`).
#[allow(clippy::too_many_arguments)]
pub(super) fn run<B: HybridBackend>(
    w: &Weights<B>,
    b: &B,
    c: &ModelConfig,
    gdn: &GdnParams,
    kv_cache: &mut B::KvCache,
    states: &mut B::StateCache,
    input: &StepInput,
    batch: &ForwardBatch,
) -> Result<ForwardOutput, EngineError> {
    let t = input.num_tokens();
    let (hidden, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
    let (nh, nkv, inter) = (
        c.num_attention_heads,
        c.num_key_value_heads,
        c.intermediate_size,
    );
    let attn = c.attention_params();
    let (conv_dim, value_dim, nv, dv) = (
        gdn.conv_dim(),
        gdn.value_dim(),
        gdn.num_value_heads,
        gdn.value_head_dim,
    );
    let has = |full: bool| {
        w.layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::Full(_)) == full)
    };
    let (any_full, any_linear) = (has(true), has(false));
    let sz = |on: bool, n: usize| if on { n } else { 0 };
    let step = b.prepare_step(input)?;

    let mut x = b.alloc_f32(t * hidden)?;
    let mut h = b.alloc(t * hidden)?;
    let mut delta = b.alloc(t * hidden)?;
    // Full attention.
    let mut qg = b.alloc(sz(any_full, 2 * t * nh * hd))?;
    let mut q = b.alloc(sz(any_full, t * nh * hd))?;
    let mut qn = b.alloc(sz(any_full, t * nh * hd))?;
    let mut gate = b.alloc(sz(any_full, t * nh * hd))?;
    let mut k = b.alloc(sz(any_full, t * nkv * hd))?;
    let mut kn = b.alloc(sz(any_full, t * nkv * hd))?;
    let mut v = b.alloc(sz(any_full, t * nkv * hd))?;
    let mut att = b.alloc(sz(any_full, t * nh * hd))?;
    // Gated DeltaNet.
    let mut mixed = b.alloc(sz(any_linear, t * conv_dim))?;
    let mut conv = b.alloc(sz(any_linear, t * conv_dim))?;
    let mut z = b.alloc(sz(any_linear, t * value_dim))?;
    let mut gb = b.alloc(sz(any_linear, t * nv))?;
    let mut ga = b.alloc(sz(any_linear, t * nv))?;
    let mut o = b.alloc(sz(any_linear, t * value_dim))?;
    let mut y = b.alloc(sz(any_linear, t * value_dim))?;
    // MLP.
    let mut g_mlp = b.alloc(t * inter)?;
    let mut up = b.alloc(t * inter)?;
    let mut act = b.alloc(t * inter)?;

    b.embedding(&w.embed_tokens, &step, &mut x)?;
    b.rms_norm(&x, &w.layers[0].input_layernorm, &mut h, t, hidden, eps)?;
    for (i, layer) in w.layers.iter().enumerate() {
        match &layer.mixer {
            Mixer::Linear(g) => {
                b.matmul(&h, t, &g.in_proj_qkv, &mut mixed)?;
                b.matmul(&h, t, &g.in_proj_z, &mut z)?;
                b.matmul(&h, t, &g.in_proj_b, &mut gb)?;
                b.matmul(&h, t, &g.in_proj_a, &mut ga)?;
                b.gdn_conv1d(states, g.state_layer, &mixed, &g.conv1d, &step, &mut conv)?;
                b.gdn_recurrence(
                    states,
                    g.state_layer,
                    &conv,
                    &ga,
                    &gb,
                    &g.a_log,
                    &g.dt_bias,
                    &step,
                    gdn,
                    &mut o,
                )?;
                b.gated_rms_norm(&o, &z, &g.norm, &mut y, t * nv, dv, eps)?;
                b.matmul(&y, t, &g.out_proj, &mut delta)?;
            }
            Mixer::Full(a) => {
                b.matmul(&h, t, &a.q_proj, &mut qg)?;
                b.split_query_gate(&qg, &mut q, &mut gate, t, nh, hd)?;
                b.matmul(&h, t, &a.k_proj, &mut k)?;
                b.matmul(&h, t, &a.v_proj, &mut v)?;
                b.rms_norm(&q, &a.q_norm, &mut qn, t * nh, hd, eps)?;
                b.rms_norm(&k, &a.k_norm, &mut kn, t * nkv, hd, eps)?;
                b.rope(&mut qn, &mut kn, &w.rope, &step, nh, nkv, hd)?;
                b.write_kv(kv_cache, a.kv_layer, &kn, &v, &step)?;
                b.paged_attention(&qn, kv_cache, a.kv_layer, &step, &attn, &mut att)?;
                b.sigmoid_mul(&mut att, &gate, t * nh * hd)?;
                b.matmul(&att, t, &a.o_proj, &mut delta)?;
            }
        }
        b.add_rms_norm(
            &mut x,
            &delta,
            &layer.post_attention_layernorm,
            &mut h,
            t,
            hidden,
            eps,
        )?;
        b.matmul(&h, t, &layer.gate_proj, &mut g_mlp)?;
        b.matmul(&h, t, &layer.up_proj, &mut up)?;
        b.silu_mul(&g_mlp, &up, &mut act, t * inter)?;
        b.matmul(&act, t, &layer.down_proj, &mut delta)?;
        let next_norm = w.layers.get(i + 1).map_or(&w.norm, |l| &l.input_layernorm);
        b.add_rms_norm(&mut x, &delta, next_norm, &mut h, t, hidden, eps)?;
    }

    let rows = input.logit_rows.len();
    let mut out = ForwardOutput::default();
    if rows == 0 {
        return Ok(out);
    }
    let mut last = b.alloc(rows * hidden)?;
    b.gather_rows(&h, &step, hidden, &mut last)?;
    let lm_head = w.lm_head.as_ref().unwrap_or(&w.embed_tokens);
    let logits = b.logits(&last, rows, lm_head)?;
    let mut row = 0;
    let mut picks = Vec::new();
    for s in &batch.seqs {
        let n = s.logits.rows(s.len);
        match &s.logits {
            LogitsFor::None => {}
            LogitsFor::Sample(desc) => picks.push((row, desc)),
            LogitsFor::Last | LogitsFor::All => {
                let at = out.logits.len();
                out.logits.resize(at + n * c.vocab_size, 0.0);
                b.download_logits(&logits, row, &mut out.logits[at..])?;
            }
        }
        row += n;
    }
    if !picks.is_empty() {
        out.samples = b.sample(&logits, &picks)?;
    }
    Ok(out)
}
