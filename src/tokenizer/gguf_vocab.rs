//! A GGUF's `tokenizer.ggml.*` vocabulary, and the Hugging Face tokenizer rebuilt from it.
//!
//! llama.cpp's converter stores the tokenizer as metadata: the token strings (in id order), the BPE
//! merges (`"left right"`, best first), a type per token, the pre-tokenizer's *name* and the special
//! ids. [`GgufVocab`] holds exactly those keys, and [`GgufVocab::into_tokenizer`] builds the
//! `tokenizers::Tokenizer` that the original `tokenizer.json` describes:
//!
//! - `tokenizer.ggml.model = gpt2`: byte-level BPE (vocabulary spelled in GPT-2's byte alphabet,
//!   `ByteLevel` decoder). `llama` (SentencePiece) and other models are refused as `Unsupported`.
//! - every token keeps its stored spelling at its stored id; `CONTROL` tokens become *special*
//!   added tokens and `USER_DEFINED` ones plain added tokens, both matched whole in the input text
//!   before BPE (as llama.cpp and `tokenizer.json`'s `added_tokens` do);
//! - the pre-tokenizer and normalizer come from [`PreTokenizerKind`];
//! - BOS / EOS are prepended / appended only with `add_special_tokens` and only when
//!   `tokenizer.ggml.add_bos_token` / `add_eos_token` say so (absent = false for BPE vocabularies,
//!   except the Llama 3 family, whose llama.cpp default is true).
//!
//! Invariant: for every id `i < tokens.len()`, `inner.id_to_token(i) == tokens[i]` (an empty
//! stored token reads `[EMPTY_<i>]`, as in llama.cpp), so token ids agree with the model's
//! embedding rows.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use super::post_processor::bos_eos_template;
use super::pre_tokenizer::PreTokenizerKind;
use super::Tokenizer;
use crate::error::ModelError;
use crate::model::gguf::GgufMetadata;

/// llama.cpp's per-token type (`tokenizer.ggml.token_type`, `enum llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufTokenType {
    /// 0: no type recorded.
    Undefined,
    /// 1: an ordinary vocabulary entry.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control (special) token such as `<|im_start|>`.
    Control,
    /// 4: an added, non-special token such as `<think>`.
    UserDefined,
    /// 5: a reserved, unused slot.
    Unused,
    /// 6: a SentencePiece byte-fallback token `<0xNN>`.
    Byte,
}

