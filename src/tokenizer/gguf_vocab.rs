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
//! Invariant: for every id `i < tokens.len()`, `inner.id_to_token(i) == tokens[i]`, so token ids
//! agree with the model's embedding rows.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PostProcessorWrapper};

use super::pre_tokenizer::PreTokenizerKind;
use super::Tokenizer;
use crate::error::ModelError;

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

        let mut vocab = Vocab::default();
        for (id, token) in self.tokens.iter().enumerate() {
            if vocab.insert(token.clone(), id as u32).is_some() {
                return Err(ModelError::Tokenizer(format!(
                    "GGUF `tokenizer.ggml.tokens` holds `{token}` twice (second time at id {id})"
                )));
            }
        }
        let merges = self
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
            kind.pre_tokenizer(self.add_space_prefix.unwrap_or(false))?,
        ));
        inner.with_decoder(Some(ByteLevel::default()));

        // Added tokens: their content is already in the model vocabulary, so they keep their ids.
        let added = |wanted: GgufTokenType, special: bool| -> Vec<AddedToken> {
            (0..self.tokens.len())
                .filter(|&id| self.token_type(id) == wanted)
                .map(|id| AddedToken::from(self.tokens[id].clone(), special).normalized(false))
                .collect()
        };
        inner.add_special_tokens(&added(GgufTokenType::Control, true));
        inner.add_tokens(&added(GgufTokenType::UserDefined, false));

        let add_bos = self
            .add_bos_token
            .unwrap_or(kind == PreTokenizerKind::Llama3);
        let add_eos = self.add_eos_token.unwrap_or(false);
        let bos = self.bos_token_id.filter(|_| add_bos);
        let eos = self.eos_token_id.filter(|_| add_eos);
        if add_bos && bos.is_none() {
            return Err(ModelError::Tokenizer(
                "GGUF asks for a BOS token (`add_bos_token`) but has no `tokenizer.ggml.bos_token_id`".into(),
            ));
        }
        inner.with_post_processor(Some(self.post_processor(bos, eos)?));

        let mut eos_token_ids = Vec::new();
        for id in [self.eos_token_id, self.eot_token_id, self.eom_token_id]
            .into_iter()
            .flatten()
        {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(Tokenizer {
            inner,
            chat_template: self.chat_template,
            bos_token_id: self.bos_token_id,
            eos_token_ids,
            add_bos,
        })
    }

    /// `TemplateProcessing` adding `bos`/`eos` around each sequence, or plain `ByteLevel` offsets.
    fn post_processor(
        &self,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<PostProcessorWrapper, ModelError> {
        if bos.is_none() && eos.is_none() {
            return Ok(ByteLevel::new(false, false, true).into());
        }
        let name = |id: u32| self.tokens[id as usize].clone();
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = Vec::new();
        if let Some(id) = bos {
            single.push(name(id));
            specials.push((name(id), id));
        }
        single.push("$A".to_owned());
        if let Some(id) = eos {
            single.push(name(id));
            if bos != Some(id) {
                specials.push((name(id), id));
            }
        }
        pair.extend(single.iter().cloned());
        pair.extend(single.iter().map(|p| {
            if p == "$A" {
                "$B:1".to_owned()
            } else {
                format!("{p}:1")
            }
        }));
        let processor = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| ModelError::Tokenizer(format!("BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("BOS/EOS template: {e}")))?;
        Ok(processor.into())
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn merge_split_starts_after_the_first_byte() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert_eq!(split_merge("  x").unwrap(), (" ".into(), "x".into()));
        assert!(split_merge("abc").is_err());
    }
}
