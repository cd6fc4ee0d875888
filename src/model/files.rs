//! Open a model path: a `.gguf` file or a Hugging Face folder → [`ModelFiles`].
//!
//! - A regular file must be GGUF (checked by its magic, not its extension): config from the
//!   metadata, weights from the map ([`GgufWeights`]), the metadata kept for the tokenizer.
//! - A folder is a Hugging Face checkpoint: `config.json`, `*.safetensors` (single or sharded),
//!   and the tokenizer files when present (`tokenizer.json`, `tokenizer_config.json`,
//!   `chat_template.jinja`, `generation_config.json`). A folder without tokenizer files is
//!   valid (for `kiln probe`); building a tokenizer from it is the tokenizer's call to refuse.
//!
//! The config is cross-checked against the weights (embedding rows = `vocab_size`,
//! `num_hidden_layers` layers present) so a mismatched folder fails here, naming the tensor.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::ModelError;
use crate::model::config::ModelConfig;
use crate::model::gguf::{GgufFile, GgufMetadata, GgufWeights};
use crate::model::hf_config::{config_from_gguf, config_from_json_file};
use crate::model::quantized::QuantizedWeights;
use crate::model::safetensors::SafetensorsWeights;
use crate::tensor::WeightSource;

/// Which container the weights came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A single `.gguf` file.
    Gguf,
    /// A Hugging Face folder with safetensors.
    HfFolder,
}

impl ModelFormat {
    /// Stable lower-case label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfFolder => "hf_folder",
        }
    }
}

/// Tokenizer-related files of a Hugging Face folder (each `None` when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HfTokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: Option<PathBuf>,
    /// `tokenizer_config.json` (chat template, special tokens, add_bos).
    pub tokenizer_config_json: Option<PathBuf>,
    /// `chat_template.jinja`.
    pub chat_template_jinja: Option<PathBuf>,
    /// `generation_config.json` (stop ids).
    pub generation_config_json: Option<PathBuf>,
}

impl HfTokenizerFiles {
    /// Looks for the four files in `dir`.
    pub fn find(dir: &Path) -> Self {
        let file = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        HfTokenizerFiles {
            tokenizer_json: file("tokenizer.json"),
            tokenizer_config_json: file("tokenizer_config.json"),
            chat_template_jinja: file("chat_template.jinja"),
            generation_config_json: file("generation_config.json"),
        }
    }
}

/// Everything loaded from a model path, before any backend sees it.
pub struct ModelFiles {
    /// The path that was opened.
    pub path: PathBuf,
    /// GGUF or HF folder.
    pub format: ModelFormat,
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Tensors by HF key, in HF shape order, memory-mapped.
    pub weights: Box<dyn WeightSource>,
    /// GGUF metadata (tokenizer vocabulary, chat template, …); `None` for HF folders.
    pub gguf_metadata: Option<GgufMetadata>,
    /// The HF folder (for `Tokenizer::from_hf_dir`); `None` for GGUF.
    pub hf_dir: Option<PathBuf>,
    /// Tokenizer files found in the HF folder (all `None` for GGUF).
    pub tokenizer_files: HfTokenizerFiles,
}

impl fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelFiles")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("config", &self.config)
            .field("tensors", &self.weights.names().len())
            .field(
                "gguf_metadata_keys",
                &self.gguf_metadata.as_ref().map(GgufMetadata::len),
            )
            .field("hf_dir", &self.hf_dir)
            .field("tokenizer_files", &self.tokenizer_files)
            .finish()
    }
}

