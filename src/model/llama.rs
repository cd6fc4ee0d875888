//! The llama-family decoder (`llama`: SmolLM2, Llama 2/3; `qwen3`: the same plus per-head
//! RMSNorm of q and k), generic over the [`Backend`], as one [`ModelRunner`].
//!
//! Per layer, with `x` the residual stream `[tokens, hidden]` (HF `LlamaDecoderLayer`):
//! ```text
//! h = rms_norm(x) · input_layernorm
//! q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ            [tokens, heads·head_dim], [tokens, kv_heads·head_dim]
//! (qwen3) q, k = rms_norm per head · q_norm, k_norm
//! q, k = rope(q, k, position)               NeoX rotate_half
//! cache[slot] = k, v;  a = softmax(q·kᵀ/√head_dim, causal) · v   over the paged cache
//! x = x + a·Woᵀ
//! h = rms_norm(x) · post_attention_layernorm
//! x = x + (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ
//! ```
//! then `logits = rms_norm(x) · norm · lm_headᵀ` in f32 for the rows that need them (`lm_head`
//! is `embed_tokens` when the checkpoint has no `lm_head.weight`), sampled on the backend or
//! downloaded raw as each sequence asks. The residual add of each
//! sub-block is fused with the norm that follows it ([`Backend::add_rms_norm`]).
//!
//! Weights are looked up by Hugging Face checkpoint key through [`Prefix`] and uploaded as
//! stored; shapes are checked against the config at load.

use tracing::info;

use crate::backend::{AttentionParams, Backend, KvCacheSpec, RopeSpec, StepInput};
use crate::error::{EngineError, ModelError};
use crate::model::prefix::Prefix;
use crate::model::step::{CacheGeometry, ForwardBatch, ForwardOutput, LogitsFor, ModelRunner};
use crate::model::{Architecture, ModelConfig};
use crate::tensor::WeightSource;

/// One decoder layer's weights on the backend.
struct LlamaLayer<B: Backend> {
    input_layernorm: B::Buffer,
    q_proj: B::Weight,
    k_proj: B::Weight,
    v_proj: B::Weight,
    o_proj: B::Weight,
    /// Qwen3 only: `[head_dim]`.
    q_norm: Option<B::Buffer>,
    /// Qwen3 only: `[head_dim]`.
    k_norm: Option<B::Buffer>,
    post_attention_layernorm: B::Buffer,
    gate_proj: B::Weight,
    up_proj: B::Weight,
    down_proj: B::Weight,
}

/// All weights of the model (and its RoPE table) on the backend.
struct LlamaWeights<B: Backend> {
    embed_tokens: B::Weight,
    /// `None`: tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    layers: Vec<LlamaLayer<B>>,
    norm: B::Buffer,
    rope: B::Rope,
}

/// A loaded llama/qwen3 model with its KV cache on backend `B`.
pub struct Llama<B: Backend> {
    backend: B,
    config: ModelConfig,
    weights: LlamaWeights<B>,
    kv_cache: B::KvCache,
    geometry: CacheGeometry,
}

/// Looks tensors up by key, checks their shapes and uploads them.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    weights: &'a dyn WeightSource,
}

impl<B: Backend> Loader<'_, B> {
    fn view(
        &self,
        key: &str,
        shape: &[usize],
    ) -> Result<crate::tensor::TensorView<'_>, ModelError> {
        let view = self.weights.tensor(key)?;
        if view.shape != shape {
            return Err(ModelError::Shape {
                name: key.to_owned(),
                expected: shape.to_vec(),
                found: view.shape.to_vec(),
            });
        }
        Ok(view)
    }

    fn matrix(&self, key: &str, rows: usize, cols: usize) -> Result<B::Weight, ModelError> {
        let view = self.view(key, &[rows, cols])?;
        self.backend
            .upload_weight(key, &view)
            .map_err(|e| ModelError::Backend(e.to_string()))
    }

    /// The linear layer `module` (`<module>.weight`, or its packed parts in a quantized
    /// checkpoint), checked to be `[rows, cols]`.
    fn linear(&self, module: &str, rows: usize, cols: usize) -> Result<B::Weight, ModelError> {
        let view = self.weights.linear(module)?;
        if view.shape() != [rows, cols] {
            return Err(ModelError::Shape {
                name: module.to_owned(),
                expected: vec![rows, cols],
                found: view.shape(),
            });
        }
        self.backend
            .upload_linear(module, &view)
            .map_err(|e| ModelError::Backend(e.to_string()))
    }

    fn vector(&self, key: &str, len: usize) -> Result<B::Buffer, ModelError> {
        let view = self.view(key, &[len])?;
        self.backend
            .upload_vector(key, &view)
            .map_err(|e| ModelError::Backend(e.to_string()))
    }
}

