//! kiln: a daemon that turns files into LLM completions, with its own inference engine.
//!
//! Crate map:
//! - [`config`]: `config.toml` (defaults, `KILN_*` overrides, validation).
//! - [`daemon`]: `kiln run`: inputs/ → ledger → engine → outputs/ (watcher, dispatcher, writer).
//! - [`error`]: typed errors and the ledger's error classes.
//! - [`engine`]: the engine thread behind [`engine::EngineHandle`] (scheduler, KV cache, sampler).
//! - [`ledger`]: the SQLite ledger of input files, tasks and attempts (all SQL lives there).
//! - [`logging`]: the tracing subscriber (stderr + the daily log file).
//! - [`model`]: model files (GGUF, safetensors, config) and architectures.
//! - [`backend`]: compute backends (CPU reference; CUDA behind the `cuda` feature).
//! - [`tokenizer`]: tokenization and chat templates.
//! - [`tools`]: `kiln probe`, `kiln bench` (and other non-daemon commands).

pub mod backend;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod ledger;
pub mod logging;
pub mod model;
pub mod tokenizer;
pub mod tools;
