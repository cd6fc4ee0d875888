//! kiln: a daemon that turns files into LLM completions, with its own inference engine.
//!
//! Crate map:
//! - [`error`]: typed errors and the ledger's error classes.
//! - [`engine`]: the engine thread behind [`engine::EngineHandle`] (scheduler, KV cache, sampler).
//! - [`model`]: model files (GGUF, safetensors, config) and architectures.
//! - [`backend`]: compute backends (CPU reference; CUDA behind the `cuda` feature).
//! - [`tokenizer`]: tokenization and chat templates.

pub mod backend;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod model;
pub mod tokenizer;
pub mod tools;
