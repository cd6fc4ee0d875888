//! The inference engine: requests in, completions out.
//!
//! Layout: [`handle`] (the public entry, [`EngineHandle`]), [`request`] (the contract types),
//! [`config`] (`[engine]` settings), and the engine thread's internals (scheduler, KV-cache
//! block manager, sequences, sampler). The scheduler drives a [`ModelRunner`]: a loaded
//! model on some backend. `spawn` in this module is the only place that picks the backend.

pub mod config;
mod core;
pub mod handle;
pub mod kv_cache;
pub mod request;
pub mod sampler;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod stop;
#[doc(hidden)]
pub mod test_support;

pub use self::core::StartError;
pub use config::{Device, EngineConfig};
pub use handle::{EngineHandle, EngineInfo, EngineStats};
pub use request::{ChatMessage, Completion, FinishReason, GenerateRequest, Prompt, SamplingParams};

use std::path::Path;

use crate::engine::sampling::{SampleError, Sampled, SamplingRow};
use crate::error::EngineError;
use crate::model::files::ModelFiles;
use crate::model::runner::build_runner_for;
use crate::tokenizer::Tokenizer;

/// Start the engine on its own OS thread ("engine") with an already-built runner and tokenizer.
/// Returns once the engine is ready, or with the reason it could not start (invalid `cfg`, a
/// cache geometry the scheduler cannot serve). `model_name` is reported in [`EngineInfo`].
pub fn spawn(
    runner: Box<dyn ModelRunner>,
    tokenizer: Tokenizer,
    cfg: EngineConfig,
    model_name: impl Into<String>,
) -> Result<EngineHandle, StartError> {
    let model_name = model_name.into();
    self::core::start(
        Box::new(move || {
            Ok(self::core::Loaded {
                runner,
                tokenizer,
                model_name,
            })
        }),
        cfg,
    )
}

/// Open a model (a `.gguf` file or a Hugging Face folder), build its tokenizer and its runner on
/// the device `cfg.device` names, and start the engine. Loading happens on the engine thread;
/// this call blocks until the model is loaded (use `spawn_blocking` from async code) and
/// returns load errors as `Err`.
pub fn spawn_from_path(model_path: &Path, cfg: EngineConfig) -> Result<EngineHandle, StartError> {
    let path = model_path.to_path_buf();
    let engine_cfg = cfg.clone();
    let load = move || {
        let files = ModelFiles::open(&path)?;
        let tokenizer = match (&files.gguf_metadata, &files.hf_dir) {
            (Some(meta), _) => Tokenizer::from_gguf(meta)?,
            (None, Some(dir)) => Tokenizer::from_hf_dir(dir)?,
            (None, None) => {
                return Err(StartError::Config(format!(
                    "{}: no tokenizer found",
                    path.display()
                )))
            }
        };
        let runner = build_runner_for(&files.config, files.weights.as_ref(), &engine_cfg)?;
        Ok(self::core::Loaded {
            runner,
            tokenizer,
            model_name: files.model_name(),
        })
    };
    self::core::start(Box::new(load), cfg)
}

/// What a sequence needs from a forward step's logits.
#[derive(Debug, Clone, PartialEq)]
pub enum LogitsFor {
    /// Nothing (an intermediate prefill chunk).
    None,
    /// The raw f32 logits row of the last token of the slice.
    Last,
    /// The raw f32 logits rows of every token of the slice (`kiln probe --positions all`).
    All,
    /// A token sampled on the device from the last token's logits, as the descriptor says;
    /// only the token (and the requested logprobs) reach the host.
    Sample(SamplingRow),
}

impl LogitsFor {
    /// Logits rows this sequence occupies in the step (`len` new tokens).
    pub fn rows(&self, len: usize) -> usize {
        match self {
            LogitsFor::None => 0,
            LogitsFor::Last | LogitsFor::Sample(_) => 1,
            LogitsFor::All => len,
        }
    }
}

/// What a forward step returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardOutput {
    /// Raw f32 logits, row-major `[rows, vocab]`: 1 row per `LogitsFor::Last` and `len` per
    /// `LogitsFor::All` sequence, in the order of `batch.seqs`.
    pub logits: Vec<f32>,
    /// One result per `LogitsFor::Sample` sequence, in the order of `batch.seqs` (a row whose
    /// logits have no finite maximum fails alone).
    pub samples: Vec<Result<Sampled, SampleError>>,
}

/// One sequence's part of a forward step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqSlice {
    /// Offset of this sequence's tokens in [`ForwardBatch::token_ids`].
    pub start: usize,
    /// Number of new tokens this step (1 for decode; a chunk for prefill).
    pub len: usize,
    /// Tokens already in the KV cache for this sequence before this step (the new tokens take
    /// positions `cached_len .. cached_len + len`).
    pub cached_len: usize,
    /// Physical KV block ids, in order; covers at least `cached_len + len` tokens.
    pub block_table: Vec<u32>,
    /// Which logits to return.
    pub logits: LogitsFor,
    /// Recurrent-state slot (hybrid models such as Qwen3.5; `None` for pure attention models).
    pub state_slot: Option<u32>,
}

/// Everything the model needs for one step of continuous batching.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    /// New tokens of all sequences, concatenated: `[num_tokens]`.
    pub token_ids: Vec<u32>,
    /// Per-sequence slices, in the order logits are returned.
    pub seqs: Vec<SeqSlice>,
}

/// KV-cache geometry a runner was built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    /// Tokens per block.
    pub block_size: usize,
    /// Physical blocks available.
    pub num_blocks: usize,
    /// Recurrent-state slots (0 for pure attention models).
    pub num_state_slots: usize,
}

/// A loaded model bound to a backend and its KV cache. Implemented once per architecture
/// family, generic over `Backend`; the engine thread holds it as `Box<dyn ModelRunner>`.
pub trait ModelRunner: Send {
    /// Vocabulary size (length of every logits row).
    fn vocab_size(&self) -> usize;
    /// The model's own context limit (`max_position_embeddings`).
    fn max_position_embeddings(&self) -> usize;
    /// The KV-cache geometry.
    fn cache_geometry(&self) -> CacheGeometry;
    /// Human-readable backend description for logs.
    fn device_name(&self) -> String;
    /// Bytes the weight matrices occupy on the device (what a decode step streams), for
    /// roofline figures; 0 when unknown.
    fn weight_bytes(&self) -> u64 {
        0
    }
    /// Run one step: raw logits rows for the `Last` / `All` sequences and sampled tokens for
    /// the `Sample` ones (see [`ForwardOutput`]). Writes K/V of the new tokens into the blocks
    /// named by each block table.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError>;
    /// Copy the KV contents of block `src` into block `dst` (all layers).
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError>;
    /// Reset recurrent state slot `slot` to zeros (hybrid models); a no-op otherwise.
    fn reset_state_slot(&mut self, _slot: u32) -> Result<(), EngineError> {
        Ok(())
    }
}
