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

use crate::backend::hybrid::{GdnParams, StateSpec};
use crate::backend::StepInput;

/// Tokens per chunk of the chunked form (transformers' `chunk_size`).
pub const CHUNK: usize = 64;

/// l2norm epsilon (inside the square root), as transformers / FLA.
const L2_EPS: f32 = 1e-6;

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
fn seq_ranges(step: &StepInput) -> Vec<(usize, usize, usize, bool)> {
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

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch `softplus` (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
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

/// Per-token inputs of one value head: `q̂`, `k̂` (l2-normed, q scaled by `dk^-0.5`), `v`, `β`, `g`.
struct HeadInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

fn l2norm_into(src: &[f32], dst: &mut [f32], scale: f32) {
    let ss: f64 = src.iter().map(|&x| (x as f64) * (x as f64)).sum();
    let inv = 1.0 / ((ss as f32) + L2_EPS).sqrt();
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s * inv * scale;
    }
}

#[allow(clippy::too_many_arguments)]
fn head_inputs(
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: f32,
    dt_bias: f32,
    p: &GdnParams,
    h: usize,
    start: usize,
    len: usize,
) -> HeadInputs {
    let (dk, dv, nv) = (p.key_head_dim, p.value_head_dim, p.num_value_heads);
    let kh = h / (p.num_value_heads / p.num_key_heads);
    let conv_dim = p.conv_dim();
    let (kd, scale) = (p.key_dim(), (dk as f32).powf(-0.5));
    let mut x = HeadInputs {
        q: vec![0.0; len * dk],
        k: vec![0.0; len * dk],
        v: vec![0.0; len * dv],
        beta: vec![0.0; len],
        g: vec![0.0; len],
    };
    let decay_rate = -a_log.exp();
    for t in 0..len {
        let row = &qkv[(start + t) * conv_dim..(start + t + 1) * conv_dim];
        l2norm_into(
            &row[kh * dk..(kh + 1) * dk],
            &mut x.q[t * dk..(t + 1) * dk],
            scale,
        );
        l2norm_into(
            &row[kd + kh * dk..kd + (kh + 1) * dk],
            &mut x.k[t * dk..(t + 1) * dk],
            1.0,
        );
        x.v[t * dv..(t + 1) * dv].copy_from_slice(&row[2 * kd + h * dv..2 * kd + (h + 1) * dv]);
        x.beta[t] = sigmoid(b[(start + t) * nv + h]);
        x.g[t] = decay_rate * softplus(a[(start + t) * nv + h] + dt_bias);
    }
    x
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 * y as f64)
        .sum::<f64>() as f32
}