impl ModelFiles {
    /// Opens `path`: a GGUF file or a Hugging Face folder (see the module docs).
    pub fn open(path: &Path) -> Result<ModelFiles, ModelError> {
        let meta = std::fs::metadata(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let files = if meta.is_dir() {
            Self::open_hf_dir(path)?
        } else {
            Self::open_gguf(path)?
        };
        files.check_weights()?;
        tracing::info!(
            path = %files.path.display(),
            format = files.format.as_str(),
            architecture = ?files.config.architecture,
            layers = files.config.num_hidden_layers,
            hidden = files.config.hidden_size,
            vocab = files.config.vocab_size,
            tensors = files.weights.names().len(),
            "Model files opened."
        );
        Ok(files)
    }

    /// A GGUF file.
    fn open_gguf(path: &Path) -> Result<ModelFiles, ModelError> {
        let file = GgufFile::open(path)?;
        let config = config_from_gguf(&file)?;
        let metadata = file.metadata().clone();
        let weights = GgufWeights::new(file, &config)?;
        Ok(ModelFiles {
            path: path.to_path_buf(),
            format: ModelFormat::Gguf,
            config,
            weights: Box::new(weights),
            gguf_metadata: Some(metadata),
            hf_dir: None,
            tokenizer_files: HfTokenizerFiles::default(),
        })
    }

    /// A Hugging Face folder.
    fn open_hf_dir(dir: &Path) -> Result<ModelFiles, ModelError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(ModelError::Format {
                path: dir.to_path_buf(),
                format: "model folder",
                message: "no config.json: pass a .gguf file or a Hugging Face model folder".into(),
            });
        }
        let config = config_from_json_file(&config_path)?;
        let mut weights: Box<dyn WeightSource> = Box::new(SafetensorsWeights::open_dir(dir)?);
        if config.architecture == crate::model::Architecture::Qwen3_5 {
            weights = crate::model::qwen3_5::mtp::attach_mtp_file(dir, weights)?;
        }
        let weights = QuantizedWeights::wrap(weights, &read_json(&config_path)?)?;
        Ok(ModelFiles {
            path: dir.to_path_buf(),
            format: ModelFormat::HfFolder,
            config,
            weights,
            gguf_metadata: None,
            hf_dir: Some(dir.to_path_buf()),
            tokenizer_files: HfTokenizerFiles::find(dir),
        })
    }

    /// A short model name for logs and outputs: the GGUF file stem or the folder name.
    pub fn model_name(&self) -> String {
        let name = match self.format {
            ModelFormat::Gguf => self.path.file_stem(),
            ModelFormat::HfFolder => self.path.file_name(),
        };
        name.map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// Cross-checks the config against the weights: the embedding has `vocab_size` rows of
    /// `hidden_size`, and the last layer's attention exists.
    fn check_weights(&self) -> Result<(), ModelError> {
        let c = &self.config;
        let root = c.weight_prefix();
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed = self.weights.tensor(&embed_name)?;
        if embed.shape != [c.vocab_size, c.hidden_size] {
            return Err(ModelError::Shape {
                name: embed_name,
                expected: vec![c.vocab_size, c.hidden_size],
                found: embed.shape.to_vec(),
            });
        }
        let last_layer = c.num_hidden_layers.saturating_sub(1);
        let mixer = match c
            .hybrid
            .as_ref()
            .and_then(|h| h.layer_types.get(last_layer))
        {
            Some(crate::model::LayerType::LinearAttention) => "linear_attn.in_proj_qkv",
            _ => "self_attn.q_proj",
        };
        // A logical linear: dense `.weight` or the packed parts of a quantized checkpoint.
        self.weights
            .linear(&format!("{root}.layers.{last_layer}.{mixer}"))
            .map(|_| ())
    }
}

/// `path` parsed as JSON (the `quantization_config` is read from it).
fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Format {
        path: path.to_path_buf(),
        format: "config.json",
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Architecture;
    use crate::model::gguf::writer::testing::{tiny_model, write_temp};

    #[test]
    fn gguf_file_opens_with_metadata() {
        let f = write_temp(&tiny_model("llama"));
        let m = ModelFiles::open(f.path()).unwrap();
        assert_eq!(m.format, ModelFormat::Gguf);
        assert_eq!(m.config.architecture, Architecture::Llama);
        assert_eq!(
            m.gguf_metadata
                .as_ref()
                .unwrap()
                .get_str("general.architecture")
                .unwrap(),
            Some("llama")
        );
        assert!(m.hf_dir.is_none());
        assert!(m.weights.contains("model.layers.0.mlp.down_proj.weight"));
        assert!(m
            .model_name()
            .ends_with(&*f.path().file_stem().unwrap().to_string_lossy()));
    }

    #[test]
    fn non_gguf_file_and_missing_path_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.gguf");
        std::fs::write(&p, b"not a model at all").unwrap();
        let err = ModelFiles::open(&p).unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{err}");
        let err = ModelFiles::open(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, ModelError::Io { .. }), "{err}");
        let err = ModelFiles::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no config.json"), "{err}");
    }

    #[test]
    fn hf_folder_with_config_weights_and_tokenizer_files() {
        use safetensors::tensor::{Dtype, TensorView as StView};
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::json!({
            "model_type": "llama", "hidden_size": 4, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "rms_norm_eps": 1e-5, "vocab_size": 3, "max_position_embeddings": 16,
            "tie_word_embeddings": true
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let zeros = |n: usize| vec![0u8; n * 4];
        let (e, q) = (zeros(12), zeros(16));
        let tensors = vec![
            (
                "model.embed_tokens.weight",
                StView::new(Dtype::F32, vec![3, 4], &e).unwrap(),
            ),
            (
                "model.layers.0.self_attn.q_proj.weight",
                StView::new(Dtype::F32, vec![4, 4], &q).unwrap(),
            ),
        ];
        std::fs::write(
            dir.path().join("model.safetensors"),
            safetensors::serialize(tensors, None).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), "x").unwrap();

        let m = ModelFiles::open(dir.path()).unwrap();
        assert_eq!(m.format, ModelFormat::HfFolder);
        assert_eq!(m.config.head_dim, 2);
        assert!(m.gguf_metadata.is_none());
        assert_eq!(m.hf_dir.as_deref(), Some(dir.path()));
        assert_eq!(
            m.tokenizer_files.tokenizer_json,
            Some(dir.path().join("tokenizer.json"))
        );
        assert_eq!(
            m.tokenizer_files.chat_template_jinja,
            Some(dir.path().join("chat_template.jinja"))
        );
        assert_eq!(m.tokenizer_files.tokenizer_config_json, None);

        // A config that disagrees with the weights fails, naming the tensor.
        let bad = config
            .to_string()
            .replace("\"vocab_size\":3", "\"vocab_size\":5");
        assert_ne!(bad, config.to_string());
        std::fs::write(dir.path().join("config.json"), bad).unwrap();
        let err = ModelFiles::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, ModelError::Shape { ref name, .. } if name == "model.embed_tokens.weight"),
            "{err}"
        );
    }
}
