//! Runner options: what building a [`ModelRunner`](crate::model::step::ModelRunner) needs
//! from the `[engine]` settings (the engine builds them with `EngineConfig::runner_options`),
//! and the [`Device`] that picks the backend in [`crate::model::runner`].

use serde::{Deserialize, Serialize};

/// Which backend runs the model. Parsed from `"auto" | "cpu" | "cuda" | "cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    /// CUDA device 0 when the `cuda` feature is built and a GPU is present, else the CPU.
    Auto,
    /// The CPU backend (the numerical reference).
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
}

impl TryFrom<String> for Device {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    format!("invalid device `{s}` (expected auto, cpu, cuda or cuda:N)")
                }),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Options for loading a model onto a backend. Units: tokens, MiB, a fraction of device memory.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerOptions {
    /// Backend to run on.
    pub device: Device,
    /// CPU worker threads; 0 = one per available core.
    pub threads: usize,
    /// Most sequences in one step (sizes the device workspace and decode graphs).
    pub max_num_seqs: usize,
    /// Most tokens in one step (sizes the device workspace).
    pub max_num_batched_tokens: usize,
    /// Longest sequence; 0 = the model's own limit.
    pub max_model_len: usize,
    /// Tokens per KV-cache block.
    pub block_size: usize,
    /// KV-cache size on the CPU backend, in MiB.
    pub kv_cache_mib: usize,
    /// Fraction of GPU memory the runner may use (weights + workspace + KV cache).
    pub gpu_memory_utilization: f32,
    /// Compute dtype on GPUs: `auto`, `bf16`, `fp16` or `f32`.
    pub dtype: String,
    /// KV-cache storage dtype: `auto`, `fp8_e5m2` or `fp8_e4m3`.
    pub kv_cache_dtype: String,
    /// `engine.enable_prefix_caching`: hybrid models then keep as many state slots again as
    /// prefix checkpoints (the recurrent state after a cached prefix).
    pub enable_prefix_caching: bool,
    /// `engine.cuda_graphs`: replay decode-only steps from CUDA graphs (one per batch bucket);
    /// ignored on the CPU.
    pub cuda_graphs: bool,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            device: Device::Auto,
            threads: 0,
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            max_model_len: 0,
            block_size: 16,
            kv_cache_mib: 512,
            gpu_memory_utilization: 0.90,
            dtype: "auto".into(),
            kv_cache_dtype: "auto".into(),
            enable_prefix_caching: true,
            cuda_graphs: true,
        }
    }
}
