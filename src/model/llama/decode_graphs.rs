//! Decode graphs: a decode-only step (every sequence adds one token and wants its one logits
//! row) runs as the replay of a graph recorded once per batch bucket, so the host queues one
//! launch instead of ~275 kernels.
//!
//! Buckets are 1, 2, 4, 8, … below `max_num_seqs`, and `max_num_seqs` itself. A step of `n`
//! sequences runs padded to the smallest bucket `≥ n`; what a graph sees is fixed per bucket:
//! - the number of tokens, sequences and logits rows (= the bucket);
//! - the block-table width, `ceil(max_model_len / block_size)` for every row (tables are padded
//!   with block 0, never read past a sequence's context);
//! - the split-K attention part count, sized for the step's context class ([`PinnedShape`]):
//!   [`SHORT_CONTEXT`] keys when every sequence's context is at most that (and `max_model_len`
//!   is longer), else `max_model_len`; parts past a sequence's context are empty and leave the
//!   result bit for bit as the eager split. The short class exists because a split sized for
//!   `max_model_len` costs short rows launches that do nothing: on CUDA its empty parts' blocks
//!   and the merge launch after the attention kernel (every layer), where a context of at most
//!   `SHORT_CONTEXT` keys is one part (`DECODE_SINGLE_PART_KEYS`) and needs neither;
//! - every pointer: the runner's workspace, this bucket's own step metadata (refilled in place
//!   from pinned staging before each replay) and its own split-K partials.
//!
//! Padding rows are harmless: token 0 at position 0 of a scratch KV block that no sequence owns
//! (the cache's last block, hidden from the engine), so they write only there and read only it;
//! their logits rows come after the batch's and are never sampled or downloaded. A hybrid
//! model's padding rows have no state slot: the GDN kernels give them a zero state and write no
//! state ([`DecodeGraphs::run_with`] is how `qwen3_5` uses these graphs).
//!
//! At a bucket's first use the step runs eagerly with the pinned shapes (its real result, and
//! every lazily sized buffer at its size), then the same ops are recorded into the bucket's
//! graph; later steps of that bucket refill the metadata and replay. If recording fails the
//! runner logs it and stays eager for good. Sampling stays outside the graph (its parameters
//! change per step and it reads back the ids). Mixed and prefill steps are always eager.

use tracing::{info, warn};

use crate::backend::{Backend, PinnedShape, StepGraph, StepInput, StepSeq};
use crate::error::EngineError;
use crate::model::step::CacheGeometry;

/// Tokens fed from the previous step's pending samples: `(token, sampling row)` pairs.
pub(crate) type Fed<'a, B> = (&'a <B as Backend>::PendingSamples, &'a [(u32, u32)]);

/// Contexts (keys, the new token's included) up to this run on graphs pinned to it when
/// `max_model_len` is longer (the short context class, see the module header): the single-part
/// bound of the CUDA decode attention (`attention_plan::DECODE_SINGLE_PART_KEYS`, checked equal
/// by a unit test below). `KILN_GRAPH_SHORT_CONTEXT=0` (read when the graphs are
/// made) keeps one class, `max_model_len` (the graphs before it, to measure the difference).
pub const SHORT_CONTEXT: usize = 256;

/// A bucket a step fits: the index of its graph (one per batch bucket and context class), its
/// size and the context its shapes are pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub index: usize,
    pub size: usize,
    pub context: usize,
}

/// One bucket's recorded graph and the step metadata it reads.
struct Recorded<B: Backend> {
    step: B::Step,
    graph: Box<dyn StepGraph>,
}

/// The decode graphs of one runner (see the module header).
pub(crate) struct DecodeGraphs<B: Backend> {
    /// Bucket sizes, ascending.
    buckets: Vec<usize>,
    /// Block-table width of every row of a graph step.
    width: usize,
    /// Context the graphs are shaped for (`max_model_len`).
    max_context: usize,
    /// Context classes, ascending, the last `max_model_len`: the graph of batch bucket `b` and
    /// class `c` is `recorded[c * buckets.len() + b]`.
    contexts: Vec<usize>,
    block_size: usize,
    /// KV block the padding rows write and read.
    scratch_block: u32,
    /// Per (context class, bucket), once recorded.
    recorded: Vec<Option<Recorded<B>>>,
    /// Recording failed once: every step is eager from then on.
    disabled: bool,
    /// Steps replayed from a graph, and steps run padded at a bucket's first use.
    replays: u64,
    recordings: u64,
}

