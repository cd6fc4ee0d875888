//! Loading a llama-family model: tensors looked up by checkpoint key, shape-checked and
//! uploaded ([`Loader`]), q|k|v and gate|up stacked at load, and the runner assembled
//! ([`Llama::load`]). Split out of `model/llama.rs`.

use super::*;

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

    /// The linear layers `parts` (module, rows) of width `cols` stacked into one weight, or
    /// `None` when they cannot be stacked (a packed 4-bit part, or an encoding the backend
    /// cannot stack): they are then loaded apart with [`Loader::linear`].
    fn stacked(
        &self,
        parts: &[(&str, usize)],
        cols: usize,
    ) -> Result<Option<B::Weight>, ModelError> {
        self.stacked_with(parts, cols, |b, name, views| {
            b.upload_weight_rows(name, views)
        })
    }

    /// The gate and up projections stacked for [`Backend::gate_up_swiglu`]
    /// ([`Backend::upload_gate_up`]), or `None` as [`Loader::stacked`].
    fn gate_up(
        &self,
        gate: &str,
        up: &str,
        inter: usize,
        cols: usize,
    ) -> Result<Option<B::Weight>, ModelError> {
        self.stacked_with(
            &[(gate, inter), (up, inter)],
            cols,
            |b, name, views| match views {
                [g, u] => b.upload_gate_up(name, &[*g, *u]),
                _ => Err(crate::backend::BackendError::InvalidArgument(format!(
                    "`{name}`: a gate|up weight needs two parts, got {}",
                    views.len()
                ))),
            },
        )
    }

    fn stacked_with(
        &self,
        parts: &[(&str, usize)],
        cols: usize,
        upload: impl Fn(
            &B,
            &str,
            &[crate::tensor::TensorView<'_>],
        ) -> Result<B::Weight, crate::backend::BackendError>,
    ) -> Result<Option<B::Weight>, ModelError> {
        let mut views = Vec::with_capacity(parts.len());
        for &(module, rows) in parts {
            match self.weights.linear(module)? {
                crate::tensor::LinearView::Dense(_) => {
                    views.push(self.view(&format!("{module}.weight"), &[rows, cols])?)
                }
                crate::tensor::LinearView::Packed(_) => return Ok(None),
            }
        }
        let name = parts.iter().map(|p| p.0).collect::<Vec<_>>().join(" | ");
        match upload(self.backend, &name, &views) {
            Ok(w) => Ok(Some(w)),
            Err(crate::backend::BackendError::Unsupported(_)) => Ok(None),
            Err(e) => Err(ModelError::Backend(e.to_string())),
        }
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
            let (qk, kk, vk) = (attn.key("q_proj"), attn.key("k_proj"), attn.key("v_proj"));
            let qkv = match ld.stacked(&[(&qk, q_dim), (&kk, kv_dim), (&vk, kv_dim)], hidden)? {
                Some(w) => QkvProj::Fused(w),
                None => QkvProj::Split {
                    q: ld.linear(&qk, q_dim, hidden)?,
                    k: ld.linear(&kk, kv_dim, hidden)?,
                    v: ld.linear(&vk, kv_dim, hidden)?,
                },
            };
            let (gk, uk) = (mlp.key("gate_proj"), mlp.key("up_proj"));
            let inter = c.intermediate_size;
            let gate_up = match ld.gate_up(&gk, &uk, inter, hidden)? {
                Some(w) => GateUpProj::Fused(w),
                None => GateUpProj::Split {
                    gate: ld.linear(&gk, inter, hidden)?,
                    up: ld.linear(&uk, inter, hidden)?,
                },
            };
            layers.push(LlamaLayer {
                input_layernorm: ld.vector(&p.key("input_layernorm.weight"), hidden)?,
                qkv,
                o_proj: ld.linear(&attn.key("o_proj"), hidden, q_dim)?,
                q_norm: qk_norm
                    .then(|| ld.vector(&attn.key("q_norm.weight"), hd))
                    .transpose()?,
                k_norm: qk_norm
                    .then(|| ld.vector(&attn.key("k_norm.weight"), hd))
                    .transpose()?,
                post_attention_layernorm: ld
                    .vector(&p.key("post_attention_layernorm.weight"), hidden)?,
                gate_up,
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
            fused_qkv = layers.iter().all(|l| matches!(l.qkv, QkvProj::Fused(_))),
            fused_gate_up = layers.iter().all(|l| matches!(l.gate_up, GateUpProj::Fused(_))),
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
            steps: Default::default(),
        })
    }
}
