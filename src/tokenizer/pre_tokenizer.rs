//! The pre-tokenizer named by a GGUF's `tokenizer.ggml.pre`, rebuilt as Hugging Face parts.
//!
//! A GGUF does not store a `tokenizer.json`; llama.cpp's converter hashes the original tokenizer's
//! output on a probe text and records a *name* (`smollm`, `qwen2`, `llama-bpe`, …), and
//! `src/llama-vocab.cpp` maps each name to a list of split regexes. We map the same names back to
//! the pre-tokenizer (and normalizer) of the original Hugging Face `tokenizer.json` of that family,
//! because Python `tokenizers` with that file is the reference we must match:
//!
//! | `tokenizer.ggml.pre`                 | normalizer | pre-tokenizer                                        |
//! |--------------------------------------|------------|------------------------------------------------------|
//! | absent, `default`, `gpt2`, `gpt-2`   | –          | `ByteLevel(use_regex)` (GPT-2's regex)               |
//! | `smollm`, `starcoder`                | –          | `Digits(individual)` then `ByteLevel(use_regex)`     |
//! | `qwen2`, `deepseek-r1-qwen`          | `NFC`      | `Split(Qwen2 regex, isolated)` then `ByteLevel`      |
//! | `qwen35`                             | `NFC`      | `Split(Qwen3.5 regex, isolated)` then `ByteLevel`    |
//! | `llama3`, `llama-v3`, `llama-bpe`    | –          | `Split(Llama 3 regex, isolated)` then `ByteLevel`    |
//!
//! Llama 3 also sets the BPE model's `ignore_merges` (a word that is a whole vocabulary entry is
//! not merged piecewise), as its `tokenizer.json` and llama.cpp both do. Any other name is an
//! [`ModelError::Unsupported`] naming it: guessing a regex would silently change token ids.

use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::ModelError;

/// Qwen2 / Qwen3 (`Qwen2Tokenizer`'s `PRETOKENIZE_REGEX`): one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5: like Qwen2, with combining marks (`\p{M}`) kept inside words.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3 (tiktoken's cl100k shape): digits in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The closed set of pre-tokenizers kiln rebuilds from `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's byte-level regex (the default when the key is absent).
    Gpt2,
    /// SmolLM / StarCoder: every digit its own piece, then GPT-2's regex.
    SmolLm,
    /// Qwen2 / Qwen3 regex, NFC-normalized input.
    Qwen2,
    /// Qwen3.5 regex, NFC-normalized input.
    Qwen35,
    /// Llama 3 regex, `ignore_merges`.
    Llama3,
}

impl PreTokenizerKind {
    /// Map a `tokenizer.ggml.pre` value (`None` when the key is absent) to a kind.
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, ModelError> {
        match name {
            None | Some("default" | "gpt2" | "gpt-2") => Ok(Self::Gpt2),
            Some("smollm" | "starcoder") => Ok(Self::SmolLm),
            Some("qwen2" | "deepseek-r1-qwen") => Ok(Self::Qwen2),
            Some("qwen35") => Ok(Self::Qwen35),
            Some("llama3" | "llama-v3" | "llama-bpe") => Ok(Self::Llama3),
            Some(other) => Err(ModelError::Unsupported(format!(
                "GGUF pre-tokenizer `tokenizer.ggml.pre = {other}` (supported: default, gpt2, smollm, \
                 starcoder, qwen2, deepseek-r1-qwen, qwen35, llama3, llama-v3, llama-bpe)"
            ))),
        }
    }

    /// The normalizer the original `tokenizer.json` of this family applies, if any.
    pub fn normalizer(self) -> Option<NormalizerWrapper> {
        match self {
            Self::Qwen2 | Self::Qwen35 => Some(NFC.into()),
            Self::Gpt2 | Self::SmolLm | Self::Llama3 => None,
        }
    }

    /// Whether the BPE model skips merging for words that are whole vocabulary entries.
    pub fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3)
    }

    /// The pre-tokenizer. `add_prefix_space` (GGUF `tokenizer.ggml.add_space_prefix`) only applies
    /// to the plain GPT-2 kind, as in transformers' GGUF conversion.
    pub fn pre_tokenizer(self, add_prefix_space: bool) -> Result<PreTokenizerWrapper, ModelError> {
        let split = |regex: &str| -> Result<PreTokenizerWrapper, ModelError> {
            let split = Split::new(
                SplitPattern::Regex(regex.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
            Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])))
        };
        match self {
            Self::Gpt2 => Ok(ByteLevel::new(add_prefix_space, true, true).into()),
            Self::SmolLm => Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ]))),
            Self::Qwen2 => split(QWEN2_SPLIT),
            Self::Qwen35 => split(QWEN35_SPLIT),
            Self::Llama3 => split(LLAMA3_SPLIT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// The byte-level pieces a kind splits `text` into.
    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let mut pre = PreTokenizedString::from(text);
        kind.pre_tokenizer(false)
            .unwrap()
            .pre_tokenize(&mut pre)
            .unwrap();
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_owned())
            .collect()
    }

    #[test]
    fn smollm_splits_every_digit() {
        assert_eq!(
            pieces(PreTokenizerKind::SmolLm, "x 1234"),
            ["x", "Ġ", "1", "2", "3", "4"]
        );
        assert_eq!(pieces(PreTokenizerKind::Gpt2, "x 1234"), ["x", "Ġ1234"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(
            pieces(PreTokenizerKind::Llama3, "1234567"),
            ["123", "456", "7"]
        );
        assert_eq!(pieces(PreTokenizerKind::Qwen2, "123"), ["1", "2", "3"]);
    }

    #[test]
    fn contractions_are_case_insensitive_in_llama3_only() {
        assert_eq!(pieces(PreTokenizerKind::Llama3, "I'M"), ["I", "'M"]);
        assert_eq!(pieces(PreTokenizerKind::Gpt2, "I'M"), ["I", "'", "M"]);
    }

    #[test]
    fn names_map_like_llama_cpp_and_unknown_names_are_refused() {
        assert_eq!(
            PreTokenizerKind::from_gguf_name(None).unwrap(),
            PreTokenizerKind::Gpt2
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("smollm")).unwrap(),
            PreTokenizerKind::SmolLm
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("llama-bpe")).unwrap(),
            PreTokenizerKind::Llama3
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("qwen2")).unwrap(),
            PreTokenizerKind::Qwen2
        );
        let err = PreTokenizerKind::from_gguf_name(Some("tekken")).unwrap_err();
        assert!(matches!(err, ModelError::Unsupported(_)));
        assert!(err.to_string().contains("tekken"), "{err}");
    }
}
