//! Gated DeltaNet on the CPU: the state cache, the causal depthwise conv with its state, the
//! gated delta rule (recurrent step and chunked form), the gated RMSNorm, and the small ops of
//! Qwen3.5's gated attention (query/gate split, sigmoid gate).
//!
//! Math as transformers `modeling_qwen3_5.py` (shared/docs/qwen3_5.md §3.3–§3.7), all in f32:
//! the state `S` of a value head is `[dk, dv]` (transformers' layout), `kv[j] = Σ_i S[i,j]·k[i]`.
//! Chunked form per chunk of `L ≤ 64` tokens (rows = positions, `gc` = cumsum of `g`):
//! ```text
//! A[i,j] = β_i (k_i·k_j) exp(gc_i − gc_j)  for j < i           (strictly lower)
//! (I + A) U = β ⊙ V,   (I + A) W = β ⊙ K ⊙ exp(gc)           (forward substitution)
//! Vn = U − W S
//! O_i = exp(gc_i) q_iᵀ S + Σ_{j ≤ i} (q_i·k_j) exp(gc_i − gc_j) Vn_j
//! S' = exp(gc_last) S + Σ_j exp(gc_last − gc_j) k_j ⊗ Vn_j
//! ```
//! transformers pads the last chunk with zero rows; those change nothing, so a short last chunk
//! is computed as is. Dot products accumulate in f64 (the reference is f32; this is at least
//! as exact). Work is split over (sequence, value head) pairs with rayon.

use rayon::prelude::*;

use crate::backend::hybrid::StateSpec;
use crate::backend::StepInput;

mod delta_rule;
#[cfg(test)]
mod tests;

pub use delta_rule::{recurrence, Form};

/// Tokens per chunk of the chunked form (transformers' `chunk_size`).
pub const CHUNK: usize = 64;

/// l2norm epsilon (inside the square root), as transformers / FLA.
pub(crate) const L2_EPS: f32 = 1e-6;

/// The state slots on the host: per slot and GDN layer, the conv state `[kernel − 1, conv_dim]`
/// (oldest row first) and the recurrent state `[value_heads, dk, dv]`, all f32.
#[derive(Debug, Clone)]
pub struct CpuStateCache {
    /// Geometry.
    pub spec: StateSpec,
    /// `[slots, layers, kernel − 1, conv_dim]`.
    pub conv: Vec<f32>,
    /// `[slots, layers, value_heads, dk, dv]`.
    pub recurrent: Vec<f32>,
}

impl CpuStateCache {
    /// A zeroed cache; `None` when the host cannot hold it.
    pub fn new(spec: StateSpec) -> Option<CpuStateCache> {
        let conv_len = spec.num_slots * spec.num_layers * spec.conv_elems();
        let rec_len = spec.num_slots * spec.num_layers * spec.recurrent_elems();
        let mut conv = Vec::new();
        conv.try_reserve_exact(conv_len).ok()?;
        conv.resize(conv_len, 0.0);
        let mut recurrent = Vec::new();
        recurrent.try_reserve_exact(rec_len).ok()?;
        recurrent.resize(rec_len, 0.0);
        Some(CpuStateCache {
            spec,
            conv,
            recurrent,
        })
    }

    fn conv_range(&self, slot: usize, layer: usize) -> std::ops::Range<usize> {
        let n = self.spec.conv_elems();
        let start = (slot * self.spec.num_layers + layer) * n;
        start..start + n
    }

    fn recurrent_range(&self, slot: usize, layer: usize) -> std::ops::Range<usize> {
        let n = self.spec.recurrent_elems();
        let start = (slot * self.spec.num_layers + layer) * n;
        start..start + n
    }

    /// Zero every layer of `slot`.
    pub fn reset(&mut self, slot: usize) {
        for layer in 0..self.spec.num_layers {
            let c = self.conv_range(slot, layer);
            self.conv[c].fill(0.0);
            let r = self.recurrent_range(slot, layer);
            self.recurrent[r].fill(0.0);
        }
    }

    /// Copy every layer of `src` into `dst`.
    pub fn copy_slot(&mut self, src: usize, dst: usize) {
        if src == dst {
            return;
        }
        let per = self.spec.num_layers;
        let (cn, rn) = (
            self.spec.conv_elems() * per,
            self.spec.recurrent_elems() * per,
        );
        self.conv.copy_within(src * cn..(src + 1) * cn, dst * cn);
        self.recurrent
            .copy_within(src * rn..(src + 1) * rn, dst * rn);
    }

    /// The conv and recurrent state of `slot` in `layer` (for tests and checkpoints).
    pub fn slot_layer(&self, slot: usize, layer: usize) -> (&[f32], &[f32]) {
        (
            &self.conv[self.conv_range(slot, layer)],
            &self.recurrent[self.recurrent_range(slot, layer)],
        )
    }
}

