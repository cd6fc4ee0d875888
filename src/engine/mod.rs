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
mod pipeline;
pub mod request;
pub mod sampler;
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

use crate::model::files::ModelFiles;
use crate::model::runner::build_runner_for;
use crate::model::step::ModelRunner;
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
        let runner = build_runner_for(
            &files.config,
            files.weights.as_ref(),
            &engine_cfg.runner_options(),
        )?;
        Ok(self::core::Loaded {
            runner,
            tokenizer,
            model_name: files.model_name(),
        })
    };
    self::core::start(Box::new(load), cfg)
}