impl<B: Backend> Llama<B> {
    /// Load `config`'s model from `weights` onto `backend`, with a KV cache of `num_blocks`
    /// blocks of `block_size` tokens.
    pub fn load(
        backend: B,
        config: &ModelConfig,
        weights: &dyn WeightSource,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Llama<B>, ModelError> {
        let c = config;
        if c.attention_bias {
            return Err(ModelError::Unsupported(
                "attention biases (`attention_bias = true`)".into(),
            ));
        }
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            return Err(ModelError::Unsupported(format!(
                "{} attention heads over {} KV heads",
                c.num_attention_heads, c.num_key_value_heads
            )));
        }
        if c.num_hidden_layers == 0 {
            return Err(ModelError::Unsupported("a model without layers".into()));
        }
        if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
            return Err(ModelError::Unsupported(format!(
                "head_dim {} (RoPE needs an even width)",
                c.head_dim
            )));
        }
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let ld = Loader {
            backend: &backend,
            weights,
        };
        let model = Prefix::new("model");
        let embed_tokens = ld.matrix(&model.key("embed_tokens.weight"), c.vocab_size, hidden)?;
        let lm_head = if ["weight", "weight_packed", "qweight"]
            .iter()
            .any(|leaf| weights.contains(&format!("lm_head.{leaf}")))
        {
            Some(ld.linear("lm_head", c.vocab_size, hidden)?)
        } else {
            None
        };
        let qk_norm = c.architecture == Architecture::Qwen3;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = model.pp("layers").pp(i);
            let attn = p.pp("self_attn");
            let mlp = p.pp("mlp");
            layers.push(LlamaLayer {
                input_layernorm: ld.vector(&p.key("input_layernorm.weight"), hidden)?,
                q_proj: ld.linear(&attn.key("q_proj"), q_dim, hidden)?,
                k_proj: ld.linear(&attn.key("k_proj"), kv_dim, hidden)?,
                v_proj: ld.linear(&attn.key("v_proj"), kv_dim, hidden)?,
                o_proj: ld.linear(&attn.key("o_proj"), hidden, q_dim)?,
                q_norm: qk_norm
                    .then(|| ld.vector(&attn.key("q_norm.weight"), hd))
                    .transpose()?,
                k_norm: qk_norm
                    .then(|| ld.vector(&attn.key("k_norm.weight"), hd))
                    .transpose()?,
                post_attention_layernorm: ld
                    .vector(&p.key("post_attention_layernorm.weight"), hidden)?,
                gate_proj: ld.linear(&mlp.key("gate_proj"), c.intermediate_size, hidden)?,
                up_proj: ld.linear(&mlp.key("up_proj"), c.intermediate_size, hidden)?,
                down_proj: ld.linear(&mlp.key("down_proj"), hidden, c.intermediate_size)?,
            });
        }
        let norm = ld.vector(&model.key("norm.weight"), hidden)?;
        let backend_err = |e: crate::backend::BackendError| ModelError::Backend(e.to_string());
        let rope = backend
            .create_rope(&RopeSpec {
                rotary_dim: hd,
                theta: c.rope_theta,
                max_positions: c.max_position_embeddings,
            })
            .map_err(backend_err)?;
        let kv_cache = backend
            .create_kv_cache(&Self::kv_spec(c, block_size, num_blocks))
            .map_err(backend_err)?;
        info!(
            architecture = ?c.architecture,
            layers = c.num_hidden_layers,
            hidden,
            tied_embeddings = lm_head.is_none(),
            kv_blocks = num_blocks,
            block_size,
            device = %backend.name(),
            "Model loaded."
        );
        Ok(Llama {
            backend,
            config: c.clone(),
            weights: LlamaWeights {
                embed_tokens,
                lm_head,
                layers,
                norm,
                rope,
            },
            kv_cache,
            geometry: CacheGeometry {
                block_size,
                num_blocks,
                num_state_slots: 0,
            },
        })
    }

    /// The KV-cache geometry `config` needs for `num_blocks` blocks of `block_size` tokens.
    pub fn kv_spec(config: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_layers: config.num_hidden_layers,
            num_blocks,
            block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

impl<B: Backend> LlamaWeights<B> {
    /// Run every layer over the step's tokens; then the f32 logits of the step's logit rows stay
    /// on the device: raw rows are downloaded for the `Last` / `All` sequences of `batch`, and
    /// the `Sample` sequences' rows are sampled by the backend.
    fn run(
        &self,
        b: &B,
        c: &ModelConfig,
        kv_cache: &mut B::KvCache,
        input: &StepInput,
        batch: &ForwardBatch,
    ) -> Result<ForwardOutput, EngineError> {
        let t = input.num_tokens();
        let (hidden, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let (nh, nkv, inter) = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.intermediate_size,
        );
        let attn = AttentionParams {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            scale: (hd as f32).powf(-0.5),
        };
        let step = b.prepare_step(input)?;

        let mut x = b.alloc_f32(t * hidden)?; // residual stream, f32 on every backend
        let mut h = b.alloc(t * hidden)?; // normed input of the next sub-block
        let mut delta = b.alloc(t * hidden)?;
        let mut q = b.alloc(t * nh * hd)?;
        let mut k = b.alloc(t * nkv * hd)?;
        let mut v = b.alloc(t * nkv * hd)?;
        let mut a = b.alloc(t * nh * hd)?;
        let mut gate = b.alloc(t * inter)?;
        let mut up = b.alloc(t * inter)?;
        let mut act = b.alloc(t * inter)?;
        let mut k_normed = b.alloc(if self.layers[0].k_norm.is_some() {
            t * nkv * hd
        } else {
            0
        })?;
        b.embedding(&self.embed_tokens, &step, &mut x)?;
        b.rms_norm(&x, &self.layers[0].input_layernorm, &mut h, t, hidden, eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            b.matmul(&h, t, &layer.q_proj, &mut q)?;
            b.matmul(&h, t, &layer.k_proj, &mut k)?;
            b.matmul(&h, t, &layer.v_proj, &mut v)?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                // `a` is free until the attention output: use it for the normed q.
                b.rms_norm(&q, qn, &mut a, t * nh, hd, eps)?;
                std::mem::swap(&mut q, &mut a);
                b.rms_norm(&k, kn, &mut k_normed, t * nkv, hd, eps)?;
                std::mem::swap(&mut k, &mut k_normed);
            }
            b.rope(&mut q, &mut k, &self.rope, &step, nh, nkv, hd)?;
            b.write_kv(kv_cache, i, &k, &v, &step)?;
            b.paged_attention(&q, kv_cache, i, &step, &attn, &mut a)?;
            b.matmul(&a, t, &layer.o_proj, &mut delta)?;
            b.add_rms_norm(
                &mut x,
                &delta,
                &layer.post_attention_layernorm,
                &mut h,
                t,
                hidden,
                eps,
            )?;
            b.matmul(&h, t, &layer.gate_proj, &mut gate)?;
            b.matmul(&h, t, &layer.up_proj, &mut up)?;
            b.silu_mul(&gate, &up, &mut act, t * inter)?;
            b.matmul(&act, t, &layer.down_proj, &mut delta)?;
            let next_norm = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |l| &l.input_layernorm);
            b.add_rms_norm(&mut x, &delta, next_norm, &mut h, t, hidden, eps)?;
        }
        let rows = input.logit_rows.len();
        let mut out = ForwardOutput::default();
        if rows == 0 {
            return Ok(out);
        }
        let mut last = b.alloc(rows * hidden)?;
        b.gather_rows(&h, &step, hidden, &mut last)?;
        let lm_head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let logits = b.logits(&last, rows, lm_head)?;
        // Logits rows follow batch.seqs (as ForwardBatch::step_input laid them out).
        let mut row = 0;
        let mut picks = Vec::new();
        for s in &batch.seqs {
            let n = s.logits.rows(s.len);
            match &s.logits {
                LogitsFor::None => {}
                LogitsFor::Sample(desc) => picks.push((row, desc)),
                LogitsFor::Last | LogitsFor::All => {
                    let at = out.logits.len();
                    out.logits.resize(at + n * c.vocab_size, 0.0);
                    b.download_logits(&logits, row, &mut out.logits[at..])?;
                }
            }
            row += n;
        }
        if !picks.is_empty() {
            out.samples = b.sample(&logits, &picks)?;
        }
        Ok(out)
    }
}