/// The recurrent step over `x`'s tokens one at a time; `s`: `[dk, dv]`, `out`: `[len, dv]`.
fn recurrent(x: &HeadInputs, s: &mut [f32], dk: usize, dv: usize, out: &mut [f32]) {
    let len = x.g.len();
    let mut kv = vec![0.0f64; dv];
    for t in 0..len {
        let (q, k, v) = (
            &x.q[t * dk..(t + 1) * dk],
            &x.k[t * dk..(t + 1) * dk],
            &x.v[t * dv..(t + 1) * dv],
        );
        let decay = x.g[t].exp();
        s.iter_mut().for_each(|e| *e *= decay);
        kv.fill(0.0);
        for i in 0..dk {
            let ki = k[i] as f64;
            for (acc, &e) in kv.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *acc += e as f64 * ki;
            }
        }
        let delta: Vec<f32> = (0..dv).map(|j| x.beta[t] * (v[j] - kv[j] as f32)).collect();
        for i in 0..dk {
            let ki = k[i];
            for (e, &d) in s[i * dv..(i + 1) * dv].iter_mut().zip(&delta) {
                *e += ki * d;
            }
        }
        let o = &mut out[t * dv..(t + 1) * dv];
        let mut acc = vec![0.0f64; dv];
        for i in 0..dk {
            let qi = q[i] as f64;
            for (a, &e) in acc.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *a += e as f64 * qi;
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
}

/// The chunked form (module docs) over `x`'s tokens in chunks of [`CHUNK`], continuing from `s`.
fn chunked(x: &HeadInputs, s: &mut [f32], dk: usize, dv: usize, out: &mut [f32]) {
    let len = x.g.len();
    let mut c0 = 0;
    while c0 < len {
        let l = CHUNK.min(len - c0);
        let (q, k, v) = (
            &x.q[c0 * dk..(c0 + l) * dk],
            &x.k[c0 * dk..(c0 + l) * dk],
            &x.v[c0 * dv..(c0 + l) * dv],
        );
        let beta = &x.beta[c0..c0 + l];
        let mut gc = vec![0.0f32; l];
        let mut acc = 0.0f32;
        for i in 0..l {
            acc += x.g[c0 + i];
            gc[i] = acc;
        }
        // A (strictly lower) and the forward substitution for U and W.
        let mut u = vec![0.0f32; l * dv];
        let mut w = vec![0.0f32; l * dk];
        for i in 0..l {
            let ki = &k[i * dk..(i + 1) * dk];
            let mut ui: Vec<f64> = v[i * dv..(i + 1) * dv]
                .iter()
                .map(|&e| (e * beta[i]) as f64)
                .collect();
            let egi = gc[i].exp();
            let mut wi: Vec<f64> = ki.iter().map(|&e| (e * beta[i] * egi) as f64).collect();
            for j in 0..i {
                let aij =
                    (beta[i] * dot(ki, &k[j * dk..(j + 1) * dk]) * (gc[i] - gc[j]).exp()) as f64;
                for (x, &y) in ui.iter_mut().zip(&u[j * dv..(j + 1) * dv]) {
                    *x -= aij * y as f64;
                }
                for (x, &y) in wi.iter_mut().zip(&w[j * dk..(j + 1) * dk]) {
                    *x -= aij * y as f64;
                }
            }
            for (d, s) in u[i * dv..(i + 1) * dv].iter_mut().zip(ui) {
                *d = s as f32;
            }
            for (d, s) in w[i * dk..(i + 1) * dk].iter_mut().zip(wi) {
                *d = s as f32;
            }
        }
        // Vn = U − W S.
        let mut vn = u;
        for i in 0..l {
            let wi = &w[i * dk..(i + 1) * dk];
            let mut acc = vec![0.0f64; dv];
            for (r, &wr) in wi.iter().enumerate() {
                for (a, &e) in acc.iter_mut().zip(&s[r * dv..(r + 1) * dv]) {
                    *a += wr as f64 * e as f64;
                }
            }
            for (x, a) in vn[i * dv..(i + 1) * dv].iter_mut().zip(acc) {
                *x -= a as f32;
            }
        }
        // O = (Q ⊙ exp(gc)) S + ((Q Kᵀ) ∘ Γ) Vn, diagonal included.
        for i in 0..l {
            let qi = &q[i * dk..(i + 1) * dk];
            let egi = gc[i].exp() as f64;
            let mut acc = vec![0.0f64; dv];
            for (r, &qr) in qi.iter().enumerate() {
                let f = qr as f64 * egi;
                for (a, &e) in acc.iter_mut().zip(&s[r * dv..(r + 1) * dv]) {
                    *a += f * e as f64;
                }
            }
            for j in 0..=i {
                let f = (dot(qi, &k[j * dk..(j + 1) * dk]) * (gc[i] - gc[j]).exp()) as f64;
                for (a, &e) in acc.iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *a += f * e as f64;
                }
            }
            for (o, a) in out[(c0 + i) * dv..(c0 + i + 1) * dv].iter_mut().zip(acc) {
                *o = a as f32;
            }
        }
        // S' = exp(gc_last) S + Σ_j exp(gc_last − gc_j) k_j ⊗ Vn_j.
        let last = gc[l - 1];
        let el = last.exp();
        s.iter_mut().for_each(|e| *e *= el);
        for j in 0..l {
            let f = (last - gc[j]).exp();
            let kj = &k[j * dk..(j + 1) * dk];
            let vj = &vn[j * dv..(j + 1) * dv];
            for (r, &kr) in kj.iter().enumerate() {
                let fk = f * kr;
                for (e, &y) in s[r * dv..(r + 1) * dv].iter_mut().zip(vj) {
                    *e += fk * y;
                }
            }
        }
        c0 += l;
    }
}

/// Which form [`recurrence`] uses for a sequence's new tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// One token: the recurrent step; several: chunks of [`CHUNK`] (what the backend runs).
    Auto,
    /// Always token by token (the oracle of the chunked form in tests).
    Recurrent,
}

