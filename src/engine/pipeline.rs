//! Overlap of the host and the device (`engine.overlap`): the engine thread schedules, builds
//! and submits step N+1 while the device runs step N, then collects step N. The only wait per
//! step is [`crate::model::step::ModelRunner::collect`], the download of N's sampled ids.
//!
//! ```text
//! host:   schedule/build N+1 | submit N+1 | collect N (wait) | append, stop checks of N | schedule N+2 ...
//! device: ......... step N ..................|........ step N+1 ......................|...
//! ```
//!
//! How step N+1 is built before step N's tokens are known:
//! - every sequence step N samples for counts one `pending` token (`Sequence::pending`); the
//!   scheduler sees it as a token to compute, so a decoding sequence gets its next position in
//!   N+1, and the token itself is a [`crate::model::step::Feed`]: the runner copies the id N
//!   sampled into N+1's input on the device (a runner that computed N at submission has it on
//!   the host: the engine resolves it there);
//! - a sequence whose pending token reaches `max_len` is not scheduled again; one that N turns
//!   out to stop (EOS, stop token, stop string), or that fails or is cancelled meanwhile, is
//!   removed when N is collected, and the row N+1 computed for it is discarded at N+1's
//!   collection (the sequence is gone by then);
//! - the blocks and state slot of a sequence removed while a step that names them is in flight
//!   are held back until that step is collected (`Scheduler::step_collected`);
//! - the engine collects N before building N+1 (no overlap for that step) when N+1 could need
//!   a preemption (the free blocks do not cover every running sequence's remaining tokens:
//!   preemption must free blocks at once) or when a sequence of N samples with penalties (its
//!   next descriptor needs N's token).
//!
//! The draws of the samplers' RNGs are taken in token order, one per sampled token, so a
//! request's tokens are the same with and without overlap (given batch-invariant logits: the
//! batches differ, as sequences that just finished still ride along one step and admissions
//! come one step later). Speculative decoding fits the same shape later: a step then samples
//! several tokens per sequence (`pending > 1`, feeds naming a row and an index), and rollback
//! is the same discard.

use std::collections::HashMap;
use std::time::Instant;

use crate::engine::handle::RequestId;
use crate::engine::scheduler::SchedulerOutput;
use crate::model::step::Submitted;

/// A submitted step the engine has not collected yet.
pub(crate) struct InFlight {
    /// The engine's step number (from 1).
    pub(crate) number: u64,
    /// What the scheduler put in it.
    pub(crate) out: SchedulerOutput,
    /// The runner's receipt.
    pub(crate) submitted: Submitted,
    /// Sampling row of each sequence it samples for (the rows the next step's feeds name).
    pub(crate) sample_rows: HashMap<RequestId, usize>,
    /// Sampling rows.
    pub(crate) rows: usize,
    /// Tokens of it fed from the step before.
    pub(crate) fed: usize,
    /// When it was submitted.
    pub(crate) t0: Instant,
}

#[cfg(test)]
mod tests {
    use crate::backend::CpuBackend;
    use crate::engine::request::{
        Completion, FinishReason, GenerateRequest, Prompt, SamplingParams,
    };
    use crate::engine::{spawn, test_support, EngineConfig};
    use crate::model::llama::tests::{tiny_config, tiny_weights};
    use crate::model::llama::Llama;
    use crate::model::step::{Deferred, ModelRunner};
    use crate::model::Architecture;
    use crate::tensor::WeightDType;

    fn runner() -> Llama<CpuBackend> {
        let c = tiny_config(Architecture::Llama);
        let w = tiny_weights(&c, 3, WeightDType::F32);
        Llama::load(CpuBackend::new(1).expect("cpu"), &c, &w, 4, 64).expect("loads")
    }

    fn requests() -> Vec<GenerateRequest> {
        (0..7u32)
            .map(|i| GenerateRequest {
                prompt: Prompt::TokenIds((0..3 + 2 * i).map(|t| (t * 7 + i) % 40).collect()),
                sampling: SamplingParams {
                    max_tokens: Some(4 + 3 * (i % 3)),
                    temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                    seed: Some(u64::from(i)),
                    // Some requests stop early on a token the model often picks.
                    stop_token_ids: if i % 3 == 1 { vec![5, 17, 30] } else { vec![] },
                    ignore_eos: true,
                    ..SamplingParams::default()
                },
                deadline: None,
            })
            .collect()
    }

    async fn run(runner: Box<dyn ModelRunner>) -> Vec<Completion> {
        let cfg = EngineConfig {
            overlap: true,
            max_num_seqs: 4,
            max_num_batched_tokens: 16,
            block_size: 4,
            ..EngineConfig::default()
        };
        let h = spawn(runner, test_support::byte_tokenizer(), cfg, "tiny").expect("starts");
        let pending: Vec<_> = requests().into_iter().map(|r| h.submit(r)).collect();
        let mut out = Vec::new();
        for p in pending {
            out.push(p.await.expect("completion"));
        }
        out
    }

    #[tokio::test]
    async fn the_cpu_runner_behind_a_queue_gives_the_same_tokens() {
        // The CPU runner computes at submission (no overlap); behind `Deferred` it computes each
        // step only at its collection, after the engine built and submitted the next one.
        let plain = run(Box::new(runner())).await;
        let queued = run(Box::new(Deferred::new(runner()))).await;
        let key = |c: &Completion| (c.token_ids.clone(), c.finish_reason);
        assert_eq!(
            plain.iter().map(key).collect::<Vec<_>>(),
            queued.iter().map(key).collect::<Vec<_>>()
        );
        assert!(plain.iter().any(|c| c.finish_reason == FinishReason::Stop));
        assert!(plain
            .iter()
            .any(|c| c.finish_reason == FinishReason::Length));
    }
}
