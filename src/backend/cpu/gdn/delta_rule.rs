//! The gated delta rule on the CPU: the recurrent step and the chunked form (see the parent
//! module's docs for the math), per (sequence, value head) pair in parallel.

use rayon::prelude::*;

use super::{seq_ranges, sigmoid, softplus, CpuStateCache, CHUNK, L2_EPS};
use crate::backend::hybrid::GdnParams;
use crate::backend::StepInput;

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
