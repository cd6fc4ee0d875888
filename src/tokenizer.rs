//! Text ↔ token ids, and chat templates.
//!
//! Built either from a Hugging Face folder (`tokenizer.json`, `tokenizer_config.json` /
//! `chat_template.jinja`, `generation_config.json`) or from GGUF metadata (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`). Chat templates are rendered with minijinja (+ pycompat) and must
//! be byte-identical to transformers' `apply_chat_template`.
//!
//! (Skeleton: the constructors and template rendering are being written.)

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
