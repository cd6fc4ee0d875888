//! Seeded random weights of the Qwen3.5 hybrid text model, made in-process (no files): the
//! tensor inventory of `shared/docs/qwen3_5.md` §2.2 (851 tensors at the 27B's dimensions,
//! prefix `model.language_model.`, top-level `lm_head.weight`; MTP and vision left out), at the
//! real Qwen3.5-27B dimensions ([`SyntheticDims::QWEN3_5_27B`]) or a tiny set for CPU tests
//! ([`SyntheticDims::TINY`]), with the matching [`ModelConfig`] ([`SyntheticDims::config`],
//! parsed from a `config.json` by the real parser), dense BF16 or with every linear packed the
//! way published checkpoints pack it:
//! - [`SyntheticQuant::W4A16`]: compressed-tensors `pack-quantized` int4, asymmetric, group 128,
//!   `ignore: ["lm_head", "re:.*linear_attn.in_proj_b$", "re:.*linear_attn.in_proj_a$"]` (the
//!   llm-compressor W4A16_ASYM recipe seen for Qwen3.5, §2.4);
//! - [`SyntheticQuant::Nvfp4`]: compressed-tensors `nvfp4-pack-quantized` (NVFP4A16), same
//!   ignore list;
//! - [`SyntheticQuant::Bf16`]: every weight dense.
//!
//! [`qwen3_5_weights`] wraps the source in the same [`QuantizedWeights`] a real checkpoint's
//! `quantization_config` gives, so the model loads through the real loader and runner
//! (`model::runner::build_runner_for`): planner, KV cache, GDN state slots.
//!
//! Embeddings, norms, `conv1d`, `A_log`, `dt_bias` and ignored linears are BF16. Tensors are
//! generated on first access ([`fill`]: seeded by the seed and the tensor name, so a tensor's
//! bytes do not depend on access order; made on all cores) and kept until the source is
//! dropped; [`WeightSource::tensor_info`] never generates, so sizing the whole 27B costs
//! nothing. Values are random but scaled like a trained model's so activations stay O(1)
//! through every layer (no NaN / inf in 64 layers): linears have rms 1/√k (dense uniform
//! ±√(3/k); W4A16 random nibbles and zero points with scales ∝ 1/√k; NVFP4 random e2m1 codes,
//! fp8 scales in [2⁻⁴, 4), global scale ∝ √k), `(1 + w)` norm weights ±0.02, the GDN output
//! norm (a plain weight) in [0.9, 1.1), `conv1d` ±√(3/4), `A_log` in [0, 1), `dt_bias` ±0.5,
//! embeddings ±0.5.

mod batch;
mod fill;

pub use batch::{BatchTooLarge, SyntheticBatch};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::json;

use crate::error::ModelError;
use crate::model::config::ModelConfig;
use crate::model::quant_config::QuantConfig;
use crate::model::quantized::QuantizedWeights;
use crate::tensor::{TensorInfo, TensorView, WeightDType, WeightSource};
use fill::Fill;

/// Which packing the synthetic linears get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticQuant {
    /// compressed-tensors W4A16_ASYM, group 128.
    W4A16,
    /// compressed-tensors NVFP4A16.
    Nvfp4,
    /// Dense BF16.
    Bf16,
}

/// The Qwen3.5-27B text dimensions (§2.1).
pub mod qwen3_5_27b {
    /// Residual width.
    pub const HIDDEN: usize = 5120;
    /// Decoder layers (every 4th is full attention).
    pub const LAYERS: usize = 64;
    /// MLP width.
    pub const INTERMEDIATE: usize = 17408;
    /// Vocabulary.
    pub const VOCAB: usize = 248_320;
    /// Full-attention q_proj rows (24 heads × 256 × [query | gate]).
    pub const Q_PROJ: usize = 12288;
    /// Full-attention k/v rows (4 heads × 256).
    pub const KV_PROJ: usize = 1024;
    /// Full-attention o_proj input (24 × 256).
    pub const ATTN_OUT: usize = 6144;
    /// GDN in_proj_qkv rows (2048 + 2048 + 6144).
    pub const GDN_QKV: usize = 10240;
    /// GDN value width (48 heads × 128): in_proj_z rows, out_proj input.
    pub const GDN_V: usize = 6144;
    /// GDN heads (in_proj_a / in_proj_b rows, A_log, dt_bias).
    pub const GDN_HEADS: usize = 48;
}