/// What a runner's decode graphs have done ([`super::Llama::graph_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphStats {
    /// Buckets with a recorded graph now.
    pub recorded: usize,
    /// Steps replayed from a graph.
    pub replays: u64,
    /// Steps that recorded a graph (run eagerly, padded, at a bucket's first use).
    pub recordings: u64,
    /// Recording failed: decode stays eager.
    pub disabled: bool,
    /// Device bytes the recorded graphs took (measured at instantiation).
    pub device_bytes: usize,
}

/// The context classes for `max_model_len`: [`SHORT_CONTEXT`] below it when `short` (and it is
/// shorter), then `max_model_len`.
pub(crate) fn context_classes(max_model_len: usize, short: bool) -> Vec<usize> {
    if short && SHORT_CONTEXT < max_model_len {
        vec![SHORT_CONTEXT, max_model_len]
    } else {
        vec![max_model_len]
    }
}

/// 1, 2, 4, … below `max_num_seqs`, then `max_num_seqs`.
pub(super) fn bucket_sizes(max_num_seqs: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |&b| Some(b * 2))
        .take_while(|&b| b < max_num_seqs)
        .collect();
    v.push(max_num_seqs.max(1));
    v
}

impl<B: Backend> DecodeGraphs<B> {
    /// The graphs a runner's `with_decode_graphs` turns on over `geometry` (its KV cache) for
    /// `max_num_seqs` sequences of up to `max_model_len` tokens (0: the model's `max_position`),
    /// shared by the llama and Qwen3.5 runners. The last KV block becomes the padding rows'
    /// scratch block: `geometry` loses it. `None`, `geometry` untouched: a backend without
    /// graphs ([`Backend::supports_graphs`]), a cache of one block or no sequences.
    pub(crate) fn for_runner(
        backend: &B,
        geometry: &mut CacheGeometry,
        max_position: usize,
        max_num_seqs: usize,
        max_model_len: usize,
    ) -> Option<DecodeGraphs<B>> {
        if !backend.supports_graphs() || geometry.num_blocks < 2 || max_num_seqs == 0 {
            return None;
        }
        let max_model_len = match max_model_len {
            0 => max_position,
            n => n.min(max_position),
        };
        geometry.num_blocks -= 1;
        Some(DecodeGraphs::new(
            max_num_seqs,
            max_model_len,
            geometry.block_size,
            geometry.num_blocks as u32,
        ))
    }

    pub(crate) fn new(
        max_num_seqs: usize,
        max_model_len: usize,
        block_size: usize,
        scratch_block: u32,
    ) -> DecodeGraphs<B> {
        let buckets = bucket_sizes(max_num_seqs);
        let width = max_model_len.div_ceil(block_size.max(1)).max(1);
        let short = !std::env::var("KILN_GRAPH_SHORT_CONTEXT").is_ok_and(|v| v.trim() == "0");
        let contexts = context_classes(max_model_len, short);
        info!(
            buckets = ?buckets,
            contexts = ?contexts,
            block_table_width = width,
            max_model_len,
            "CUDA graphs on for decode steps (recorded per bucket and context class at first use)."
        );
        DecodeGraphs {
            recorded: (0..buckets.len() * contexts.len()).map(|_| None).collect(),
            buckets,
            width,
            max_context: max_model_len,
            contexts,
            block_size,
            scratch_block,
            disabled: false,
            replays: 0,
            recordings: 0,
        }
    }

    pub(crate) fn stats(&self) -> GraphStats {
        let live = self.recorded.iter().flatten();
        GraphStats {
            recorded: live.clone().count(),
            replays: self.replays,
            recordings: self.recordings,
            disabled: self.disabled,
            device_bytes: live.map(|r| r.graph.device_bytes()).sum(),
        }
    }

    /// Forget every graph (the workspace they recorded was remade).
    pub(crate) fn clear(&mut self) {
        for r in &mut self.recorded {
            *r = None;
        }
    }

