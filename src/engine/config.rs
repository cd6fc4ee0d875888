//! `[engine]` settings: scheduling limits, KV-cache geometry and the device.
//!
//! Embedded in the daemon's `config.toml` as the `[engine]` table and used directly by
//! `kiln generate`, `kiln probe` and `kiln bench`. Every key is documented in `config.toml`.

use serde::{Deserialize, Serialize};

use crate::model::options::RunnerOptions;

pub use crate::model::options::Device;

/// Engine settings (`[engine]` in `config.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Backend to run on.
    pub device: Device,
    /// CPU worker threads; 0 = one per available core.
    pub threads: usize,
    /// Most sequences in one scheduling step.
    pub max_num_seqs: usize,
    /// Token budget of one step (decodes + prefill chunks); prompts longer than this are
    /// prefilled in chunks.
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + completion); 0 = the model's own limit.
    pub max_model_len: usize,
    /// Tokens per KV-cache block.
    pub block_size: usize,
    /// KV-cache size on the CPU backend, in MiB (GPU backends size it from
    /// `gpu_memory_utilization`).
    pub kv_cache_mib: usize,
    /// Fraction of GPU memory kiln may use (weights + workspace + KV cache).
    pub gpu_memory_utilization: f32,
    /// Reuse KV blocks of identical prompt prefixes across requests.
    pub enable_prefix_caching: bool,
    /// Compute dtype on GPUs: `auto` (bf16 on sm_80+, fp16 below), `bf16`, `fp16`, or `f32`
    /// (slow; for checking numerics). The CPU always computes in f32.
    pub dtype: String,
    /// KV-cache storage dtype: `auto` (the compute dtype), `fp8_e5m2` or `fp8_e4m3`. The CPU
    /// keeps f32 and rounds through the fp8 encoding (same numerics, no memory saved).
    pub kv_cache_dtype: String,
    /// Replay decode-only steps from CUDA graphs, one per batch bucket (1, 2, 4, … up to
    /// `max_num_seqs`), recorded at first use; mixed and prefill steps run eagerly. Ignored on
    /// the CPU.
    pub cuda_graphs: bool,
    /// Build and submit the next step while the device runs the current one, so the only
    /// wait per step is the download of the sampled ids (runners that queue steps on a device:
    /// CUDA llama/qwen3; the CPU computes a step when it is submitted and ignores this). On by
    /// default (its GPU token-parity test passes on merged main: docs/gpu-validation.md).
    pub overlap: bool,
}

impl Default for EngineConfig {
    /// The runner's defaults ([`RunnerOptions::default`], the one place they are written) plus
    /// the engine's own.
    fn default() -> Self {
        let r = RunnerOptions::default();
        EngineConfig {
            device: r.device,
            threads: r.threads,
            max_num_seqs: r.max_num_seqs,
            max_num_batched_tokens: r.max_num_batched_tokens,
            max_model_len: r.max_model_len,
            block_size: r.block_size,
            kv_cache_mib: r.kv_cache_mib,
            gpu_memory_utilization: r.gpu_memory_utilization,
            enable_prefix_caching: r.enable_prefix_caching,
            dtype: r.dtype,
            kv_cache_dtype: r.kv_cache_dtype,
            cuda_graphs: r.cuda_graphs,
            overlap: true,
        }
    }
}

impl EngineConfig {
    /// What the model runner needs of these settings (device, cache geometry, dtypes, and the
    /// step limits the device workspace is sized for).
    pub fn runner_options(&self) -> RunnerOptions {
        RunnerOptions {
            device: self.device,
            threads: self.threads,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            block_size: self.block_size,
            kv_cache_mib: self.kv_cache_mib,
            gpu_memory_utilization: self.gpu_memory_utilization,
            dtype: self.dtype.clone(),
            kv_cache_dtype: self.kv_cache_dtype.clone(),
            enable_prefix_caching: self.enable_prefix_caching,
            cuda_graphs: self.cuda_graphs,
        }
    }

    /// Check ranges; errors name the key, the constraint and the value.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_num_seqs == 0 {
            return Err("`engine.max_num_seqs` must be at least 1 (got 0)".into());
        }
        if self.block_size == 0 || !self.block_size.is_power_of_two() || self.block_size > 256 {
            return Err(format!(
                "`engine.block_size` must be a power of two in 1..=256 (got {})",
                self.block_size
            ));
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(format!(
                "`engine.max_num_batched_tokens` ({}) must be at least `engine.max_num_seqs` ({})",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        if !(0.05..=1.0).contains(&self.gpu_memory_utilization) {
            return Err(format!(
                "`engine.gpu_memory_utilization` must be in 0.05..=1.0 (got {})",
                self.gpu_memory_utilization
            ));
        }
        if !matches!(self.dtype.as_str(), "auto" | "bf16" | "fp16" | "f32") {
            return Err(format!(
                "`engine.dtype` must be auto, bf16, fp16 or f32 (got `{}`)",
                self.dtype
            ));
        }
        if crate::backend::KvCacheDType::parse(&self.kv_cache_dtype).is_none() {
            return Err(format!(
                "`engine.kv_cache_dtype` must be auto, fp8_e5m2 or fp8_e4m3 (got `{}`)",
                self.kv_cache_dtype
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_parses_all_forms() {
        assert_eq!("auto".parse(), Ok(Device::Auto));
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
    }

    #[test]
    fn defaults_validate_and_bad_values_name_the_key() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
        let bad = EngineConfig {
            block_size: 12,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("engine.block_size"));
    }
}
