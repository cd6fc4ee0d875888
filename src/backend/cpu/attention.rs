//! The paged KV cache on the CPU and attention over it.
//!
//! Layout: per layer, K and V are each `[num_blocks * block_size, num_kv_heads, head_dim]` f32,
//! i.e. token slot `s = block * block_size + offset` holds all KV heads of one token
//! contiguously. A sequence's position `p` lives in slot
//! `block_table[p / block_size] * block_size + p % block_size`.
//!
//! Attention is computed per (new token, query head) pair, in parallel: scores `q·k · scale`
//! over the sequence's positions `0..=p`, a softmax in f32 (max-subtracted), then the weighted
//! sum of v. Query head `h` reads KV head `h / (num_heads / num_kv_heads)` (GQA).

use rayon::prelude::*;

use crate::backend::{AttentionParams, KvCacheDType, KvCacheSpec, StepInput};

/// K and V of every layer, f32 (rounded through fp8 on write for an fp8 `storage`).
#[derive(Debug)]
pub struct CpuKvCache {
    /// Geometry.
    pub spec: KvCacheSpec,
    /// Encoding every written value is rounded through (see [`KvCacheDType`]).
    pub storage: KvCacheDType,
    /// Per layer: `[num_blocks * block_size, num_kv_heads, head_dim]`.
    pub k: Vec<Vec<f32>>,
    /// Per layer, as `k`.
    pub v: Vec<Vec<f32>>,
}

impl CpuKvCache {
    /// A zeroed cache (the pages are only touched when written).
    pub fn new(spec: KvCacheSpec, storage: KvCacheDType) -> CpuKvCache {
        let len = spec.num_blocks * spec.block_size * spec.slot_elems();
        CpuKvCache {
            spec,
            storage,
            k: (0..spec.num_layers).map(|_| vec![0.0; len]).collect(),
            v: (0..spec.num_layers).map(|_| vec![0.0; len]).collect(),
        }
    }

    /// Store the new tokens' k and v (`[num_tokens, num_kv_heads, head_dim]`) in their slots.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], slot_mapping: &[u32]) {
        let w = self.spec.slot_elems();
        for (t, &slot) in slot_mapping.iter().enumerate() {
            let dst = slot as usize * w;
            let (ks, vs) = (&k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w]);
            self.k[layer][dst..dst + w].copy_from_slice(ks);
            self.v[layer][dst..dst + w].copy_from_slice(vs);
            if self.storage != KvCacheDType::Same {
                for x in self.k[layer][dst..dst + w]
                    .iter_mut()
                    .chain(&mut self.v[layer][dst..dst + w])
                {
                    *x = self.storage.round(*x);
                }
            }
        }
    }

    /// Copy block `src` to block `dst` in every layer.
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        let n = self.spec.block_size * self.spec.slot_elems();
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.copy_within(src * n..(src + 1) * n, dst * n);
        }
    }
}

/// Causal paged attention for every new token of `step`; `q`, `out`:
/// `[num_tokens, num_heads, head_dim]`.
pub fn paged_attention(
    cache: &CpuKvCache,
    layer: usize,
    step: &StepInput,
    p: &AttentionParams,
    q: &[f32],
    out: &mut [f32],
) {
    let (hd, nh, nkv) = (p.head_dim, p.num_heads, p.num_kv_heads);
    let group = nh / nkv;
    let bs = step.block_size;
    let slot_w = nkv * hd;
    let (kc, vc) = (&cache.k[layer], &cache.v[layer]);
    // Owner sequence of each new token.
    let mut owner = vec![0usize; step.num_tokens()];
    for (i, s) in step.seqs.iter().enumerate() {
        owner[s.token_start..s.token_start + s.len].fill(i);
    }
    out.par_chunks_mut(hd).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (idx, o)| {
            let (tok, h) = (idx / nh, idx % nh);
            let seq = &step.seqs[owner[tok]];
            let pos = step.positions[tok] as usize;
            let qh = &q[idx * hd..(idx + 1) * hd];
            let kv_off = (h / group) * hd;
            let slot =
                |p: usize| (seq.block_table[p / bs] as usize * bs + p % bs) * slot_w + kv_off;
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for p_ in 0..=pos {
                let k = &kc[slot(p_)..slot(p_) + hd];
                let s = dot(qh, k) * p.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (p_, &w) in scores.iter().enumerate() {
                let v = &vc[slot(p_)..slot(p_) + hd];
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += w * v;
                }
            }
            let inv = 1.0 / sum;
            for o in o.iter_mut() {
                *o *= inv;
            }
        },
    );
}