impl<B: Backend> ModelRunner for Llama<B> {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn cache_geometry(&self) -> CacheGeometry {
        self.geometry
    }

    fn device_name(&self) -> String {
        self.backend.name()
    }

    fn weight_bytes(&self) -> u64 {
        let (b, w) = (&self.backend, &self.weights);
        let layers: usize = w
            .layers
            .iter()
            .map(|l| {
                [
                    &l.q_proj,
                    &l.k_proj,
                    &l.v_proj,
                    &l.o_proj,
                    &l.gate_proj,
                    &l.up_proj,
                    &l.down_proj,
                ]
                .iter()
                .map(|m| b.weight_bytes(m))
                .sum::<usize>()
            })
            .sum();
        let head = w.lm_head.as_ref().unwrap_or(&w.embed_tokens);
        (layers + b.weight_bytes(head)) as u64
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        let input = batch.step_input(
            self.geometry.block_size,
            self.geometry.num_blocks,
            self.config.vocab_size,
            self.config.max_position_embeddings,
        )?;
        if input.num_tokens() == 0 {
            return Ok(ForwardOutput::default());
        }
        let Llama {
            backend,
            config,
            weights,
            kv_cache,
            ..
        } = self;
        backend.run_step(|| weights.run(backend, config, kv_cache, &input, batch))
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Ok(self.backend.copy_block(&mut self.kv_cache, src, dst)?)
    }
}

#[cfg(test)]
pub(crate) mod tests;
