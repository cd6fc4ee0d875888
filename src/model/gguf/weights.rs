//! GGUF tensors as a [`WeightSource`]: Hugging Face names, Hugging Face shapes, mapped bytes.
//!
//! Names: `token_embd` → `model.embed_tokens`, `output_norm` → `model.norm`, `output` →
//! `lm_head`, and per layer `blk.N.{attn_q,attn_k,attn_v,attn_output}` →
//! `model.layers.N.self_attn.{q,k,v,o}_proj`, `blk.N.{ffn_gate,ffn_up,ffn_down}` →
//! `model.layers.N.mlp.{gate,up,down}_proj`, `attn_norm` → `input_layernorm`, `ffn_norm` →
//! `post_attention_layernorm`, `attn_q_norm`/`attn_k_norm` → `self_attn.q_norm`/`k_norm`.
//! A tensor without a mapping is refused (`Unsupported`), never silently dropped.
//!
//! Shapes: ggml `ne` reversed (`ne[0]` is the contiguous axis, the last in HF order).
//!
//! Q/K rows: llama.cpp's `convert_hf_to_gguf.py` stores `llama` q_proj/k_proj (weights and
//! biases) with the rows of each head interleaved for its rotate-half-free RoPE: with
//! `hd = rows / n_head`, HF row `h·hd + a·hd/2 + j` (a ∈ {0, 1}, j < hd/2) is stored at GGUF row
//! `h·hd + 2j + a` (`n_head` = attention heads for Q, KV heads for K). We undo it by copying
//! whole stored rows (a row is whole quant blocks, so this works on quantized data); those two
//! tensors per layer are owned copies, everything else is a slice of the map. `qwen3` GGUFs are
//! not permuted.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use crate::error::ModelError;
use crate::model::config::{Architecture, ModelConfig};
use crate::model::gguf::GgufFile;
use crate::tensor::{TensorView, WeightDType, WeightSource};

/// The Hugging Face checkpoint key of ggml tensor `name`, or `None` when kiln has no mapping.
pub fn hf_name(name: &str) -> Option<String> {
    let (stem, suffix) = name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let mapped = match stem {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = stem.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let module = match part {
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                _ => return None,
            };
            format!("model.layers.{layer}.{module}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

/// Where a tensor's bytes live.
#[derive(Debug)]
enum Storage {
    /// A byte range of the map.
    Mapped(Range<usize>),
    /// An owned copy (the un-permuted Q/K tensors): `u64` words for 8-byte alignment, `len` bytes used.
    Owned { words: Vec<u64>, len: usize },
}

/// One tensor under its HF name.
#[derive(Debug)]
struct Entry {
    /// Encoding.
    dtype: WeightDType,
    /// HF order.
    shape: Vec<usize>,
    /// Bytes.
    storage: Storage,
}

/// The tensors of a GGUF file under Hugging Face names and shapes.
#[derive(Debug)]
pub struct GgufWeights {
    /// The mapped file (owns the map every `Storage::Mapped` points into).
    file: GgufFile,
    /// HF name → tensor.
    entries: HashMap<String, Entry>,
}

impl GgufWeights {
    /// Maps every tensor of `file` to its HF name and shape, un-permuting `llama` Q/K rows with
    /// the head counts of `config`. Fails with `Unsupported` on an unknown tensor name or type.
    pub fn new(file: GgufFile, config: &ModelConfig) -> Result<GgufWeights, ModelError> {
        let mut entries = HashMap::with_capacity(file.tensors().len());
        for info in file.tensors() {
            let name = hf_name(&info.name).ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "GGUF tensor `{}` in {} has no Hugging Face equivalent kiln knows (architecture {:?})",
                    info.name,
                    file.path().display(),
                    config.architecture
                ))
            })?;
            let dtype = info.ggml_type.weight_dtype().ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "GGUF tensor `{}` has type {}, which kiln does not read (F32, F16, BF16, \
                     Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)",
                    info.name, info.ggml_type
                ))
            })?;
            let range = file.data_range(info)?;
            let shape = info.hf_shape();
            let n_head = match (config.architecture, name.rsplit('.').nth(1)) {
                (Architecture::Llama, Some("q_proj")) => Some(config.num_attention_heads),
                (Architecture::Llama, Some("k_proj")) => Some(config.num_key_value_heads),
                _ => None,
            };
            let storage = match n_head {
                Some(n_head) => {
                    let bytes = &file.mmap[range];
                    unpermute_rows(bytes, &shape, n_head).map_err(|message| ModelError::Format {
                        path: file.path().to_path_buf(),
                        format: "gguf",
                        message: format!("tensor `{}`: {message}", info.name),
                    })?
                }
                None => Storage::Mapped(range),
            };
            entries.insert(
                name,
                Entry {
                    dtype,
                    shape,
                    storage,
                },
            );
        }
        Ok(GgufWeights { file, entries })
    }

    /// The underlying file (metadata, raw directory).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Tensor counts per encoding (for the load log line).
    pub fn dtype_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for e in self.entries.values() {
            *counts.entry(format!("{:?}", e.dtype)).or_insert(0) += 1;
        }
        counts
    }
}

