//! Seeded random weights of the real Qwen3.5-27B text model, made in-process (no files): the
//! tensor inventory of `shared/docs/qwen3_5.md` §2.2 (851 tensors, prefix
//! `model.language_model.`, top-level `lm_head.weight`; MTP and vision left out), dense BF16 or
//! with every linear packed the way published checkpoints pack it:
//! - [`SyntheticQuant::W4A16`]: compressed-tensors `pack-quantized` int4, asymmetric, group 128,
//!   `ignore: ["lm_head", "re:.*linear_attn.in_proj_b$", "re:.*linear_attn.in_proj_a$"]` (the
//!   llm-compressor W4A16_ASYM recipe seen for Qwen3.5, §2.4);
//! - [`SyntheticQuant::Nvfp4`]: compressed-tensors `nvfp4-pack-quantized` (NVFP4A16), same
//!   ignore list;
//! - [`SyntheticQuant::Bf16`]: every weight dense.
//!
//! Embeddings, norms, `conv1d`, `A_log`, `dt_bias` and ignored linears are BF16. Tensors are
//! generated on first access (a splitmix64 stream seeded by the seed and the tensor name, so a
//! tensor's bytes do not depend on access order) and kept; [`WeightSource::tensor_info`] never
//! generates, so sizing the whole 27B costs nothing. Values: packed words and zero points are
//! uniform random nibbles, scales uniform in [0.001, 0.05), dense weights uniform in ±0.02, fp8
//! scales finite in [2⁻⁴, 4): numerically meaningless, shaped and sized like the real model.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use half::bf16;
use serde_json::json;

use crate::error::ModelError;
use crate::model::quant_config::QuantConfig;
use crate::model::quantized::QuantizedWeights;
use crate::tensor::{TensorInfo, TensorView, WeightDType, WeightSource};

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

/// What a tensor is and how to fill it.
#[derive(Debug, Clone, PartialEq)]
enum Fill {
    /// Uniform bytes (packed nibbles, zero points).
    Bytes,
    /// BF16 uniform in ±0.02 (dense weights, norms).
    Weight,
    /// BF16 uniform in [0.001, 0.05).
    Scale,
    /// Finite fp8 E4M3 in [2⁻⁴, 4).
    Fp8Scale,
    /// This exact little-endian payload.
    Exact(Vec<u8>),
}

#[derive(Debug)]
struct Entry {
    dtype: WeightDType,
    shape: Vec<usize>,
    fill: Fill,
    data: OnceLock<Vec<u8>>,
}

/// The synthetic checkpoint (dense view; see [`qwen3_5_27b_weights`] for the quantized one).
#[derive(Debug)]
pub struct SyntheticWeights {
    seed: u64,
    entries: BTreeMap<String, Entry>,
}

