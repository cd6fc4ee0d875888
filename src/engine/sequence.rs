//! [`Sequence`]: one request inside the engine, from admission to its [`Completion`].
//!
//! A sequence is its token history (`prompt ++ generated`), how much of it is in the KV cache
//! (`num_computed_tokens`, the blocks that hold it), and the output side: sampler, incremental
//! detokenizer, stop strings, the text so far, logprobs and timing marks.
//!
//! Invariants:
//! - `prompt_len ≤ token_ids.len() ≤ max_len ≤ max_model_len`;
//! - `num_tokens() = token_ids.len() + pending`: `pending` tokens are being sampled by submitted
//!   steps the engine has not collected yet (overlap: the next step is built while the device
//!   runs the current one); they are fed to the next step on the device and appended when their
//!   step is collected;
//! - `num_computed_tokens ≤ num_tokens()`, and `blocks` covers at least `num_computed_tokens`;
//! - `block_hashes` is the hash chain over every full block of `token_ids` (kept current by
//!   [`Sequence::append_token`]);
//! - once finished, a sequence is removed from the scheduler and its blocks are freed.

use std::time::{Duration, Instant};

use crate::engine::handle::RequestId;
use crate::engine::kv_cache::{BlockHash, SeqBlocks};
use crate::engine::request::{
    Completion, FinishReason, SamplingParams, Timings, TokenLogprob, TopLogprob, Usage,
};
use crate::engine::sampler::Sampler;
use crate::engine::stop::StopStrings;
use crate::error::EngineError;
use crate::sampling::{sample_row, Sampled, SamplingRow};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// Where a sequence is in the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// Queued for admission (new, or preempted and waiting to be recomputed).
    Waiting,
    /// Holds KV blocks and is prefilled or decoded each step.
    Running,
}

/// Wall-clock marks of a request.
#[derive(Debug, Clone, Copy)]
pub struct SeqTimes {
    /// When the engine received it.
    pub arrival: Instant,
    /// First step that included it.
    pub first_scheduled: Option<Instant>,
    /// When its first token was sampled.
    pub first_token: Option<Instant>,
}

/// One request's state inside the engine.
#[derive(Debug)]
pub struct Sequence {
    /// Handle-assigned id.
    pub id: RequestId,
    /// Scheduler state.
    pub status: SequenceStatus,
    /// Prompt tokens, then generated tokens.
    pub token_ids: Vec<u32>,
    /// Number of prompt tokens at the front of `token_ids`.
    pub prompt_len: usize,
    /// Leading tokens whose K/V are in `blocks` (or queued to be written there by a submitted
    /// step).
    pub num_computed_tokens: usize,
    /// Tokens submitted steps are sampling for this sequence, not yet in `token_ids`.
    pub pending: usize,
    /// The engine's number of the last submitted step that names this sequence's blocks (0:
    /// none); its blocks are not reused before that step is collected.
    pub last_step: u64,
    /// KV blocks held.
    pub blocks: SeqBlocks,
    /// Recurrent-state slot held while running (hybrid models only; see
    /// `kv_cache::StateSlots`).
    pub state_slot: Option<u32>,
    /// Computed-token count at which to checkpoint the recurrent state (hybrid models with
    /// prefix caching: the end of a prefix the cache says is shared); prefill chunks stop there.
    pub checkpoint_at: Option<usize>,
    /// Hash chain over the full blocks of `token_ids`.
    pub block_hashes: Vec<BlockHash>,
    /// Generation ends (`Length`) once `token_ids` reaches this many tokens.
    pub max_len: usize,
    /// Prompt tokens served from the prefix cache at first admission (`None` until admitted).
    pub cached_prompt_tokens: Option<usize>,
    /// Times this sequence was preempted.
    pub num_preemptions: u32,
    /// The request fails with `Timeout` after this.
    pub deadline: Option<Instant>,
    /// Timing marks.
    pub times: SeqTimes,
    sampler: Sampler,
    detok: IncrementalDecoder,
    stop: StopStrings,
    stop_token_ids: Vec<u32>,
    /// Generated text so far (complete characters only, stop string not yet cut).
    text: String,
    logprobs: Option<Vec<TokenLogprob>>,
}