/// The dimensions of a synthetic Qwen3.5 text model (every 4th layer full attention, as
/// `full_attention_interval: 4`). Packed formats need every linear's input width to be a
/// multiple of 128 (W4A16 groups) and 16 (NVFP4 blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticDims {
    /// Residual width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Full-attention query heads.
    pub heads: usize,
    /// Full-attention KV heads.
    pub kv_heads: usize,
    /// Full-attention head dim.
    pub head_dim: usize,
    /// GDN key heads.
    pub linear_key_heads: usize,
    /// GDN value heads.
    pub linear_value_heads: usize,
    /// GDN key head dim.
    pub linear_key_dim: usize,
    /// GDN value head dim.
    pub linear_value_dim: usize,
    /// Position limit of the config.
    pub max_positions: usize,
}

impl SyntheticDims {
    /// Qwen3.5-27B (qwen3_5.md §2.1).
    pub const QWEN3_5_27B: SyntheticDims = SyntheticDims {
        hidden: qwen3_5_27b::HIDDEN,
        layers: qwen3_5_27b::LAYERS,
        intermediate: qwen3_5_27b::INTERMEDIATE,
        vocab: qwen3_5_27b::VOCAB,
        heads: 24,
        kv_heads: 4,
        head_dim: 256,
        linear_key_heads: 16,
        linear_value_heads: qwen3_5_27b::GDN_HEADS,
        linear_key_dim: 128,
        linear_value_dim: 128,
        max_positions: 262_144,
    };

    /// A tiny model of the same structure (3 GDN layers then 1 attention layer, twice) for
    /// CPU tests: every linear's input width is a multiple of 128.
    pub const TINY: SyntheticDims = SyntheticDims {
        hidden: 128,
        layers: 8,
        intermediate: 256,
        vocab: 96,
        heads: 2,
        kv_heads: 1,
        head_dim: 64,
        linear_key_heads: 2,
        linear_value_heads: 4,
        linear_key_dim: 32,
        linear_value_dim: 32,
        max_positions: 1024,
    };

    /// GDN conv / in_proj_qkv width: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_dim()
    }

    /// GDN value width.
    pub fn linear_value_dim(&self) -> usize {
        self.linear_value_heads * self.linear_value_dim
    }

    /// Whether layer `i` is full attention.
    pub fn is_full_attention(i: usize) -> bool {
        i % 4 == 3
    }

    /// The nested `config.json` (`Qwen3_5ForConditionalGeneration` text part, no vision tower,
    /// no MTP) of these dimensions.
    pub fn config_json(&self) -> serde_json::Value {
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|i| {
                if Self::is_full_attention(i) {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": false,
            "text_config": {
                "model_type": "qwen3_5_text",
                "hidden_size": self.hidden,
                "num_hidden_layers": self.layers,
                "layer_types": layer_types,
                "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads,
                "head_dim": self.head_dim,
                "attn_output_gate": true,
                "intermediate_size": self.intermediate,
                "max_position_embeddings": self.max_positions,
                "rms_norm_eps": 1e-6,
                "vocab_size": self.vocab,
                "linear_num_key_heads": self.linear_key_heads,
                "linear_num_value_heads": self.linear_value_heads,
                "linear_key_head_dim": self.linear_key_dim,
                "linear_value_head_dim": self.linear_value_dim,
                "linear_conv_kernel_dim": 4,
                "mtp_num_hidden_layers": 0,
                "hidden_act": "silu",
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25}
            }
        })
    }

    /// The [`ModelConfig`] of these dimensions, read by the real `config.json` parser.
    pub fn config(&self) -> Result<ModelConfig, ModelError> {
        crate::model::hf_config::config_from_json(
            &self.config_json().to_string(),
            Path::new("<synthetic config.json>"),
        )
    }
}

#[derive(Debug)]
struct Entry {
    dtype: WeightDType,
    shape: Vec<usize>,
    fill: Fill,
    data: OnceLock<Vec<u8>>,
}

