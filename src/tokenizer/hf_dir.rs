//! Loading a tokenizer from a Hugging Face model folder.
//!
//! Files, as transformers reads them:
//! - `tokenizer.json`: the whole pipeline (required);
//! - the chat template: `chat_template.jinja` if present, else `tokenizer_config.json`'s
//!   `chat_template` (a string, or a list of `{name, template}` of which `default` is used, else
//!   the first);
//! - BOS / EOS: `tokenizer_config.json`'s `bos_token` / `eos_token` (a string or an
//!   `{"content": …}` object), then `generation_config.json`'s `bos_token_id` / `eos_token_id`
//!   (an int or a list of ints; generation stops on all of them), then `config.json`'s.
//!
//! BOS / EOS on encoded text: `tokenizer.json`'s post-processor, unless `tokenizer_config.json`
//! names `add_bos_token` or `add_eos_token` (or there is no post-processor), in which case it is
//! rebuilt from those flags as transformers v5 does. `add_bos` reports the result.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::post_processor::bos_eos_template;
use super::Tokenizer;
use crate::error::ModelError;

/// Read and parse a JSON file; `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, ModelError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Format {
            path: path.to_owned(),
            format: "json",
            message: e.to_string(),
        })
}

/// A special token's text from `tokenizer_config.json`: `"<s>"` or `{"content": "<s>", …}`.
fn token_content(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Token ids from an `int` or `[int, …]` field.
fn ids_of(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The chat template from `tokenizer_config.json`'s `chat_template` value.
fn template_from_config(value: Option<&Value>, path: &Path) -> Result<Option<String>, ModelError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let entry = |want: Option<&str>| {
                named
                    .iter()
                    .find(|e| want.is_none() || e.get("name").and_then(Value::as_str) == want)
            };
            let chosen = entry(Some("default")).or_else(|| entry(None));
            Ok(chosen
                .and_then(|e| e.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned))
        }
        Some(_) => Err(ModelError::Format {
            path: path.to_owned(),
            format: "tokenizer_config.json",
            message: "`chat_template` must be a string or a list of {name, template}".into(),
        }),
    }
}