impl Sequence {
    /// A new waiting sequence. `max_len` is the length at which generation stops (prompt +
    /// `max_tokens`, capped by the engine's limits); `eos_token_ids` end generation unless the
    /// request sets `ignore_eos`.
    pub fn new(
        id: RequestId,
        prompt_ids: Vec<u32>,
        params: &SamplingParams,
        eos_token_ids: &[u32],
        max_len: usize,
        block_size: usize,
        deadline: Option<Instant>,
        arrival: Instant,
    ) -> Sequence {
        let mut stop_token_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_token_ids.extend_from_slice(eos_token_ids);
        }
        let mut block_hashes = Vec::new();
        BlockHash::extend_chain(&mut block_hashes, &prompt_ids, block_size);
        Sequence {
            id,
            status: SequenceStatus::Waiting,
            prompt_len: prompt_ids.len(),
            num_computed_tokens: 0,
            pending: 0,
            last_step: 0,
            blocks: SeqBlocks::default(),
            state_slot: None,
            checkpoint_at: None,
            block_hashes,
            max_len,
            cached_prompt_tokens: None,
            num_preemptions: 0,
            deadline,
            times: SeqTimes {
                arrival,
                first_scheduled: None,
                first_token: None,
            },
            sampler: Sampler::new(params, &prompt_ids),
            // Special tokens (the chat template's end-of-turn, EOS) never reach the text.
            detok: IncrementalDecoder::new(true),
            stop: StopStrings::new(&params.stop),
            stop_token_ids,
            text: String::new(),
            logprobs: params.logprobs.map(|_| Vec::new()),
            token_ids: prompt_ids,
        }
    }

    /// Total tokens (prompt + generated, the `pending` ones included).
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len() + self.pending
    }

    /// Whether the next sampling descriptor depends on the tokens generated so far (repetition,
    /// presence or frequency penalties): it cannot be built while a token is pending.
    pub fn sampling_needs_history(&self) -> bool {
        self.sampler.needs_history()
    }

    /// Generated tokens.
    pub fn num_generated(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }

    /// Tokens still to be computed before the next token can be sampled.
    pub fn num_uncomputed(&self) -> usize {
        self.num_tokens() - self.num_computed_tokens
    }

    /// The sampling descriptor of this sequence's next token (draws its uniform for the step
    /// unless greedy); the token comes back through [`Sequence::append_sampled`].
    pub fn next_sampling_row(&mut self) -> SamplingRow {
        self.sampler.next_row()
    }

    /// Sample from this sequence's logits row on the host, append the token and decide whether
    /// generation ends (tests and host-only callers; the engine samples on the backend).
    pub fn sample_and_append(
        &mut self,
        logits: &[f32],
        tokenizer: &Tokenizer,
        block_size: usize,
        now: Instant,
    ) -> Result<Option<FinishReason>, EngineError> {
        let row = self.next_sampling_row();
        let sampled = sample_row(logits, &row)?;
        self.append_sampled(&sampled, tokenizer, block_size, now)
    }

    /// Append the token sampled for the descriptor of [`Sequence::next_sampling_row`] and decide
    /// whether generation ends. Returns the finish reason when it does.
    pub fn append_sampled(
        &mut self,
        sampled: &Sampled,
        tokenizer: &Tokenizer,
        block_size: usize,
        now: Instant,
    ) -> Result<Option<FinishReason>, EngineError> {
        // The token of a submitted step (if it was counted as pending) is known now.
        self.pending = self.pending.saturating_sub(1);
        self.sampler.accept(sampled.token_id);
        self.times.first_token.get_or_insert(now);
        self.record_logprobs(sampled, tokenizer);
        let token = sampled.token_id;
        self.append_token(token, block_size);
        if self.stop_token_ids.contains(&token) {
            // The stop token is in `token_ids` but its text is not returned.
            return Ok(Some(FinishReason::Stop));
        }
        let before = self.text.len();
        let delta = self.detok.push(tokenizer, token);
        self.text.push_str(&delta);
        if let Some(at) = self.stop.find(&self.text, before) {
            self.text.truncate(at);
            return Ok(Some(FinishReason::Stop));
        }
        if self.token_ids.len() >= self.max_len {
            self.text.push_str(&self.detok.flush(tokenizer));
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    /// Append a generated token and extend the block hash chain.
    fn append_token(&mut self, token: u32, block_size: usize) {
        self.token_ids.push(token);
        BlockHash::extend_chain(&mut self.block_hashes, &self.token_ids, block_size);
    }

    fn record_logprobs(&mut self, s: &Sampled, tokenizer: &Tokenizer) {
        if let (Some(list), Some(logprob)) = (self.logprobs.as_mut(), s.logprob) {
            list.push(TokenLogprob {
                token_id: s.token_id,
                token: tokenizer.token_text(s.token_id),
                logprob,
                top: s
                    .top
                    .iter()
                    .map(|&(token_id, logprob)| TopLogprob {
                        token_id,
                        token: tokenizer.token_text(token_id),
                        logprob,
                    })
                    .collect(),
            });
        }
    }

    /// Drop the KV state (preemption): everything will be recomputed from `token_ids`. The
    /// caller frees `blocks` and the state slot (a hybrid model's recurrent state is dropped
    /// with them and recomputed from zero).
    pub fn reset_for_recompute(&mut self) {
        debug_assert!(self.blocks.is_empty(), "blocks must be freed first");
        debug_assert!(
            self.state_slot.is_none(),
            "the state slot must be freed first"
        );
        self.num_computed_tokens = 0;
        self.status = SequenceStatus::Waiting;
        self.num_preemptions += 1;
    }

    /// The finished completion.
    pub fn into_completion(self, finish_reason: FinishReason, now: Instant) -> Completion {
        let arrival = self.times.arrival;
        let first_token = self.times.first_token.unwrap_or(now);
        let completion_tokens = self.num_generated();
        let decode_time = now.saturating_duration_since(first_token);
        let decode_tokens_per_s = if completion_tokens > 1 && decode_time > Duration::ZERO {
            (completion_tokens - 1) as f64 / decode_time.as_secs_f64()
        } else {
            0.0
        };
        Completion {
            text: self.text,
            finish_reason,
            usage: Usage {
                prompt_tokens: self.prompt_len as u32,
                completion_tokens: completion_tokens as u32,
                cached_prompt_tokens: self.cached_prompt_tokens.unwrap_or(0) as u32,
            },
            timings: Timings {
                queue: self
                    .times
                    .first_scheduled
                    .unwrap_or(now)
                    .saturating_duration_since(arrival),
                ttft: first_token.saturating_duration_since(arrival),
                total: now.saturating_duration_since(arrival),
                decode_tokens_per_s,
            },
            logprobs: self.logprobs,
            token_ids: self.token_ids[self.prompt_len..].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::byte_tokenizer;

    fn seq(params: SamplingParams, max_len: usize) -> Sequence {
        let now = Instant::now();
        Sequence::new(1, vec![b'>' as u32], &params, &[256], max_len, 4, None, now)
    }

    /// A logits row over the 257-token byte vocabulary that puts `token` on top.
    fn row_for(token: u32) -> Vec<f32> {
        let mut r = vec![0.0; 257];
        r[token as usize] = 10.0;
        r
    }

    fn feed(s: &mut Sequence, text: &str) -> Option<FinishReason> {
        let t = byte_tokenizer();
        for b in text.bytes() {
            if let Some(f) = s
                .sample_and_append(&row_for(b as u32), &t, 4, Instant::now())
                .expect("ok")
            {
                return Some(f);
            }
        }
        None
    }

    #[test]
    fn stop_string_is_cut_from_the_text_but_tokens_stay() {
        let p = SamplingParams {
            stop: vec!["##".into()],
            ..Default::default()
        };
        let mut s = seq(p, 100);
        assert_eq!(feed(&mut s, "ab#c#"), None);
        assert_eq!(feed(&mut s, "#tail"), Some(FinishReason::Stop));
        let c = s.into_completion(FinishReason::Stop, Instant::now());
        assert_eq!(c.text, "ab#c");
        assert_eq!(
            c.token_ids.len(),
            6,
            "tokens up to and including the completing one"
        );
    }

    #[test]
    fn eos_ends_without_text_unless_ignored() {
        let t = byte_tokenizer();
        let mut s = seq(SamplingParams::default(), 100);
        feed(&mut s, "hi");
        let f = s
            .sample_and_append(&row_for(256), &t, 4, Instant::now())
            .expect("ok");
        assert_eq!(f, Some(FinishReason::Stop));
        let c = s.into_completion(FinishReason::Stop, Instant::now());
        assert_eq!(
            (c.text.as_str(), c.token_ids.as_slice()),
            ("hi", &[b'h' as u32, b'i' as u32, 256][..])
        );

        let mut s = seq(
            SamplingParams {
                ignore_eos: true,
                ..Default::default()
            },
            100,
        );
        let f = s
            .sample_and_append(&row_for(256), &t, 4, Instant::now())
            .expect("ok");
        assert_eq!(f, None);
    }

    #[test]
    fn length_limit_counts_the_prompt_and_hashes_follow_the_tokens() {
        // Prompt of 1 token, max_len 6 → 5 generated tokens.
        let mut s = seq(SamplingParams::default(), 6);
        assert_eq!(feed(&mut s, "abcdefgh"), Some(FinishReason::Length));
        assert_eq!(s.num_generated(), 5);
        // 6 tokens with block size 4 → one full block hashed.
        assert_eq!(s.block_hashes.len(), 1);
        let c = s.into_completion(FinishReason::Length, Instant::now());
        assert_eq!(c.text, "abcde");
        assert_eq!(
            c.usage,
            Usage {
                prompt_tokens: 1,
                completion_tokens: 5,
                cached_prompt_tokens: 0
            }
        );
    }
}