/// f32 dot product with eight partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StepSeq;

    fn spec() -> KvCacheSpec {
        KvCacheSpec {
            num_layers: 2,
            num_blocks: 4,
            block_size: 2,
            num_kv_heads: 1,
            head_dim: 2,
        }
    }

    /// A step of one sequence with `len` new tokens after `cached` ones, blocks `table`.
    fn step(cached: usize, len: usize, table: Vec<u32>) -> StepInput {
        let bs = 2;
        let positions: Vec<u32> = (cached..cached + len).map(|p| p as u32).collect();
        let slot_mapping = positions
            .iter()
            .map(|&p| table[p as usize / bs] * bs as u32 + p % bs as u32)
            .collect();
        StepInput {
            token_ids: vec![0; len],
            positions,
            slot_mapping,
            seqs: vec![StepSeq {
                token_start: 0,
                len,
                cached_len: cached,
                block_table: table,
                state_slot: None,
            }],
            logit_rows: vec![],
            block_size: bs,
        }
    }

    #[test]
    fn write_places_tokens_in_their_slots_and_copy_block_moves_them() {
        let mut c = CpuKvCache::new(spec(), KvCacheDType::Same);
        c.write(1, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], &[6, 1]);
        assert_eq!(c.k[1][12..14], [1.0, 2.0]); // slot 6
        assert_eq!(c.v[1][2..4], [7.0, 8.0]); // slot 1
        assert!(c.k[0].iter().all(|&x| x == 0.0));
        c.copy_block(3, 2); // slots 6, 7 → 4, 5
        assert_eq!(c.k[1][8..10], [1.0, 2.0]);
        assert_eq!(c.v[1][8..10], [5.0, 6.0]);
    }

    #[test]
    fn fp8_storage_rounds_what_is_written() {
        let mut c = CpuKvCache::new(spec(), KvCacheDType::E4M3);
        c.write(0, &[1.07, -1000.0], &[0.3, 2.0], &[2]);
        assert_eq!(c.k[0][4..6], [1.125, -448.0]);
        assert_eq!(c.v[0][4..6], [0.3125, 2.0]);
        let mut c = CpuKvCache::new(spec(), KvCacheDType::E5M2);
        c.write(0, &[1.2, 3.0], &[1.125, 1e6], &[0]);
        assert_eq!(c.k[0][0..2], [1.25, 3.0]);
        assert_eq!(c.v[0][0..2], [1.0, 57344.0]);
    }

    #[test]
    fn first_token_attends_only_to_itself() {
        let mut c = CpuKvCache::new(spec(), KvCacheDType::Same);
        let s = step(0, 1, vec![3]);
        c.write(0, &[1.0, 0.0], &[7.0, -7.0], &s.slot_mapping);
        let p = AttentionParams {
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
        };
        let mut out = vec![0.0; 4];
        paged_attention(&c, 0, &s, &p, &[0.3, 0.1, -2.0, 5.0], &mut out);
        assert_eq!(out, vec![7.0, -7.0, 7.0, -7.0]);
    }

    #[test]
    fn causal_softmax_weights_over_paged_positions() {
        // Keys at positions 0, 1, 2 (blocks [2, 0]): k = [0, 0], [ln 3, 0], [0, 0]; v = 1, 2, 3 on
        // dim 0. Query [1, 0] at position 1 sees scores [0, ln 3] → weights [1/4, 3/4]:
        // out = 0.25·1 + 0.75·2 = 1.75. At position 2: weights [1/5, 3/5, 1/5] → 2.0.
        let mut c = CpuKvCache::new(spec(), KvCacheDType::Same);
        let prefill = step(0, 3, vec![2, 0]);
        let l3 = 3f32.ln();
        c.write(
            0,
            &[0.0, 0.0, l3, 0.0, 0.0, 0.0],
            &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0],
            &prefill.slot_mapping,
        );
        let p = AttentionParams {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
        };
        let mut out = vec![0.0; 6];
        paged_attention(
            &c,
            0,
            &prefill,
            &p,
            &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            &mut out,
        );
        assert_eq!(out[0], 1.0);
        assert!((out[2] - 1.75).abs() < 1e-6, "{}", out[2]);
        assert!((out[4] - 2.0).abs() < 1e-6, "{}", out[4]);
        // The same last token as a decode step after 2 cached tokens gives the same row.
        let decode = step(2, 1, vec![2, 0]);
        let mut out1 = vec![0.0; 2];
        paged_attention(&c, 0, &decode, &p, &[1.0, 0.0], &mut out1);
        assert_eq!(out1, out[4..6]);
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (1..=11).map(|v| v as f32).collect();
        assert_eq!(dot(&a, &a), (1..=11).map(|v| (v * v) as f32).sum::<f32>());
    }
}
