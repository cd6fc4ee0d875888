//! The Qwen3.5 MTP (multi-token prediction) head: loaded and shape-checked for the speculative
//! decoding that follows; no forward pass uses it yet.
//!
//! Tensors (shared/docs/qwen3_5.md §2.2, §3.10), prefix `mtp.`: `fc.weight [hidden, 2·hidden]`
//! (input `[embedding | hidden]`), `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm`
//! (`[hidden]`, `(1 + w)` norms kept as the stored `w`, for [`HybridBackend::rms_norm_1p`](crate::backend::hybrid::HybridBackend::rms_norm_1p)), and `layers.{i}.*`: one gated full-attention decoder layer each.
//! Checkpoints keep them in the main safetensors or in a separate `model-mtp.safetensors`
//! ([`attach_mtp_file`] adds that file to the weight source). The linears load through
//! [`Loader::linear`] as the body's do: packed when the checkpoint's `quantization_config`
//! quantizes them (not in its `ignore` list), else as stored.

use std::path::Path;

use crate::backend::hybrid::HybridBackend;
use crate::error::ModelError;
use crate::model::prefix::Prefix;
use crate::model::safetensors::SafetensorsWeights;
use crate::model::ModelConfig;
use crate::tensor::{TensorView, WeightSource};

use super::{AttnLayer, Layer, Loader, Mixer};

/// The separate MTP file some checkpoints ship.
pub const MTP_FILE: &str = "model-mtp.safetensors";

/// The MTP head's weights on the backend.
#[allow(dead_code)] // read by the speculative decoder that follows (not written yet)
pub struct MtpWeights<B: HybridBackend> {
    /// `[hidden, 2 × hidden]`.
    pub(crate) fc: B::Weight,
    pub(crate) pre_fc_norm_embedding: B::Buffer,
    pub(crate) pre_fc_norm_hidden: B::Buffer,
    pub(crate) norm: B::Buffer,
    pub(crate) layers: Vec<Layer<B>>,
}

impl<B: HybridBackend> MtpWeights<B> {
    /// The MTP head if the weights hold one (`mtp.fc.weight`), every tensor shape-checked.
    /// Layers: `mtp_num_hidden_layers`, or as many `mtp.layers.N` as the weights hold when the
    /// config does not say.
    pub(crate) fn load(
        ld: &Loader<'_, B>,
        c: &ModelConfig,
    ) -> Result<Option<MtpWeights<B>>, ModelError> {
        let root = Prefix::new("mtp");
        if !ld.weights.contains(&root.key("fc.weight")) {
            tracing::debug!("No MTP head (mtp.fc.weight) in the checkpoint.");
            return Ok(None);
        }
        let declared = c.hybrid.as_ref().map_or(0, |h| h.mtp_num_hidden_layers);
        let num_layers = if declared > 0 {
            declared
        } else {
            (0..)
                .take_while(|i| {
                    ld.weights
                        .contains(&root.pp("layers").pp(i).key("input_layernorm.weight"))
                })
                .count()
        };
        let (hidden, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let mut layers = Vec::with_capacity(num_layers);
        for i in 0..num_layers {
            let p = root.pp("layers").pp(i);
            let at = p.pp("self_attn");
            let mlp = p.pp("mlp");
            layers.push(Layer {
                input_layernorm: ld.norm_1p(&p.key("input_layernorm.weight"), hidden)?,
                mixer: Mixer::Full(AttnLayer {
                    q_proj: ld.linear(&at.key("q_proj"), 2 * q_dim, hidden)?,
                    k_proj: ld.linear(&at.key("k_proj"), kv_dim, hidden)?,
                    v_proj: ld.linear(&at.key("v_proj"), kv_dim, hidden)?,
                    o_proj: ld.linear(&at.key("o_proj"), hidden, q_dim)?,
                    q_norm: ld.norm_1p(&at.key("q_norm.weight"), hd)?,
                    k_norm: ld.norm_1p(&at.key("k_norm.weight"), hd)?,
                    kv_layer: i,
                }),
                post_attention_layernorm: ld
                    .norm_1p(&p.key("post_attention_layernorm.weight"), hidden)?,
                gate_proj: ld.linear(&mlp.key("gate_proj"), inter, hidden)?,
                up_proj: ld.linear(&mlp.key("up_proj"), inter, hidden)?,
                down_proj: ld.linear(&mlp.key("down_proj"), hidden, inter)?,
            });
        }
        let w = MtpWeights {
            fc: ld.linear(&root.key("fc"), hidden, 2 * hidden)?,
            pre_fc_norm_embedding: ld.norm_1p(&root.key("pre_fc_norm_embedding.weight"), hidden)?,
            pre_fc_norm_hidden: ld.norm_1p(&root.key("pre_fc_norm_hidden.weight"), hidden)?,
            norm: ld.norm_1p(&root.key("norm.weight"), hidden)?,
            layers,
        };
        tracing::info!(
            layers = num_layers,
            "MTP head loaded and shape-checked (not used yet: speculative decoding is future work)."
        );
        Ok(Some(w))
    }

    /// MTP decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// The checkpoint's weights plus the tensors of a separate MTP file.
struct WithMtpFile {
    main: Box<dyn WeightSource>,
    mtp: SafetensorsWeights,
}

impl WeightSource for WithMtpFile {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        if self.main.contains(name) {
            self.main.tensor(name)
        } else {
            self.mtp.tensor(name)
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.main.contains(name) || self.mtp.contains(name)
    }

    fn names(&self) -> Vec<String> {
        let mut n = self.main.names();
        n.extend(self.mtp.names());
        n.sort();
        n.dedup();
        n
    }
}

/// `weights` of the checkpoint in `dir`, plus `dir/model-mtp.safetensors` when that file exists
/// and the main weights do not map it already (some but not all of its tensors in the main
/// weights is a `Format` error).
pub fn attach_mtp_file(
    dir: &Path,
    weights: Box<dyn WeightSource>,
) -> Result<Box<dyn WeightSource>, ModelError> {
    let path = dir.join(MTP_FILE);
    if !path.is_file() {
        return Ok(weights);
    }
    let mtp = SafetensorsWeights::open_files(std::slice::from_ref(&path))?;
    let names = mtp.names();
    let in_main = names.iter().filter(|n| weights.contains(n)).count();
    if in_main == names.len() {
        // The index already maps the file's tensors.
        return Ok(weights);
    }
    if let Some(dup) = names.into_iter().find(|n| weights.contains(n)) {
        return Err(ModelError::Format {
            path,
            format: "safetensors",
            message: format!("tensor `{dup}` is also in the main checkpoint"),
        });
    }
    tracing::debug!(file = %MTP_FILE, tensors = mtp.names().len(), "MTP weights file found.");
    Ok(Box::new(WithMtpFile { main: weights, mtp }))
}