/// The gated delta rule of `layer` (see `HybridBackend::gdn_recurrence`). `qkv`: `[tokens,
/// conv_dim]`; `a`, `b`: `[tokens, value_heads]`; `out`: `[tokens, value_heads, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn recurrence(
    cache: &mut CpuStateCache,
    layer: usize,
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    step: &StepInput,
    p: &GdnParams,
    out: &mut [f32],
    form: Form,
) {
    let (nv, dk, dv) = (p.num_value_heads, p.key_head_dim, p.value_head_dim);
    let per_head = dk * dv;
    let seqs = seq_ranges(step);
    // Each (sequence, head) pair owns its state block; outputs are gathered after.
    let mut work: Vec<(usize, usize, usize, &mut [f32])> = Vec::new();
    {
        let n = cache.spec.num_layers * cache.spec.recurrent_elems();
        let layer_off = layer * cache.spec.recurrent_elems();
        let mut slots: Vec<(usize, &mut [f32])> = cache
            .recurrent
            .chunks_mut(n)
            .enumerate()
            .filter(|(slot, _)| seqs.iter().any(|s| s.2 == *slot))
            .map(|(slot, chunk)| (slot, &mut chunk[layer_off..layer_off + nv * per_head]))
            .collect();
        for (start, len, slot, fresh) in &seqs {
            let (_, state) = slots
                .iter_mut()
                .find(|(s, _)| s == slot)
                .expect("each sequence's slot was collected");
            let state = std::mem::take(state);
            if *fresh {
                state.fill(0.0);
            }
            for (h, sh) in state.chunks_mut(per_head).enumerate() {
                work.push((*start, *len, h, sh));
            }
        }
    }
    let results: Vec<(usize, usize, usize, Vec<f32>)> = work
        .into_par_iter()
        .map(|(start, len, h, s)| {
            let x = head_inputs(qkv, a, b, a_log[h], dt_bias[h], p, h, start, len);
            let mut o = vec![0.0f32; len * dv];
            if len == 1 || form == Form::Recurrent {
                recurrent(&x, s, dk, dv, &mut o);
            } else {
                chunked(&x, s, dk, dv, &mut o);
            }
            (start, len, h, o)
        })
        .collect();
    for (start, len, h, o) in results {
        for t in 0..len {
            let dst = ((start + t) * nv + h) * dv;
            out[dst..dst + dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
}

/// Gated RMSNorm rows of `dim`: `out = x/rms(x) · weight · silu(z)`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StepSeq;

    fn params() -> GdnParams {
        GdnParams {
            num_key_heads: 2,
            num_value_heads: 4,
            key_head_dim: 8,
            value_head_dim: 6,
        }
    }

    fn spec(slots: usize) -> StateSpec {
        let p = params();
        StateSpec {
            num_slots: slots,
            num_layers: 1,
            conv_dim: p.conv_dim(),
            conv_kernel: 4,
            num_value_heads: p.num_value_heads,
            key_head_dim: p.key_head_dim,
            value_head_dim: p.value_head_dim,
        }
    }

    /// Deterministic pseudo-random values in (-1, 1).
    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn step(seqs: &[(usize, usize, usize, u32)]) -> StepInput {
        let n: usize = seqs.iter().map(|s| s.1).sum();
        StepInput {
            token_ids: vec![0; n],
            positions: vec![0; n],
            slot_mapping: vec![0; n],
            seqs: seqs
                .iter()
                .map(|&(start, len, cached, slot)| StepSeq {
                    token_start: start,
                    len,
                    cached_len: cached,
                    block_table: vec![],
                    state_slot: Some(slot),
                })
                .collect(),
            logit_rows: vec![],
            block_size: 16,
        }
    }

    struct Inputs {
        qkv: Vec<f32>,
        a: Vec<f32>,
        b: Vec<f32>,
        a_log: Vec<f32>,
        dt: Vec<f32>,
    }

    fn inputs(t: usize) -> Inputs {
        let p = params();
        Inputs {
            qkv: noise(t * p.conv_dim(), 1),
            a: noise(t * p.num_value_heads, 2),
            b: noise(t * p.num_value_heads, 3)
                .iter()
                .map(|x| 3.0 * x)
                .collect(),
            a_log: noise(p.num_value_heads, 4)
                .iter()
                .map(|x| x - 1.0)
                .collect(),
            dt: noise(p.num_value_heads, 5),
        }
    }

    fn run(
        cache: &mut CpuStateCache,
        x: &Inputs,
        st: &StepInput,
        range: std::ops::Range<usize>,
        form: Form,
    ) -> Vec<f32> {
        let p = params();
        let (cd, nv) = (p.conv_dim(), p.num_value_heads);
        let t = range.len();
        let mut out = vec![0.0; t * p.value_dim()];
        recurrence(
            cache,
            0,
            &x.qkv[range.start * cd..range.end * cd],
            &x.a[range.start * nv..range.end * nv],
            &x.b[range.start * nv..range.end * nv],
            &x.a_log,
            &x.dt,
            st,
            &p,
            &mut out,
            form,
        );
        out
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries_and_continuations() {
        let t = 150; // chunks of 64, 64, 22
        let x = inputs(t);
        let mut rec = CpuStateCache::new(spec(1)).unwrap();
        let want = run(&mut rec, &x, &step(&[(0, t, 0, 0)]), 0..t, Form::Recurrent);
        let mut chk = CpuStateCache::new(spec(1)).unwrap();
        let got = run(&mut chk, &x, &step(&[(0, t, 0, 0)]), 0..t, Form::Auto);
        assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
        assert!(max_diff(&chk.recurrent, &rec.recurrent) < 1e-5);
        assert!(
            want.iter().any(|v| v.abs() > 1e-2),
            "outputs are not trivial"
        );
        // The same tokens as a 70-token chunk, a decode, then 79 more: continuation from a state.
        let mut parts = CpuStateCache::new(spec(1)).unwrap();
        let mut got = run(&mut parts, &x, &step(&[(0, 70, 0, 0)]), 0..70, Form::Auto);
        got.extend(run(
            &mut parts,
            &x,
            &step(&[(0, 1, 70, 0)]),
            70..71,
            Form::Auto,
        ));
        got.extend(run(
            &mut parts,
            &x,
            &step(&[(0, 79, 71, 0)]),
            71..t,
            Form::Auto,
        ));
        assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
    }

    #[test]
    fn a_fresh_sequence_ignores_the_old_slot_and_sequences_are_independent() {
        let t = 10;
        let x = inputs(2 * t);
        let mut alone = CpuStateCache::new(spec(1)).unwrap();
        let want1 = run(&mut alone, &x, &step(&[(0, t, 0, 0)]), 0..t, Form::Auto);
        let mut alone2 = CpuStateCache::new(spec(1)).unwrap();
        let want2 = run(
            &mut alone2,
            &x,
            &step(&[(0, t, 0, 0)]),
            t..2 * t,
            Form::Auto,
        );
        // Both in one step, in slots 2 and 0 of a dirty cache.
        let mut both = CpuStateCache::new(spec(3)).unwrap();
        both.recurrent.fill(7.0);
        let got = run(
            &mut both,
            &x,
            &step(&[(0, t, 0, 2), (t, t, 0, 0)]),
            0..2 * t,
            Form::Auto,
        );
        let half = t * params().value_dim();
        assert_eq!(&got[..half], &want1[..]);
        assert_eq!(&got[half..], &want2[..]);
        // Slot 1 was not touched.
        assert!(both.slot_layer(1, 0).1.iter().all(|&v| v == 7.0));
    }

    #[test]
    fn conv_continues_from_its_state() {
        let sp = StateSpec {
            conv_dim: 3,
            ..spec(1)
        };
        let w: Vec<f32> = noise(3 * 4, 9);
        let mixed = noise(7 * 3, 10);
        let mut whole = CpuStateCache::new(sp).unwrap();
        let mut want = vec![0.0; 7 * 3];
        conv1d(&mut whole, 0, &mixed, &w, &step(&[(0, 7, 0, 0)]), &mut want);
        // By hand at t = 1, channel 2: taps 2 and 3 see x[0] and x[1].
        let pre = w[2 * 4 + 2] * mixed[2] + w[2 * 4 + 3] * mixed[3 + 2];
        assert!((want[3 + 2] - pre / (1.0 + (-pre).exp())).abs() < 1e-6);
        let mut parts = CpuStateCache::new(sp).unwrap();
        let mut got = vec![0.0; 7 * 3];
        for (s, e, cached) in [(0, 2, 0), (2, 3, 2), (3, 7, 3)] {
            let mut o = vec![0.0; (e - s) * 3];
            conv1d(
                &mut parts,
                0,
                &mixed[s * 3..e * 3],
                &w,
                &step(&[(0, e - s, cached, 0)]),
                &mut o,
            );
            got[s * 3..e * 3].copy_from_slice(&o);
        }
        assert!(max_diff(&got, &want) < 1e-6);
        assert_eq!(parts.conv, whole.conv);
        assert_eq!(&whole.conv[..], &mixed[4 * 3..7 * 3]);
    }

    #[test]
    fn gated_norm_split_and_gate() {
        let x = [3.0, 4.0];
        let z = [0.0, 100.0];
        let mut out = [0.0; 2];
        gated_rms_norm(&x, &z, &[1.0, 2.0], &mut out, 2, 0.0);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 0.0).abs() < 1e-6);
        assert!((out[1] - 2.0 * 4.0 / rms * 100.0).abs() < 1e-3);
        let qg = [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
        let (mut q, mut g) = ([0.0; 4], [0.0; 4]);
        split_query_gate(&qg, &mut q, &mut g, 2);
        assert_eq!(q, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(g, [10.0, 20.0, 30.0, 40.0]);
        let mut y = [2.0, 2.0];
        sigmoid_mul(&mut y, &[0.0, 1000.0]);
        assert_eq!(y, [1.0, 2.0]);
    }
}