/// The synthetic checkpoint (dense view; see [`qwen3_5_weights`] for the quantized one).
#[derive(Debug)]
pub struct SyntheticWeights {
    seed: u64,
    entries: BTreeMap<String, Entry>,
}

impl SyntheticWeights {
    fn add(&mut self, name: String, dtype: WeightDType, shape: Vec<usize>, fill: Fill) {
        self.entries.insert(
            name,
            Entry {
                dtype,
                shape,
                fill,
                data: OnceLock::new(),
            },
        );
    }

    /// One linear `[n, k]` under `module`, packed by `quant` unless `dense`.
    fn add_linear(&mut self, module: &str, n: usize, k: usize, quant: SyntheticQuant, dense: bool) {
        match (quant, dense) {
            (SyntheticQuant::Bf16, _) | (_, true) => self.add(
                format!("{module}.weight"),
                WeightDType::BF16,
                vec![n, k],
                Fill::linear(k),
            ),
            (SyntheticQuant::W4A16, false) => {
                let groups = k / 128;
                self.add(
                    format!("{module}.weight_packed"),
                    WeightDType::I32,
                    vec![n, k / 8],
                    Fill::Bytes,
                );
                self.add(
                    format!("{module}.weight_scale"),
                    WeightDType::BF16,
                    vec![n, groups],
                    Fill::w4_scale(k),
                );
                self.add(
                    format!("{module}.weight_zero_point"),
                    WeightDType::I32,
                    vec![n.div_ceil(8), groups],
                    Fill::Bytes,
                );
                let shape: Vec<u8> = [n as i64, k as i64]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                self.add(
                    format!("{module}.weight_shape"),
                    WeightDType::I64,
                    vec![2],
                    Fill::Exact(shape),
                );
            }
            (SyntheticQuant::Nvfp4, false) => {
                self.add(
                    format!("{module}.weight_packed"),
                    WeightDType::U8,
                    vec![n, k / 2],
                    Fill::Bytes,
                );
                self.add(
                    format!("{module}.weight_scale"),
                    WeightDType::F8E4M3,
                    vec![n, k / 16],
                    Fill::Fp8Scale,
                );
                self.add(
                    format!("{module}.weight_global_scale"),
                    WeightDType::F32,
                    vec![1],
                    Fill::nvfp4_global(k),
                );
            }
        }
    }

    /// The Qwen3.5-27B text inventory with linears packed by `quant`.
    pub fn qwen3_5_27b(quant: SyntheticQuant, seed: u64) -> SyntheticWeights {
        Self::qwen3_5(&SyntheticDims::QWEN3_5_27B, quant, seed)
    }

