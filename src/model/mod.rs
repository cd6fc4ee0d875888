//! Model files and architectures: formats (GGUF, safetensors, `config.json`), quantized
//! layouts, and the forward pass of each supported architecture.

pub mod config;
pub mod fetch;
pub mod files;
pub mod gguf;
pub mod hf_config;
pub mod llama;
pub mod memory;
pub mod options;
pub mod prefix;
pub mod quant_config;
pub mod quantized;
pub mod qwen3_5;
pub mod runner;
pub mod safetensors;
pub mod step;
pub(crate) mod step_queue;
pub(crate) mod step_submit;
pub mod synthetic;

pub use config::{Architecture, HybridConfig, LayerType, ModelConfig};
pub use files::{ModelFiles, ModelFormat};
pub use gguf::{GgufFile, GgufMetadata, GgufValue};
