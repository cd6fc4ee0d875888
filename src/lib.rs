//! kiln: a daemon that turns files into LLM completions, with its own inference engine.
//!
//! Crate map, in one-way layers (a module names only modules of lower layers; enforced by
//! `tests/layering.rs`), lowest first:
//! - leaves: [`error`] (typed errors, the ledger's error classes), [`tensor`] (host views of
//!   checkpoint tensors and their dtypes), [`sampling`] (the pure per-row sampling rule),
//!   [`quant`] (ggml block layouts and exact dequantization);
//! - [`backend`]: compute backends (CPU reference; CUDA behind the `cuda` feature);
//! - [`model`]: model files (GGUF, safetensors, config), architectures, the memory planner, and
//!   the step contract the engine drives ([`model::step`]: `ForwardBatch`, `ModelRunner`);
//! - [`tokenizer`]: tokenization and chat templates;
//! - [`engine`]: the engine thread behind [`engine::EngineHandle`] (scheduler, KV cache, sampler);
//! - [`config`] (`config.toml`: defaults, `KILN_*` overrides, validation) and [`ledger`] (the
//!   SQLite ledger of input files, tasks and attempts; all SQL lives there); [`logging`];
//! - [`daemon`] (`kiln run`: inputs/ → ledger → engine → outputs/) and [`tools`] (`kiln probe`,
//!   `kiln bench` and other non-daemon commands); the binary's `cli` on top.

pub mod backend;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod ledger;
pub mod logging;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod tensor;
pub mod tokenizer;
pub mod tools;