impl GgufTokenType {
    /// The type for a stored integer; out-of-range values are `Undefined`, as in llama.cpp.
    pub fn from_i32(value: i32) -> Self {
        match value {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// The tokenizer-related GGUF metadata, one field per key (`tokenizer.ggml.<field>`).
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), …
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name; `None` when absent.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token strings, index = token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one per token, or empty when absent.
    pub token_types: Vec<GgufTokenType>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn); also ends generation.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message); also ends generation.
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Read the `tokenizer.*` keys. `tokenizer.ggml.model` and `tokenizer.ggml.tokens` are required;
    /// a key of the wrong type is a `Format` error naming it.
    pub fn from_metadata(meta: &GgufMetadata) -> Result<GgufVocab, ModelError> {
        let token_types = meta
            .get_i32_array("tokenizer.ggml.token_type")?
            .unwrap_or_default()
            .into_iter()
            .map(GgufTokenType::from_i32)
            .collect();
        Ok(GgufVocab {
            model: meta.require_str("tokenizer.ggml.model")?.to_owned(),
            pre: meta.get_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens: meta.require_str_array("tokenizer.ggml.tokens")?.to_vec(),
            token_types,
            merges: meta
                .get_str_array("tokenizer.ggml.merges")?
                .unwrap_or_default()
                .to_vec(),
            bos_token_id: meta.get_u32("tokenizer.ggml.bos_token_id")?,
            eos_token_id: meta.get_u32("tokenizer.ggml.eos_token_id")?,
            eot_token_id: meta.get_u32("tokenizer.ggml.eot_token_id")?,
            eom_token_id: meta.get_u32("tokenizer.ggml.eom_token_id")?,
            add_bos_token: meta.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos_token: meta.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: meta.get_bool("tokenizer.ggml.add_space_prefix")?,
            chat_template: meta.get_str("tokenizer.chat_template")?.map(str::to_owned),
        })
    }

    /// The type of token `id` (`Normal` when the file records no types).
    fn token_type(&self, id: usize) -> GgufTokenType {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(GgufTokenType::Normal)
    }

    /// Check ids and lengths; every failure names the key.
    fn validate(&self) -> Result<(), ModelError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(ModelError::Tokenizer(
                "GGUF `tokenizer.ggml.tokens` is empty".into(),
            ));
        }
        if !self.token_types.is_empty() && self.token_types.len() != n {
            return Err(ModelError::Tokenizer(format!(
                "GGUF `tokenizer.ggml.token_type` has {} entries for {n} tokens",
                self.token_types.len()
            )));
        }
        for (key, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("eot_token_id", self.eot_token_id),
            ("eom_token_id", self.eom_token_id),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(ModelError::Tokenizer(format!(
                    "GGUF `tokenizer.ggml.{key}` = {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        Ok(())
    }

    /// Build the tokenizer. See the module docs for the mapping.
    pub fn into_tokenizer(self) -> Result<Tokenizer, ModelError> {
        self.validate()?;
        if self.model != "gpt2" {
            return Err(ModelError::Unsupported(format!(
                "GGUF tokenizer model `tokenizer.ggml.model = {}` (only `gpt2`, byte-level BPE, is supported)",
                self.model
            )));
        }
        let kind = PreTokenizerKind::from_gguf_name(self.pre.as_deref())?;

        // llama.cpp renames empty tokens `[EMPTY_<id>]` so that every id keeps a distinct string.
        let mut this = self;
        for (id, token) in this.tokens.iter_mut().enumerate() {
            if token.is_empty() {
                *token = format!("[EMPTY_{id}]");
            }
        }
        let mut vocab = Vocab::default();
        for (id, token) in this.tokens.iter().enumerate() {
            if vocab.insert(token.clone(), id as u32).is_some() {
                return Err(ModelError::Tokenizer(format!(
                    "GGUF `tokenizer.ggml.tokens` holds `{token}` twice (second time at id {id})"
                )));
            }
        }
        let merges = this
            .merges
            .iter()
            .map(|m| split_merge(m))
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(kind.ignore_merges())
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("GGUF BPE vocabulary: {e}")))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_normalizer(kind.normalizer());
        inner.with_pre_tokenizer(Some(
            kind.pre_tokenizer(this.add_space_prefix.unwrap_or(false))?,
        ));
        inner.with_decoder(Some(ByteLevel::default()));

        // Added tokens: their content is already in the model vocabulary, so they keep their ids.
        let added = |wanted: GgufTokenType, special: bool| -> Vec<AddedToken> {
            (0..this.tokens.len())
                .filter(|&id| this.token_type(id) == wanted)
                .map(|id| AddedToken::from(this.tokens[id].clone(), special).normalized(false))
                .collect()
        };
        inner.add_special_tokens(&added(GgufTokenType::Control, true));
        inner.add_tokens(&added(GgufTokenType::UserDefined, false));

        // As transformers' `update_post_processor`: a flag without its token is dropped.
        let add_bos = this
            .add_bos_token
            .unwrap_or(kind == PreTokenizerKind::Llama3)
            && this.bos_token_id.is_some();
        let add_eos = this.add_eos_token.unwrap_or(false) && this.eos_token_id.is_some();
        let bos = this.bos_token_id.filter(|_| add_bos);
        let eos = this.eos_token_id.filter(|_| add_eos);
        let named = |id: Option<u32>| id.map(|id| (this.tokens[id as usize].as_str(), id));
        inner.with_post_processor(Some(bos_eos_template(named(bos), named(eos))?));

        let mut eos_token_ids = Vec::new();
        for id in [this.eos_token_id, this.eot_token_id, this.eom_token_id]
            .into_iter()
            .flatten()
        {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Tokenizer {
            inner,
            chat_template: this.chat_template,
            bos_token_id: this.bos_token_id,
            eos_token_ids,
            add_bos,
        })
    }
}

