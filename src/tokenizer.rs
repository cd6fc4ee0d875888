//! Text ↔ token ids, and chat templates.
//!
//! Built either from a Hugging Face folder ([`Tokenizer::from_hf_dir`]: `tokenizer.json`,
//! `tokenizer_config.json` / `chat_template.jinja`, `generation_config.json`) or from GGUF metadata
//! ([`Tokenizer::from_gguf`]: `tokenizer.ggml.*`, `tokenizer.chat_template`). Either way the
//! pipeline is a `tokenizers::Tokenizer`, so ids equal Python `tokenizers` with the original
//! `tokenizer.json`. Chat templates are rendered with minijinja (+ pycompat) and are byte-identical
//! to transformers' `apply_chat_template` ([`chat_template`] lists the rules).
//!
//! Parts: [`gguf_vocab`] (GGUF keys → BPE), [`pre_tokenizer`] (`tokenizer.ggml.pre` names),
//! [`byte_level`] (GPT-2's byte alphabet), [`chat_template`] + [`jinja_compat`] (templates),
//! [`incremental`] (streaming detokenization), `hf_dir` (HF folders).

pub mod byte_level;
pub mod chat_template;
pub mod gguf_vocab;
mod hf_dir;
pub mod incremental;
pub mod jinja_compat;
pub mod post_processor;
pub mod pre_tokenizer;
#[cfg(test)]
mod test_vocab;

pub use chat_template::{ChatMessage, ChatTemplate, SpecialTokenVars};
pub use gguf_vocab::{GgufTokenType, GgufVocab};
pub use incremental::IncrementalDecoder;
pub use pre_tokenizer::PreTokenizerKind;

use tokenizers::DecoderWrapper;

use crate::error::ModelError;

/// A tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    /// The HF tokenizer pipeline (normalizer, pre-tokenizer, model, decoder).
    pub inner: tokenizers::Tokenizer,
    /// Jinja chat template, if the model ships one.
    pub chat_template: Option<String>,
    /// Beginning-of-sequence token id.
    pub bos_token_id: Option<u32>,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether plain-text prompts get BOS prepended.
    pub add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Number of token ids, added tokens included (the largest id + 1 for contiguous vocabularies).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`. With `add_special_tokens`, the model's BOS/EOS are added as its
    /// tokenizer says (see [`Tokenizer::add_bos`]); special tokens written in the text, such as
    /// `<|im_start|>`, are always matched as single tokens (as in HF `tokenizers`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))
    }

    /// Text of `ids`; `skip_special` leaves out special tokens (BOS, `<|im_end|>`, …). Ids outside
    /// the vocabulary are skipped; bytes that do not form valid UTF-8 become `U+FFFD`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        match self.inner.decode(ids, skip_special) {
            Ok(text) => text,
            Err(e) => {
                // The decoders kiln builds cannot fail; a custom tokenizer.json's might.
                tracing::warn!(error = %e, n_ids = ids.len(), "Decoding failed; returning the raw token strings.");
                ids.iter()
                    .filter_map(|&id| self.inner.id_to_token(id))
                    .collect()
            }
        }
    }

    /// The text of one token, special tokens included (for logprobs). A byte-level token holding
    /// part of a UTF-8 character prints as `U+FFFD`; see [`Tokenizer::token_bytes`].
    pub fn token_text(&self, id: u32) -> String {
        self.decode(&[id], false)
    }

    /// The raw bytes one token stands for (OpenAI logprobs' `bytes`). For byte-level vocabularies
    /// these are the bytes before UTF-8 decoding, so partial characters are exact.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let byte_level = matches!(self.inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        match self.inner.id_to_token(id) {
            Some(token) if byte_level => {
                byte_level::token_to_bytes(&token).unwrap_or_else(|| token.into_bytes())
            }
            Some(_) => self.token_text(id).into_bytes(),
            None => Vec::new(),
        }
    }

    /// The BOS token's text, when the model has one.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_token_id.and_then(|id| self.inner.id_to_token(id))
    }

    /// The primary EOS token's text (`eos_token` in chat templates), when the model has one.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_token_ids
            .first()
            .and_then(|&id| self.inner.id_to_token(id))
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// A streaming detokenizer for one sequence.
    pub fn incremental_decoder(&self, skip_special: bool) -> IncrementalDecoder {
        IncrementalDecoder::new(skip_special)
    }

    /// Render `messages` with the model's chat template, as transformers'
    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=…, **kwargs)` does.
    ///
    /// A model without a chat template is an error (no fallback format is invented, matching
    /// transformers); so are a template that raises (`raise_exception`) and `kwargs` naming a fixed
    /// argument. All of these are the request's fault: callers report them as `invalid_input`.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        let source = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::Tokenizer(
                "the model has no chat template; send a plain text prompt instead of chat messages"
                    .into(),
            )
        })?;
        let special = SpecialTokenVars {
            bos_token: self.bos_token(),
            eos_token: self.eos_token(),
        };
        ChatTemplate::cached(source)?.render(messages, add_generation_prompt, &special, kwargs)
    }

    /// Token ids of the rendered chat, encoded with `add_special_tokens = false` as transformers
    /// does for `apply_chat_template(..., tokenize=True)` (the template writes any BOS itself).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Vec<u32>, ModelError> {
        let text = self.render_chat(messages, add_generation_prompt, kwargs)?;
        self.encode(&text, false)
    }
}

