//! Forward batches for driving a runner on synthetic inputs (benchmarks and tests): `n`
//! sequences, sequence `i` in state slot `i` with its own range of KV blocks, advanced step by
//! step. Token ids are drawn from a seeded stream unless the caller feeds sampled ones back.

use crate::model::step::{CacheGeometry, ForwardBatch, LogitsFor, SeqSlice};

/// `n` sequences of at most `max_len` tokens each, laid out in a runner's cache.
#[derive(Debug, Clone)]
pub struct SyntheticBatch {
    block_size: usize,
    blocks_per_seq: usize,
    vocab: u32,
    /// Tokens already in the cache, per sequence.
    cached: Vec<usize>,
    rng: u64,
}

/// Why a batch does not fit the runner's cache.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{seqs} sequences of {max_len} tokens need {need} KV blocks and {seqs} state slots; the runner has {blocks} blocks and {slots} slots (not retryable: size the cache larger)")]
pub struct BatchTooLarge {
    seqs: usize,
    max_len: usize,
    need: usize,
    blocks: usize,
    slots: usize,
}

impl SyntheticBatch {
    /// `n` empty sequences of up to `max_len` tokens over `geometry` (hybrid models need
    /// `n` state slots), token ids below `vocab`, drawn from `seed`.
    pub fn new(
        n: usize,
        max_len: usize,
        geometry: CacheGeometry,
        vocab: usize,
        seed: u64,
    ) -> Result<SyntheticBatch, BatchTooLarge> {
        let blocks_per_seq = max_len.div_ceil(geometry.block_size.max(1));
        let need = n * blocks_per_seq;
        let hybrid = geometry.num_state_slots > 0;
        if need > geometry.num_blocks || (hybrid && n > geometry.num_state_slots) {
            return Err(BatchTooLarge {
                seqs: n,
                max_len,
                need,
                blocks: geometry.num_blocks,
                slots: geometry.num_state_slots,
            });
        }
        Ok(SyntheticBatch {
            block_size: geometry.block_size,
            blocks_per_seq,
            vocab: vocab as u32,
            cached: vec![0; n],
            rng: (seed ^ 0x9E37_79B9_7F4A_7C15) | 1,
        })
    }

    fn next_token(&mut self) -> u32 {
        // xorshift64*, nonzero state.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        ((self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % u64::from(self.vocab)) as u32
    }

    /// The next step: `len` new tokens for every sequence (random ids, or `tokens[i]` for
    /// sequence `i` when given with `len == 1`), each asking `logits`. Advances the sequences.
    pub fn step(&mut self, len: usize, logits: LogitsFor, tokens: Option<&[u32]>) -> ForwardBatch {
        let mut batch = ForwardBatch::default();
        for i in 0..self.cached.len() {
            let start = batch.token_ids.len();
            for _ in 0..len {
                let t = match tokens {
                    Some(t) if len == 1 => t[i] % self.vocab,
                    _ => self.next_token(),
                };
                batch.token_ids.push(t);
            }
            let cached_len = self.cached[i];
            let used = (cached_len + len).div_ceil(self.block_size);
            let first = (i * self.blocks_per_seq) as u32;
            batch.seqs.push(SeqSlice {
                start,
                len,
                cached_len,
                block_table: (first..first + used as u32).collect(),
                logits: logits.clone(),
                state_slot: Some(i as u32),
            });
            self.cached[i] += len;
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(blocks: usize, slots: usize) -> CacheGeometry {
        CacheGeometry {
            block_size: 16,
            num_blocks: blocks,
            num_state_slots: slots,
        }
    }

    #[test]
    fn sequences_get_their_own_blocks_and_slots_and_advance() {
        let mut b = SyntheticBatch::new(3, 40, geometry(9, 3), 50, 1).unwrap();
        let p = b.step(20, LogitsFor::Last, None);
        assert_eq!(p.token_ids.len(), 60);
        assert!(p.token_ids.iter().all(|&t| t < 50));
        for (i, s) in p.seqs.iter().enumerate() {
            assert_eq!((s.start, s.len, s.cached_len), (20 * i, 20, 0));
            let first = 3 * i as u32;
            assert_eq!(s.block_table, vec![first, first + 1]);
            assert_eq!(s.state_slot, Some(i as u32));
        }
        let d = b.step(1, LogitsFor::Last, Some(&[7, 8, 60]));
        assert_eq!(d.token_ids, vec![7, 8, 10]);
        assert_eq!(d.seqs[2].cached_len, 20);
        assert_eq!(d.seqs[2].block_table, vec![6, 7]);
    }

    #[test]
    fn a_batch_larger_than_the_cache_is_refused() {
        assert!(SyntheticBatch::new(3, 40, geometry(8, 3), 50, 1).is_err());
        assert!(SyntheticBatch::new(3, 40, geometry(9, 2), 50, 1).is_err());
        // Attention-only models have no state slots.
        assert!(SyntheticBatch::new(3, 40, geometry(9, 0), 50, 1).is_ok());
    }
}
