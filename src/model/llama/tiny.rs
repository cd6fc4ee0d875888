//! Tiny synthetic llama / qwen3 models for the CPU tests: tensors held in memory by checkpoint
//! key ([`MapSource`], a [`WeightSource`]), a small config per architecture and seeded random
//! weights stored as F32 or Q8_0. Used by `llama::tests` and the tests of the runner, the memory
//! planner, the engine pipeline and the probe tool.

use std::collections::HashMap;

use crate::backend::cpu::reference::dequantize_row;
use crate::error::ModelError;
use crate::model::{Architecture, ModelConfig};
use crate::tensor::{TensorView, WeightDType, WeightSource};

/// Tensors held in memory, by checkpoint key.
#[derive(Default)]
pub(crate) struct MapSource {
    pub(super) tensors: HashMap<String, (WeightDType, Vec<usize>, Vec<u8>)>,
}

impl MapSource {
    pub(crate) fn insert(
        &mut self,
        name: &str,
        dtype: WeightDType,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) {
        self.tensors.insert(name.to_owned(), (dtype, shape, data));
    }

    /// The tensor dequantized to f32.
    pub(super) fn f32(&self, name: &str) -> Vec<f32> {
        let (dtype, shape, data) = &self.tensors[name];
        let cols = *shape.last().unwrap();
        let row_bytes = dtype.row_bytes(cols).unwrap();
        let mut out = vec![0.0; shape.iter().product()];
        for (o, b) in out.chunks_mut(cols).zip(data.chunks(row_bytes)) {
            dequantize_row(*dtype, b, o);
        }
        out
    }
}

impl WeightSource for MapSource {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let (dtype, shape, data) = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        Ok(TensorView {
            dtype: *dtype,
            shape,
            data,
        })
    }
    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.tensors.keys().cloned().collect();
        n.sort();
        n
    }
}

/// A tiny config whose every input width is a multiple of 32 (so Q8_0 can store it).
pub(crate) fn tiny_config(architecture: Architecture) -> ModelConfig {
    ModelConfig {
        architecture,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        vocab_size: 40,
        max_position_embeddings: 64,
        tie_word_embeddings: architecture == Architecture::Qwen3,
        attention_bias: false,
        hybrid: None,
    }
}

/// Deterministic pseudo-random values in `[-scale, scale)` (a 64-bit LCG).
fn values(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Q8_0 encoding of rows of `cols` (a multiple of 32): per block `d = max|x| / 127`.
fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        out.extend(half::f16::from_f32(d).to_le_bytes());
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
    }
    out
}

/// Random weights for `c`; matrices stored as `matrix_dtype` (F32 or Q8_0), vectors as F32.
pub(crate) fn tiny_weights(c: &ModelConfig, seed: u64, matrix_dtype: WeightDType) -> MapSource {
    let mut seed = seed;
    let mut src = MapSource::default();
    let matrix = |src: &mut MapSource, name: &str, rows: usize, cols: usize, seed: &mut u64| {
        let v = values(seed, rows * cols, 0.3);
        let data = match matrix_dtype {
            WeightDType::F32 => bytemuck::cast_slice(&v).to_vec(),
            WeightDType::Q8_0 => quantize_q8_0(&v),
            other => panic!("tiny_weights does not encode {other:?}"),
        };
        src.insert(name, matrix_dtype, vec![rows, cols], data);
    };
    let vector = |src: &mut MapSource, name: &str, n: usize, seed: &mut u64| {
        let v: Vec<f32> = values(seed, n, 0.2).iter().map(|x| 1.0 + x).collect();
        src.insert(
            name,
            WeightDType::F32,
            vec![n],
            bytemuck::cast_slice(&v).to_vec(),
        );
    };
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    matrix(
        &mut src,
        "model.embed_tokens.weight",
        c.vocab_size,
        h,
        &mut seed,
    );
    if !c.tie_word_embeddings {
        matrix(&mut src, "lm_head.weight", c.vocab_size, h, &mut seed);
    }
    vector(&mut src, "model.norm.weight", h, &mut seed);
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        vector(
            &mut src,
            &format!("{p}.input_layernorm.weight"),
            h,
            &mut seed,
        );
        vector(
            &mut src,
            &format!("{p}.post_attention_layernorm.weight"),
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.self_attn.q_proj.weight"),
            qd,
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.self_attn.k_proj.weight"),
            kvd,
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.self_attn.v_proj.weight"),
            kvd,
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.self_attn.o_proj.weight"),
            h,
            qd,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.mlp.gate_proj.weight"),
            c.intermediate_size,
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.mlp.up_proj.weight"),
            c.intermediate_size,
            h,
            &mut seed,
        );
        matrix(
            &mut src,
            &format!("{p}.mlp.down_proj.weight"),
            h,
            c.intermediate_size,
            &mut seed,
        );
        if c.architecture == Architecture::Qwen3 {
            vector(
                &mut src,
                &format!("{p}.self_attn.q_norm.weight"),
                hd,
                &mut seed,
            );
            vector(
                &mut src,
                &format!("{p}.self_attn.k_norm.weight"),
                hd,
                &mut seed,
            );
        }
    }
    src
}