impl Tokenizer {
    /// Load `tokenizer.json`, the chat template and BOS/EOS from a Hugging Face model folder.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, ModelError> {
        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            return Err(ModelError::Io {
                path: tokenizer_json,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no tokenizer.json in the model folder",
                ),
            });
        }
        let inner =
            tokenizers::Tokenizer::from_file(&tokenizer_json).map_err(|e| ModelError::Format {
                path: tokenizer_json.clone(),
                format: "tokenizer.json",
                message: e.to_string(),
            })?;

        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let model_config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);

        let jinja_path: PathBuf = dir.join("chat_template.jinja");
        let chat_template = match std::fs::read_to_string(&jinja_path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                template_from_config(config.get("chat_template"), &config_path)?
            }
            Err(source) => {
                return Err(ModelError::Io {
                    path: jinja_path,
                    source,
                })
            }
        };

        let id_of = |text: Option<&str>| text.and_then(|t| inner.token_to_id(t));
        // `"bos_token": null` (Qwen) means no BOS at all, as for transformers; only an absent key
        // falls back to the generation / model configs.
        let bos_token_id = match config.get("bos_token") {
            Some(value) => id_of(token_content(Some(value))),
            None => ids_of(generation.get("bos_token_id"))
                .first()
                .copied()
                .or_else(|| ids_of(model_config.get("bos_token_id")).first().copied()),
        };

        // The tokenizer's own EOS first (it is the template's `eos_token`), then generation_config's.
        let mut eos_token_ids: Vec<u32> = id_of(token_content(config.get("eos_token")))
            .into_iter()
            .collect();
        let mut extra = ids_of(generation.get("eos_token_id"));
        if extra.is_empty() && eos_token_ids.is_empty() {
            extra = ids_of(model_config.get("eos_token_id"));
        }
        for id in extra {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        // transformers (v5 `TokenizersBackend`) rebuilds the post-processor from
        // `add_bos_token` / `add_eos_token` when the config names either flag or tokenizer.json has
        // no post-processor; otherwise tokenizer.json's own post-processor decides.
        let mut inner = inner;
        let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
        if config.get("add_bos_token").is_some()
            || config.get("add_eos_token").is_some()
            || inner.get_post_processor().is_none()
        {
            let named = |key: &str| {
                let text = token_content(config.get(key))?;
                Some((text, inner.token_to_id(text)?))
            };
            let bos = named("bos_token").filter(|_| flag("add_bos_token"));
            let eos = named("eos_token").filter(|_| flag("add_eos_token"));
            let processor = bos_eos_template(bos, eos)?;
            inner.with_post_processor(Some(processor));
        }
        let add_bos = match bos_token_id {
            Some(bos) => inner
                .encode("", true)
                .map(|e| e.get_ids().first() == Some(&bos))
                .unwrap_or(false),
            None => false,
        };
        tracing::debug!(
            dir = %dir.display(),
            vocab = inner.get_vocab_size(true),
            ?bos_token_id,
            ?eos_token_ids,
            add_bos,
            has_chat_template = chat_template.is_some(),
            "Loaded the Hugging Face tokenizer."
        );
        Ok(Tokenizer {
            inner,
            chat_template,
            bos_token_id,
            eos_token_ids,
            add_bos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_template_list_prefers_default() {
        let list =
            json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        assert_eq!(
            template_from_config(Some(&list), Path::new("x"))
                .unwrap()
                .as_deref(),
            Some("D")
        );
        let list = json!([{"name": "rag", "template": "R"}]);
        assert_eq!(
            template_from_config(Some(&list), Path::new("x"))
                .unwrap()
                .as_deref(),
            Some("R")
        );
        assert!(template_from_config(Some(&json!(3)), Path::new("x")).is_err());
    }

    /// A folder holding the toy tokenizer.json and the given tokenizer_config.json.
    fn toy_folder(config: serde_json::Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let toy = crate::tokenizer::test_vocab::toy_tokenizer();
        toy.inner
            .save(dir.path().join("tokenizer.json"), false)
            .expect("save tokenizer.json");
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string())
            .expect("write config");
        dir
    }

    #[test]
    fn add_bos_token_in_the_config_rebuilds_the_post_processor() {
        let dir = toy_folder(
            json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": true}),
        );
        let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert!(tok.add_bos);
        assert_eq!(tok.encode("he", true).unwrap(), [1, 259]);
        assert_eq!(tok.encode("he", false).unwrap(), [259]);

        let dir = toy_folder(json!({"eos_token": "<|im_end|>", "add_eos_token": true}));
        let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert!(!tok.add_bos);
        assert_eq!(tok.encode("he", true).unwrap(), [259, 2]);
        assert_eq!(tok.eos_token_ids, [2]);
    }

    #[test]
    fn without_flags_tokenizer_json_decides() {
        let dir =
            toy_folder(json!({"bos_token": {"content": "<|im_start|>"}, "chat_template": "T"}));
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [2, 0]}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert!(!tok.add_bos);
        assert_eq!(tok.bos_token_id, Some(1));
        assert_eq!(tok.eos_token_ids, [2, 0]);
        assert_eq!(tok.chat_template.as_deref(), Some("T"));
        assert_eq!(tok.encode("he", true).unwrap(), [259]);
    }

    #[test]
    fn a_null_bos_token_is_not_replaced_by_generation_config() {
        let dir = toy_folder(json!({"bos_token": null, "eos_token": "<|im_end|>"}));
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"bos_token_id": 0, "eos_token_id": 0}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert_eq!(tok.bos_token_id, None);
        assert_eq!(tok.eos_token_ids, [2, 0]);

        let dir = toy_folder(json!({}));
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"bos_token_id": 1, "eos_token_id": 2}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert_eq!(
            (tok.bos_token_id, tok.eos_token_ids.as_slice()),
            (Some(1), &[2][..])
        );
    }

    #[test]
    fn malformed_json_names_the_file() {
        let dir = toy_folder(json!({}));
        std::fs::write(dir.path().join("generation_config.json"), "{oops").unwrap();
        let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("generation_config.json"), "{err}");
    }

    #[test]
    fn ids_accept_an_int_or_a_list() {
        assert_eq!(ids_of(Some(&json!(2))), [2]);
        assert_eq!(ids_of(Some(&json!([151645, 151643]))), [151645, 151643]);
        assert!(ids_of(None).is_empty());
        assert_eq!(
            token_content(Some(&json!({"content": "<s>", "lstrip": false}))),
            Some("<s>")
        );
    }
}
