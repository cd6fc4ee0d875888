//! What callers hand the engine ([`GenerateRequest`]) and what they get back ([`Completion`]).
//!
//! These types are the whole contract between the daemon and the engine: the daemon never sees
//! tensors, backends or the tokenizer's internals.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use crate::tokenizer::ChatMessage;

/// What to condition on.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Chat messages, rendered with the model's chat template.
    Chat {
        /// The conversation so far.
        messages: Vec<ChatMessage>,
        /// Extra variables for the template (OpenAI `chat_template_kwargs`), e.g. `enable_thinking`.
        template_kwargs: serde_json::Map<String, serde_json::Value>,
    },
    /// Raw text, tokenized as is (BOS added when the model asks for it).
    Text(String),
    /// Token ids, used as is.
    TokenIds(Vec<u32>),
}

/// Per-request sampling parameters. The defaults are greedy decoding with no penalties.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: u32,
    /// Nucleus sampling: keep the smallest set with cumulative probability ≥ `top_p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens with probability < `min_p` × the top probability; 0 disables.
    pub min_p: f32,
    /// HF-style repetition penalty over prompt and output tokens; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty over output tokens; 0 disables.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over output tokens; 0 disables.
    pub frequency_penalty: f32,
    /// Seed of the request's own RNG: the same seed gives the same tokens, alone or batched.
    pub seed: Option<u64>,
    /// Most tokens to generate; `None` = up to `max_model_len`.
    pub max_tokens: Option<u32>,
    /// Stop strings; generation ends before the first occurrence, which is not returned.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (the model's EOS ids always do unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at EOS (used by `kiln probe --greedy N` and benchmarks).
    pub ignore_eos: bool,
    /// Return the sampled token's log-probability and this many top alternatives (`None` = off).
    pub logprobs: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether these parameters reduce to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A request for one completion.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// What to condition on.
    pub prompt: Prompt,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// The request fails with `EngineError::Timeout` if not finished by then.
    pub deadline: Option<Instant>,
}

impl GenerateRequest {
    /// A request with default (greedy) sampling and no deadline.
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            deadline: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS / stop token id or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts, OpenAI style.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the (templated) prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache (not recomputed).
    pub cached_prompt_tokens: u32,
}

/// Where the time went, measured by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// From submission to the first scheduling step that included the request.
    pub queue: Duration,
    /// From submission to the first generated token (time to first token).
    pub ttft: Duration,
    /// From submission to completion.
    pub total: Duration,
    /// Generated tokens after the first, per second of decode time.
    pub decode_tokens_per_s: f64,
}

/// One alternative token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Token id.
    pub token_id: u32,
    /// The token's text (may be a partial UTF-8 sequence rendered lossily).
    pub token: String,
    /// Natural-log probability under the (unmodified, temperature-1) model distribution.
    pub logprob: f32,
}

/// Log-probability information for one generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The sampled token.
    pub token_id: u32,
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The `logprobs` most likely alternatives, most likely first.
    pub top: Vec<TopLogprob>,
}

/// A finished completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Generated text, stop string excluded.
    pub text: String,
    /// Generated token ids (the stop token id, if any, is included; see `finish_reason`).
    pub token_ids: Vec<u32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Engine-side timings.
    pub timings: Timings,
    /// Per-token log-probabilities when requested.
    pub logprobs: Option<Vec<TokenLogprob>>,
}