/// Split a stored merge `"left right"` at its separating space. Like llama.cpp, the search starts
/// at the second byte, so a left part that is itself a space still parses.
fn split_merge(merge: &str) -> Result<(String, String), ModelError> {
    merge
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(i, _)| (merge[..i].to_owned(), merge[i + 1..].to_owned()))
        .ok_or_else(|| {
            ModelError::Tokenizer(format!("GGUF merge `{merge}` has no separating space"))
        })
}

impl Tokenizer {
    /// Build the tokenizer a GGUF file describes (see [`GgufVocab`] for the rules).
    pub fn from_gguf(meta: &GgufMetadata) -> Result<Tokenizer, ModelError> {
        let started = std::time::Instant::now();
        let vocab = GgufVocab::from_metadata(meta)?;
        let pre = vocab.pre.clone();
        let tokenizer = vocab.into_tokenizer().map_err(|e| match e {
            ModelError::Tokenizer(m) => {
                ModelError::Tokenizer(format!("{}: {m}", meta.path().display()))
            }
            other => other,
        })?;
        tracing::debug!(
            path = %meta.path().display(),
            pre = pre.as_deref().unwrap_or("default"),
            vocab = tokenizer.vocab_size(),
            bos_token_id = ?tokenizer.bos_token_id,
            eos_token_ids = ?tokenizer.eos_token_ids,
            add_bos = tokenizer.add_bos,
            has_chat_template = tokenizer.chat_template.is_some(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Built the tokenizer from GGUF metadata."
        );
        Ok(tokenizer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::{GgufArray, GgufValue};

    /// A byte-level vocabulary over `a`, `b`, ` ` with merges `a b`, `Ġ ab`, and two specials.
    fn toy() -> GgufVocab {
        let tokens = [
            "<|endoftext|>",
            "<|im_start|>",
            "a",
            "b",
            "Ġ",
            "ab",
            "Ġab",
            "1",
            "<think>",
        ];
        let mut token_types = vec![GgufTokenType::Normal; tokens.len()];
        token_types[0] = GgufTokenType::Control;
        token_types[1] = GgufTokenType::Control;
        token_types[8] = GgufTokenType::UserDefined;
        GgufVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            token_types,
            merges: vec!["a b".into(), "Ġ ab".into()],
            bos_token_id: Some(1),
            eos_token_id: Some(0),
            ..Default::default()
        }
    }

    #[test]
    fn merges_apply_in_rank_order_and_specials_match_whole() {
        let tok = toy().into_tokenizer().unwrap();
        assert_eq!(tok.encode("ab ab", true).unwrap(), [5, 6]);
        assert_eq!(
            tok.encode("<|im_start|>ab<think>b", true).unwrap(),
            [1, 5, 8, 3]
        );
        assert!(!tok.add_bos);
        assert_eq!(tok.eos_token_ids, [0]);
        assert_eq!(tok.inner.id_to_token(6).as_deref(), Some("Ġab"));
    }

    #[test]
    fn add_bos_token_prepends_only_with_special_tokens() {
        let mut vocab = toy();
        vocab.add_bos_token = Some(true);
        let tok = vocab.into_tokenizer().unwrap();
        assert!(tok.add_bos);
        assert_eq!(tok.encode("ab", true).unwrap(), [1, 5]);
        assert_eq!(tok.encode("ab", false).unwrap(), [5]);
    }

    #[test]
    fn decoding_skips_only_control_tokens() {
        let tok = toy().into_tokenizer().unwrap();
        assert_eq!(tok.decode(&[1, 5, 8, 6], true), "ab<think> ab");
        assert_eq!(tok.decode(&[1, 5, 8, 6], false), "<|im_start|>ab<think> ab");
    }

    #[test]
    fn bad_metadata_is_a_clear_error() {
        let mut v = toy();
        v.model = "llama".into();
        assert!(
            matches!(v.into_tokenizer(), Err(ModelError::Unsupported(m)) if m.contains("llama"))
        );
        let mut v = toy();
        v.pre = Some("jais".into());
        assert!(
            matches!(v.into_tokenizer(), Err(ModelError::Unsupported(m)) if m.contains("jais"))
        );
        let mut v = toy();
        v.eos_token_id = Some(99);
        assert!(v
            .into_tokenizer()
            .unwrap_err()
            .to_string()
            .contains("eos_token_id"));
        let mut v = toy();
        v.merges.push("a zz".into());
        assert!(v.into_tokenizer().is_err());
        let mut v = toy();
        v.tokens[3] = "a".into();
        assert!(v
            .into_tokenizer()
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    #[test]
    fn metadata_keys_are_read_with_their_gguf_names() {
        let v = toy();
        let mut meta = GgufMetadata::new("toy.gguf");
        meta.insert("tokenizer.ggml.model", GgufValue::String("gpt2".into()));
        meta.insert("tokenizer.ggml.pre", GgufValue::String("smollm".into()));
        meta.insert(
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::String(v.tokens.clone())),
        );
        meta.insert(
            "tokenizer.ggml.merges",
            GgufValue::Array(GgufArray::String(v.merges.clone())),
        );
        let types = v
            .token_types
            .iter()
            .map(|t| if *t == GgufTokenType::Control { 3 } else { 1 })
            .collect();
        meta.insert(
            "tokenizer.ggml.token_type",
            GgufValue::Array(GgufArray::I32(types)),
        );
        meta.insert("tokenizer.ggml.bos_token_id", GgufValue::U32(1));
        meta.insert("tokenizer.ggml.eos_token_id", GgufValue::U32(0));
        meta.insert("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
        meta.insert(
            "tokenizer.chat_template",
            GgufValue::String("{{ bos_token }}".into()),
        );
        let tok = Tokenizer::from_gguf(&meta).unwrap();
        assert_eq!(tok.encode("ab", true).unwrap(), [1, 5]);
        assert_eq!(tok.chat_template.as_deref(), Some("{{ bos_token }}"));
        assert_eq!(
            (tok.bos_token_id, tok.eos_token_ids.as_slice()),
            (Some(1), &[0][..])
        );

        meta.insert(
            "tokenizer.ggml.bos_token_id",
            GgufValue::String("one".into()),
        );
        let err = Tokenizer::from_gguf(&meta).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.bos_token_id"),
            "{err}"
        );
    }

    #[test]
    fn qwen2_normalizes_to_nfc_and_smollm_does_not() {
        use crate::tokenizer::test_vocab::{byte_id, toy_vocab};
        let composed = [byte_id(0xC3), byte_id(0xA9)]; // "é" = C3 A9
        let decomposed = [byte_id(b'e'), byte_id(0xCC), byte_id(0x81)]; // "e" + U+0301 = CC 81
        let mut v = toy_vocab();
        v.pre = Some("qwen2".into());
        let qwen = v.into_tokenizer().unwrap();
        assert_eq!(qwen.encode("e\u{301}", false).unwrap(), composed);
        let smol = toy_vocab().into_tokenizer().unwrap();
        assert_eq!(smol.encode("e\u{301}", false).unwrap(), decomposed);
    }

    #[test]
    fn a_flag_without_its_token_adds_nothing() {
        let mut v = toy();
        v.add_bos_token = Some(true);
        v.bos_token_id = None;
        let tok = v.into_tokenizer().unwrap();
        assert!(!tok.add_bos);
        assert_eq!(tok.encode("ab", true).unwrap(), [5]);
    }

    #[test]
    fn llama3_adds_bos_by_default_and_ignores_merges_for_whole_words() {
        // "ba" is a vocabulary entry no merge produces: only `ignore_merges` finds it whole.
        let mut v = toy();
        v.tokens.push("ba".into());
        v.token_types.push(GgufTokenType::Normal);
        let smollm = v.clone().into_tokenizer().unwrap();
        assert_eq!(smollm.encode("ba", true).unwrap(), [3, 2]);
        v.pre = Some("llama-bpe".into());
        let llama3 = v.into_tokenizer().unwrap();
        assert!(llama3.add_bos);
        assert_eq!(llama3.encode("ba", true).unwrap(), [1, 9]);
        assert_eq!(llama3.encode("ab", false).unwrap(), [5]);
    }

    #[test]
    fn merge_split_starts_after_the_first_byte() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert_eq!(split_merge("  x").unwrap(), (" ".into(), "x".into()));
        assert!(split_merge("abc").is_err());
    }
}