#[cfg(test)]
mod tests {
    use super::test_vocab::{byte_id, toy_tokenizer};
    use super::*;

    fn user(content: &str) -> ChatMessage {
        ChatMessage {
            role: "user".into(),
            content: content.into(),
        }
    }

    #[test]
    fn encode_merges_and_round_trips() {
        let tok = toy_tokenizer();
        let ids = tok.encode("hello world", false).unwrap();
        // "hello" → "hell" + "o"; " world" → "Ġw" + o r l d.
        assert_eq!(
            ids,
            [
                261,
                byte_id(b'o'),
                262,
                byte_id(b'o'),
                byte_id(b'r'),
                byte_id(b'l'),
                byte_id(b'd')
            ]
        );
        assert_eq!(tok.decode(&ids, false), "hello world");
        assert_eq!(tok.vocab_size(), 263);
    }

    #[test]
    fn token_text_and_bytes_of_partial_characters() {
        let tok = toy_tokenizer();
        // "é" is C3 A9: each half alone is not valid UTF-8.
        assert_eq!(tok.token_text(byte_id(0xC3)), "\u{FFFD}");
        assert_eq!(tok.token_bytes(byte_id(0xC3)), [0xC3]);
        assert_eq!(tok.token_bytes(262), b" w");
        assert_eq!(tok.token_text(2), "<|im_end|>");
        assert_eq!(tok.token_bytes(2), b"<|im_end|>");
        assert!(tok.token_bytes(100_000).is_empty());
    }

    #[test]
    fn special_tokens_and_eos() {
        let tok = toy_tokenizer();
        assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
        assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
        assert!(tok.is_eos(2) && !tok.is_eos(0));
        assert_eq!(tok.encode("<|im_start|>", true).unwrap(), [1]);
        assert_eq!(tok.decode(&[1, 261, 2], true), "hell");
    }

    #[test]
    fn chat_is_rendered_then_encoded_without_added_specials() {
        let tok = toy_tokenizer();
        let kwargs = serde_json::Map::new();
        let text = tok.render_chat(&[user("he")], true, &kwargs).unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nhe<|im_end|>\n<|im_start|>assistant\n"
        );
        let ids = tok.encode_chat(&[user("he")], true, &kwargs).unwrap();
        assert_eq!(ids, tok.encode(&text, false).unwrap());
        assert_eq!(ids[0], 1);
    }

    #[test]
    fn a_model_without_template_refuses_chat() {
        let mut tok = toy_tokenizer();
        tok.chat_template = None;
        let err = tok
            .render_chat(&[user("x")], true, &serde_json::Map::new())
            .unwrap_err();
        assert!(err.to_string().contains("no chat template"), "{err}");
    }
}