/// splitmix64.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of the name, mixed with the seed.
fn stream_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325 ^ seed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
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
                Fill::Weight,
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
                    Fill::Scale,
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
                    Fill::Exact(100.0f32.to_le_bytes().to_vec()),
                );
            }
        }
    }

    /// The Qwen3.5-27B text inventory with linears packed by `quant`.
    pub fn qwen3_5_27b(quant: SyntheticQuant, seed: u64) -> SyntheticWeights {
        use qwen3_5_27b::*;
        let mut w = SyntheticWeights {
            seed,
            entries: BTreeMap::new(),
        };
        let root = "model.language_model";
        let bf16 = WeightDType::BF16;
        w.add(
            format!("{root}.embed_tokens.weight"),
            bf16,
            vec![VOCAB, HIDDEN],
            Fill::Weight,
        );
        w.add(
            format!("{root}.norm.weight"),
            bf16,
            vec![HIDDEN],
            Fill::Weight,
        );
        w.add_linear("lm_head", VOCAB, HIDDEN, quant, true);
        for i in 0..LAYERS {
            let p = format!("{root}.layers.{i}");
            w.add(
                format!("{p}.input_layernorm.weight"),
                bf16,
                vec![HIDDEN],
                Fill::Weight,
            );
            w.add(
                format!("{p}.post_attention_layernorm.weight"),
                bf16,
                vec![HIDDEN],
                Fill::Weight,
            );
            w.add_linear(
                &format!("{p}.mlp.gate_proj"),
                INTERMEDIATE,
                HIDDEN,
                quant,
                false,
            );
            w.add_linear(
                &format!("{p}.mlp.up_proj"),
                INTERMEDIATE,
                HIDDEN,
                quant,
                false,
            );
            w.add_linear(
                &format!("{p}.mlp.down_proj"),
                HIDDEN,
                INTERMEDIATE,
                quant,
                false,
            );
            if i % 4 == 3 {
                let a = format!("{p}.self_attn");
                w.add_linear(&format!("{a}.q_proj"), Q_PROJ, HIDDEN, quant, false);
                w.add_linear(&format!("{a}.k_proj"), KV_PROJ, HIDDEN, quant, false);
                w.add_linear(&format!("{a}.v_proj"), KV_PROJ, HIDDEN, quant, false);
                w.add_linear(&format!("{a}.o_proj"), HIDDEN, ATTN_OUT, quant, false);
                w.add(format!("{a}.q_norm.weight"), bf16, vec![256], Fill::Weight);
                w.add(format!("{a}.k_norm.weight"), bf16, vec![256], Fill::Weight);
            } else {
                let g = format!("{p}.linear_attn");
                w.add_linear(&format!("{g}.in_proj_qkv"), GDN_QKV, HIDDEN, quant, false);
                w.add_linear(&format!("{g}.in_proj_z"), GDN_V, HIDDEN, quant, false);
                w.add_linear(&format!("{g}.in_proj_b"), GDN_HEADS, HIDDEN, quant, true);
                w.add_linear(&format!("{g}.in_proj_a"), GDN_HEADS, HIDDEN, quant, true);
                w.add_linear(&format!("{g}.out_proj"), HIDDEN, GDN_V, quant, false);
                w.add(
                    format!("{g}.conv1d.weight"),
                    bf16,
                    vec![GDN_QKV, 1, 4],
                    Fill::Weight,
                );
                w.add(format!("{g}.dt_bias"), bf16, vec![GDN_HEADS], Fill::Weight);
                w.add(format!("{g}.A_log"), bf16, vec![GDN_HEADS], Fill::Weight);
                w.add(format!("{g}.norm.weight"), bf16, vec![128], Fill::Weight);
            }
        }
        w
    }

    fn generate(&self, name: &str, e: &Entry) -> Vec<u8> {
        let bytes = e
            .dtype
            .row_bytes(e.shape.iter().product())
            .expect("whole elements");
        let mut s = stream_seed(self.seed, name);
        let mut out = Vec::with_capacity(bytes);
        let unit = |s: &mut u64| (splitmix(s) >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        match &e.fill {
            Fill::Exact(v) => out.extend_from_slice(v),
            Fill::Bytes => {
                while out.len() < bytes {
                    out.extend_from_slice(&splitmix(&mut s).to_le_bytes());
                }
                out.truncate(bytes);
            }
            Fill::Weight | Fill::Scale => {
                for _ in 0..bytes / 2 {
                    let u = unit(&mut s);
                    let v = match e.fill {
                        Fill::Weight => (u * 2.0 - 1.0) * 0.02,
                        _ => 0.001 + u * 0.049,
                    };
                    out.extend_from_slice(&bf16::from_f32(v).to_le_bytes());
                }
            }
            Fill::Fp8Scale => {
                for _ in 0..bytes {
                    let b = splitmix(&mut s) as u8;
                    // Exponent field 3..=8 (2^-4 .. 2^1 · 1.875), any mantissa: finite, positive.
                    out.push(((3 + b % 6) << 3) | (b >> 5));
                }
            }
        }
        out
    }
}

impl WeightSource for SyntheticWeights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
        let data = e.data.get_or_init(|| self.generate(name, e));
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
            bytes: e
                .dtype
                .row_bytes(e.shape.iter().product())
                .expect("whole elements"),
        })
    }
}

/// The synthetic 27B as a loader sees a real checkpoint: read through the
/// `quantization_config` its packing implies (none for BF16).
pub fn qwen3_5_27b_weights(quant: SyntheticQuant, seed: u64) -> Box<dyn WeightSource> {
    let weights = Box::new(SyntheticWeights::qwen3_5_27b(quant, seed));
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