/// Inverts llama.cpp's per-head Q/K row interleave (see the module docs) on stored rows.
/// `shape` is HF order; rows are `shape[0]`, each `bytes.len() / rows` bytes.
fn unpermute_rows(bytes: &[u8], shape: &[usize], n_head: usize) -> Result<Storage, String> {
    let rows = *shape.first().ok_or("empty shape")?;
    if rows == 0 || n_head == 0 || !rows.is_multiple_of(2 * n_head) {
        return Err(format!(
            "{rows} rows cannot be split into {n_head} heads of an even size"
        ));
    }
    let row_bytes = bytes.len() / rows;
    let hd = rows / n_head;
    let half = hd / 2;
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    let out: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()];
    for h in 0..n_head {
        for a in 0..2 {
            for j in 0..half {
                let hf_row = h * hd + a * half + j;
                let stored_row = h * hd + 2 * j + a;
                out[hf_row * row_bytes..(hf_row + 1) * row_bytes]
                    .copy_from_slice(&bytes[stored_row * row_bytes..(stored_row + 1) * row_bytes]);
            }
        }
    }
    Ok(Storage::Owned {
        words,
        len: bytes.len(),
    })
}

impl WeightSource for GgufWeights {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let data = match &e.storage {
            Storage::Mapped(r) => &self.file.mmap[r.clone()],
            Storage::Owned { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
        };
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
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf_keys() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_q.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            (
                "blk.12.attn_k.bias",
                "model.layers.12.self_attn.k_proj.bias",
            ),
            (
                "blk.3.attn_v.weight",
                "model.layers.3.self_attn.v_proj.weight",
            ),
            (
                "blk.3.attn_output.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            (
                "blk.3.attn_q_norm.weight",
                "model.layers.3.self_attn.q_norm.weight",
            ),
            (
                "blk.3.attn_k_norm.weight",
                "model.layers.3.self_attn.k_norm.weight",
            ),
            (
                "blk.29.ffn_gate.weight",
                "model.layers.29.mlp.gate_proj.weight",
            ),
            ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
            (
                "blk.29.ffn_down.weight",
                "model.layers.29.mlp.down_proj.weight",
            ),
            (
                "blk.1.attn_norm.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "blk.1.ffn_norm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
        ];
        for (ggml, hf) in cases {
            assert_eq!(hf_name(ggml).as_deref(), Some(hf), "{ggml}");
        }
        for unknown in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.ffn_gate_exps.weight",
            "token_embd.scale",
        ] {
            assert_eq!(hf_name(unknown), None, "{unknown}");
        }
    }

    /// llama.cpp's permute, written from its definition, to check we invert it:
    /// `w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
    fn llama_cpp_permute(rows_in: &[Vec<u8>], n_head: usize) -> Vec<Vec<u8>> {
        let rows = rows_in.len();
        let half = rows / n_head / 2;
        let mut out = vec![Vec::new(); rows];
        for h in 0..n_head {
            for j in 0..half {
                for a in 0..2 {
                    // Output index after swapaxes: [h, j, a] ← input [h, a, j].
                    out[h * 2 * half + j * 2 + a] = rows_in[h * 2 * half + a * half + j].clone();
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_head, hd, row_bytes) = (3, 8, 5);
        let rows = n_head * hd;
        let hf: Vec<Vec<u8>> = (0..rows).map(|r| vec![r as u8; row_bytes]).collect();
        let stored: Vec<u8> = llama_cpp_permute(&hf, n_head).concat();
        assert_ne!(stored, hf.concat(), "the permutation is not the identity");
        let Storage::Owned { words, len } = unpermute_rows(&stored, &[rows, 7], n_head).unwrap()
        else {
            panic!("unpermute must own its rows");
        };
        assert_eq!(
            &bytemuck::cast_slice::<u64, u8>(&words)[..len],
            &hf.concat()[..]
        );
    }

    #[test]
    fn unpermute_rejects_odd_heads() {
        assert!(unpermute_rows(&[0; 30], &[6, 5], 4).is_err());
        assert!(unpermute_rows(&[0; 30], &[6, 5], 2).is_err()); // head of 3 rows
    }
}