    /// The Qwen3.5 text inventory of dimensions `d` with linears packed by `quant`.
    pub fn qwen3_5(d: &SyntheticDims, quant: SyntheticQuant, seed: u64) -> SyntheticWeights {
        let mut w = SyntheticWeights {
            seed,
            entries: BTreeMap::new(),
        };
        let root = "model.language_model";
        let bf16 = WeightDType::BF16;
        let hidden = d.hidden;
        let norm = || Fill::Uniform {
            lo: -0.02,
            hi: 0.02,
        };
        w.add(
            format!("{root}.embed_tokens.weight"),
            bf16,
            vec![d.vocab, hidden],
            Fill::Uniform { lo: -0.5, hi: 0.5 },
        );
        w.add(format!("{root}.norm.weight"), bf16, vec![hidden], norm());
        w.add_linear("lm_head", d.vocab, hidden, quant, true);
        let (q_dim, kv_dim) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let (conv_dim, value_dim, nv) = (d.conv_dim(), d.linear_value_dim(), d.linear_value_heads);
        for i in 0..d.layers {
            let p = format!("{root}.layers.{i}");
            w.add(
                format!("{p}.input_layernorm.weight"),
                bf16,
                vec![hidden],
                norm(),
            );
            w.add(
                format!("{p}.post_attention_layernorm.weight"),
                bf16,
                vec![hidden],
                norm(),
            );
            let inter = d.intermediate;
            w.add_linear(&format!("{p}.mlp.gate_proj"), inter, hidden, quant, false);
            w.add_linear(&format!("{p}.mlp.up_proj"), inter, hidden, quant, false);
            w.add_linear(&format!("{p}.mlp.down_proj"), hidden, inter, quant, false);
            if SyntheticDims::is_full_attention(i) {
                let a = format!("{p}.self_attn");
                w.add_linear(&format!("{a}.q_proj"), 2 * q_dim, hidden, quant, false);
                w.add_linear(&format!("{a}.k_proj"), kv_dim, hidden, quant, false);
                w.add_linear(&format!("{a}.v_proj"), kv_dim, hidden, quant, false);
                w.add_linear(&format!("{a}.o_proj"), hidden, q_dim, quant, false);
                w.add(format!("{a}.q_norm.weight"), bf16, vec![d.head_dim], norm());
                w.add(format!("{a}.k_norm.weight"), bf16, vec![d.head_dim], norm());
            } else {
                let g = format!("{p}.linear_attn");
                w.add_linear(&format!("{g}.in_proj_qkv"), conv_dim, hidden, quant, false);
                w.add_linear(&format!("{g}.in_proj_z"), value_dim, hidden, quant, false);
                w.add_linear(&format!("{g}.in_proj_b"), nv, hidden, quant, true);
                w.add_linear(&format!("{g}.in_proj_a"), nv, hidden, quant, true);
                w.add_linear(&format!("{g}.out_proj"), hidden, value_dim, quant, false);
                w.add(
                    format!("{g}.conv1d.weight"),
                    bf16,
                    vec![conv_dim, 1, 4],
                    Fill::linear(4),
                );
                w.add(
                    format!("{g}.dt_bias"),
                    bf16,
                    vec![nv],
                    Fill::Uniform { lo: -0.5, hi: 0.5 },
                );
                w.add(
                    format!("{g}.A_log"),
                    bf16,
                    vec![nv],
                    Fill::Uniform { lo: 0.0, hi: 1.0 },
                );
                w.add(
                    format!("{g}.norm.weight"),
                    bf16,
                    vec![d.linear_value_dim],
                    Fill::Uniform { lo: 0.9, hi: 1.1 },
                );
            }
        }
        w
    }

    fn bytes_of(e: &Entry) -> usize {
        e.dtype
            .row_bytes(e.shape.iter().product())
            .expect("whole elements")
    }
}

impl WeightSource for SyntheticWeights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
        let data = e
            .data
            .get_or_init(|| fill::generate(self.seed, name, e.dtype, Self::bytes_of(e), &e.fill));
        Ok(TensorView {
            dtype: e.dtype,
            shape: &e.shape,
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn tensor_info(&self, name: &str) -> Result<TensorInfo, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
        Ok(TensorInfo {
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: Self::bytes_of(e),
        })
    }
}

/// The synthetic 27B as a loader sees a real checkpoint (see [`qwen3_5_weights`]).
pub fn qwen3_5_27b_weights(quant: SyntheticQuant, seed: u64) -> Box<dyn WeightSource> {
    qwen3_5_weights(&SyntheticDims::QWEN3_5_27B, quant, seed)
}

/// The synthetic model of dimensions `d` as a loader sees a real checkpoint: read through the
/// `quantization_config` its packing implies (none for BF16).
pub fn qwen3_5_weights(
    d: &SyntheticDims,
    quant: SyntheticQuant,
    seed: u64,
) -> Box<dyn WeightSource> {
    let weights = Box::new(SyntheticWeights::qwen3_5(d, quant, seed));
    let ignore = json!([
        "lm_head",
        "re:.*linear_attn.in_proj_b$",
        "re:.*linear_attn.in_proj_a$"
    ]);
    let q = match quant {
        SyntheticQuant::Bf16 => return weights,
        SyntheticQuant::W4A16 => json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                "symmetric": false}}},
            "ignore": ignore,
        }),
        SyntheticQuant::Nvfp4 => json!({
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                "symmetric": true, "scale_dtype": "float8_e4m3fn"}}},
            "ignore": ignore,
        }),
    };
    let config = QuantConfig::from_config_json(&json!({ "quantization_config": q }))
        .expect("the synthetic quantization_config parses")
        .expect("it is present");
    Box::new(QuantizedWeights::new(weights, config))
}

#[cfg(test)]
mod tests;