/// `(token range, slot, fresh)` of each sequence of `step` (the caller checked the slots).
pub(crate) fn seq_ranges(step: &StepInput) -> Vec<(usize, usize, usize, bool)> {
    step.seqs
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| {
            (
                s.token_start,
                s.len,
                s.state_slot.expect("checked") as usize,
                s.cached_len == 0,
            )
        })
        .collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch `softplus` (beta 1, threshold 20).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Causal depthwise conv + SiLU of `layer` (see `HybridBackend::gdn_conv1d`). `weight`:
/// `[conv_dim, kernel]`; `mixed`, `out`: `[tokens, conv_dim]`.
pub fn conv1d(
    cache: &mut CpuStateCache,
    layer: usize,
    mixed: &[f32],
    weight: &[f32],
    step: &StepInput,
    out: &mut [f32],
) {
    let spec = cache.spec;
    let (dim, kern) = (spec.conv_dim, spec.conv_kernel);
    let hist = kern - 1;
    for (start, len, slot, fresh) in seq_ranges(step) {
        let range = cache.conv_range(slot, layer);
        let state = &mut cache.conv[range];
        if fresh {
            state.fill(0.0);
        }
        // Window rows: `hist` state rows, then the `len` new rows.
        let x = &mixed[start * dim..(start + len) * dim];
        let row = |r: usize, c: usize, state: &[f32]| -> f32 {
            if r < hist {
                state[r * dim + c]
            } else {
                x[(r - hist) * dim + c]
            }
        };
        let o = &mut out[start * dim..(start + len) * dim];
        let st: &[f32] = state;
        o.par_chunks_mut(dim).enumerate().for_each(|(t, orow)| {
            for (c, ov) in orow.iter_mut().enumerate() {
                let w = &weight[c * kern..(c + 1) * kern];
                let mut acc = 0.0f32;
                for (j, &wj) in w.iter().enumerate() {
                    acc += wj * row(t + j, c, st);
                }
                *ov = silu(acc);
            }
        });
        // New state: the last `hist` rows of [state; new].
        let mut new_state = vec![0.0f32; hist * dim];
        for r in 0..hist {
            let src = len + r; // row index in the window of hist + len rows
            for c in 0..dim {
                new_state[r * dim + c] = row(src, c, st);
            }
        }
        state.copy_from_slice(&new_state);
    }
}

/// Gated RMSNorm rows of `dim`: `out = x/rms(x) · weight · silu(z)`.
/// One row of the zero-centred RMSNorm: `out = (1 + w) · x / sqrt(mean(x²) + eps)`, `1 + w` in f32.
fn rms_norm_1p_row(x: &[f32], w: &[f32], out: &mut [f32], eps: f32) {
    let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let inv = 1.0 / ((sum_sq / x.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
        *o = (1.0 + w) * (v * inv);
    }
}

/// The zero-centred RMSNorm over rows of `dim` (`weight` = the stored `w`).
pub fn rms_norm_1p(x: &[f32], weight: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    out.par_chunks_mut(dim)
        .zip(x.par_chunks(dim))
        .for_each(|(o, x)| rms_norm_1p_row(x, weight, o, eps));
}

/// `residual += delta`, then [`rms_norm_1p`] of it into `out`.
pub fn add_rms_norm_1p(
    residual: &mut [f32],
    delta: &[f32],
    weight: &[f32],
    out: &mut [f32],
    dim: usize,
    eps: f32,
) {
    residual
        .par_chunks_mut(dim)
        .zip(delta.par_chunks(dim))
        .zip(out.par_chunks_mut(dim))
        .for_each(|((r, d), o)| {
            r.iter_mut().zip(d).for_each(|(r, &d)| *r += d);
            rms_norm_1p_row(r, weight, o, eps);
        });
}

pub fn gated_rms_norm(x: &[f32], z: &[f32], weight: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    out.par_chunks_mut(dim)
        .zip(x.par_chunks(dim))
        .zip(z.par_chunks(dim))
        .for_each(|((o, x), z)| {
            let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let inv = 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
            for (((o, &x), &z), &w) in o.iter_mut().zip(x).zip(z).zip(weight) {
                *o = w * (x * inv) * silu(z);
            }
        });
}

/// `[tokens, heads, 2·hd]` (per head `[query | gate]`) → `q` `[tokens, heads, hd]`, `gate`
/// `[tokens, heads·hd]`.
pub fn split_query_gate(qg: &[f32], q: &mut [f32], gate: &mut [f32], hd: usize) {
    for ((src, q), g) in qg
        .chunks(2 * hd)
        .zip(q.chunks_mut(hd))
        .zip(gate.chunks_mut(hd))
    {
        q.copy_from_slice(&src[..hd]);
        g.copy_from_slice(&src[hd..]);
    }
}

/// `x *= sigmoid(gate)`.
pub fn sigmoid_mul(x: &mut [f32], gate: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(gate.par_chunks(4096))
        .for_each(|(x, g)| {
            for (x, &g) in x.iter_mut().zip(g) {
                *x *= sigmoid(g);
            }
        });
}