    /// The bucket of a decode-only step that fits the graphs' shapes, or `None` (eager): every
    /// sequence adds one token and wants one logits row (in order), no more sequences than the
    /// largest bucket, tables no wider and contexts no longer than the graphs are shaped for.
    pub(crate) fn bucket_for(&self, input: &StepInput) -> Option<Bucket> {
        if self.disabled {
            return None;
        }
        let n = input.seqs.len();
        let decode_only = n > 0
            && input.num_tokens() == n
            && input.logit_rows.len() == n
            && input
                .logit_rows
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i)
            && input.seqs.iter().enumerate().all(|(i, s)| {
                s.len == 1
                    && s.token_start == i
                    && s.block_table.len() <= self.width
                    && s.context_len() <= self.max_context
            });
        if !decode_only {
            return None;
        }
        let index = self.buckets.iter().position(|&b| b >= n)?;
        let longest = input.seqs.iter().map(|s| s.context_len()).max()?;
        let class = self.contexts.iter().position(|&c| c >= longest)?;
        Some(Bucket {
            index: class * self.buckets.len() + index,
            size: self.buckets[index],
            context: self.contexts[class],
        })
    }

    /// `input` padded to `size` sequences with full-width block tables (see the module header).
    fn pad(&self, input: &StepInput, size: usize) -> StepInput {
        let mut p = input.clone();
        for s in &mut p.seqs {
            s.block_table.resize(self.width, 0);
        }
        let mut scratch_table = vec![0u32; self.width];
        scratch_table[0] = self.scratch_block;
        let scratch_slot = self.scratch_block * self.block_size as u32;
        for t in input.num_tokens()..size {
            p.token_ids.push(0);
            p.positions.push(0);
            p.slot_mapping.push(scratch_slot);
            p.logit_rows.push(t as u32);
            p.seqs.push(StepSeq {
                token_start: t,
                len: 1,
                cached_len: 0,
                block_table: scratch_table.clone(),
                state_slot: None,
            });
        }
        p
    }

    /// Run `input` (which [`DecodeGraphs::bucket_for`] put in `bucket`) padded to the bucket:
    /// replay its graph, or run it eagerly and record the graph at the bucket's first use.
    /// `queue(step)` queues the model's whole step (`bucket.size` tokens and logits rows) over
    /// `step`'s metadata, allocating nothing and never waiting for the device; it is called once
    /// eagerly and once under capture at the bucket's first use, and not at all when the
    /// bucket's graph is replayed.
    pub(crate) fn run_with(
        &mut self,
        bucket: Bucket,
        b: &B,
        input: &StepInput,
        feeds: Option<Fed<'_, B>>,
        mut queue: impl FnMut(&B::Step) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let padded = self.pad(input, bucket.size);
        let shape = PinnedShape {
            max_context: bucket.context,
        };
        if let Some(r) = &mut self.recorded[bucket.index] {
            b.update_step_pinned(&mut r.step, &padded, &shape)?;
            // Fed tokens (overlap) are written into the metadata before the replay reads it.
            if let Some((p, f)) = feeds {
                b.feed_tokens(&mut r.step, p, f)?;
            }
            r.graph.replay()?;
            self.replays += 1;
            return Ok(());
        }
        let mut step = b.prepare_step(&padded)?;
        b.update_step_pinned(&mut step, &padded, &shape)?;
        if let Some((p, f)) = feeds {
            b.feed_tokens(&mut step, p, f)?;
        }
        // This step's result, and every lazily sized buffer at its size before recording.
        let n = bucket.size;
        queue(&step)?;
        b.begin_capture()?;
        let queued = queue(&step);
        let ended = b.end_capture();
        match (queued, ended) {
            (Ok(()), Ok(graph)) => {
                info!(
                    bucket = n,
                    context = bucket.context,
                    nodes = graph.nodes(),
                    graph_mib = graph.device_bytes() as f64 / (1 << 20) as f64,
                    "Decode graph recorded."
                );
                self.recorded[bucket.index] = Some(Recorded { step, graph });
                self.recordings += 1;
            }
            (queued, ended) => {
                let error = match (queued, ended) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => unreachable!("both succeeded above"),
                };
                warn!(
                    bucket = n,
                    %error,
                    "Recording a decode graph failed: decode steps stay eager."
                );
                self.disabled = true;
                self.clear();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;

    #[test]
    fn buckets_double_up_to_max_num_seqs() {
        assert_eq!(bucket_sizes(1), vec![1]);
        assert_eq!(bucket_sizes(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(bucket_sizes(24), vec![1, 2, 4, 8, 16, 24]);
    }

    fn decode_input(tables: &[Vec<u32>], cached: &[usize], block_size: usize) -> StepInput {
        let seqs: Vec<StepSeq> = tables
            .iter()
            .zip(cached)
            .enumerate()
            .map(|(i, (t, &c))| StepSeq {
                token_start: i,
                len: 1,
                cached_len: c,
                block_table: t.clone(),
                state_slot: None,
            })
            .collect();
        let n = seqs.len();
        StepInput {
            token_ids: (0..n as u32).map(|i| i + 3).collect(),
            positions: cached.iter().map(|&c| c as u32).collect(),
            slot_mapping: seqs
                .iter()
                .map(|s| {
                    s.block_table[s.cached_len / block_size] * block_size as u32
                        + (s.cached_len % block_size) as u32
                })
                .collect(),
            seqs,
            logit_rows: (0..n as u32).collect(),
            block_size,
        }
    }

    #[test]
    fn a_decode_step_pads_to_its_bucket_with_scratch_rows() {
        // max_model_len 16, blocks of 4: tables 4 wide; the scratch block is 9.
        let g = DecodeGraphs::<CpuBackend>::new(8, 16, 4, 9);
        let input = decode_input(&[vec![2, 5], vec![7], vec![1, 3, 4]], &[5, 2, 9], 4);
        let bucket = g.bucket_for(&input).unwrap();
        assert_eq!(
            bucket,
            Bucket {
                index: 2,
                size: 4,
                context: 16
            }
        );
        let p = g.pad(&input, bucket.size);
        assert_eq!(p.token_ids, vec![3, 4, 5, 0]);
        assert_eq!(p.positions, vec![5, 2, 9, 0]);
        assert_eq!(p.slot_mapping, vec![5 * 4 + 1, 7 * 4 + 2, 4 * 4 + 1, 9 * 4]);
        assert_eq!(p.logit_rows, vec![0, 1, 2, 3]);
        assert_eq!(p.seqs[0].block_table, vec![2, 5, 0, 0]);
        assert_eq!(p.seqs[3].block_table, vec![9, 0, 0, 0]);
        assert_eq!((p.seqs[3].cached_len, p.seqs[3].len), (0, 1));
        assert!(p.seqs.iter().all(|s| s.block_table.len() == 4));
    }

    #[test]
    fn only_decode_steps_that_fit_the_shapes_take_a_graph() {
        let g = DecodeGraphs::<CpuBackend>::new(4, 16, 4, 9);
        // Five sequences: more than the largest bucket.
        let five = decode_input(&vec![vec![1]; 5], &[0; 5], 4);
        assert_eq!(g.bucket_for(&five), None);
        // A context past max_model_len.
        let long = decode_input(&[vec![1, 2, 3, 4, 5]], &[16], 4);
        assert_eq!(g.bucket_for(&long), None);
        // A prefill chunk (two tokens of one sequence).
        let mut prefill = decode_input(&[vec![1]], &[0], 4);
        prefill.token_ids.push(8);
        prefill.positions.push(1);
        prefill.slot_mapping.push(5);
        prefill.seqs[0].len = 2;
        prefill.logit_rows = vec![1];
        assert_eq!(g.bucket_for(&prefill), None);
        // A sequence that wants no logits.
        let mut quiet = decode_input(&[vec![1], vec![2]], &[0, 0], 4);
        quiet.logit_rows = vec![1];
        assert_eq!(g.bucket_for(&quiet), None);
        let ok = decode_input(&[vec![1], vec![2], vec![3]], &[3, 0, 1], 4);
        assert_eq!(
            g.bucket_for(&ok),
            Some(Bucket {
                index: 2,
                size: 4,
                context: 16
            })
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn the_short_class_is_the_cuda_single_part_bound() {
        assert_eq!(
            SHORT_CONTEXT,
            crate::backend::cuda::attention_plan::DECODE_SINGLE_PART_KEYS
        );
    }

    #[test]
    fn short_contexts_take_the_short_class_graphs() {
        assert_eq!(context_classes(8192, true), vec![SHORT_CONTEXT, 8192]);
        assert_eq!(context_classes(8192, false), vec![8192]);
        assert_eq!(context_classes(SHORT_CONTEXT, true), vec![SHORT_CONTEXT]);
        assert_eq!(context_classes(100, true), vec![100]);
        // max_model_len 1024, blocks of 16: 5 batch buckets (1..16), two context classes.
        let g = DecodeGraphs::<CpuBackend>::new(16, 1024, 16, 99);
        assert_eq!(g.contexts, vec![SHORT_CONTEXT, 1024]);
        assert_eq!(g.recorded.len(), 10);
        let table = |n: usize| (0..n as u32).collect::<Vec<_>>();
        // Contexts 256 and 9 (the new token included): the short class.
        let short = decode_input(&[table(16), table(1)], &[255, 8], 16);
        assert_eq!(
            g.bucket_for(&short),
            Some(Bucket {
                index: 1,
                size: 2,
                context: SHORT_CONTEXT
            })
        );
        // One context of 257 keys: the whole step takes the long class.
        let long = decode_input(&[table(17), table(1)], &[256, 8], 16);
        assert_eq!(
            g.bucket_for(&long),
            Some(Bucket {
                index: 5 + 1,
                size: 2,
                context: 1024
            })
        );
    }
}
