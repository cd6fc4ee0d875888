//! Incremental detokenization of a sequence's generated tokens.
//!
//! Decoding token by token is wrong for byte-level BPE (one character can span several tokens)
//! and for SentencePiece (a token's leading space depends on what precedes it). As vLLM does, we
//! decode a short window twice, `ids[prefix..read]` and `ids[prefix..]`, and emit the difference
//! once it no longer ends in U+FFFD (an incomplete UTF-8 sequence). The window starts with a few
//! prompt tokens so the first generated token is decoded in context. Special tokens are skipped
//! (the returned text never contains `<|im_end|>` and friends).

use crate::error::EngineError;

/// Prompt tokens decoded as context in front of the first generated token.
const PROMPT_CONTEXT: usize = 5;

/// Window offsets over `context ++ output` token ids.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    /// The last few prompt tokens, then every generated token pushed so far.
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix_offset: usize,
    /// End of the text already emitted.
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// A detokenizer for output that follows `prompt_ids`.
    pub fn new(prompt_ids: &[u32]) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDetokenizer {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Add one generated token; returns the text it completes (possibly empty while a
    /// multi-byte character is still incomplete).
    pub fn push(&mut self, tok: &tokenizers::Tokenizer, id: u32) -> Result<String, EngineError> {
        self.ids.push(id);
        let prefix = decode(tok, &self.ids[self.prefix_offset..self.read_offset])?;
        let full = decode(tok, &self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            // The window's prefix decodes the same with or without the new tokens in all
            // tokenizers we support; guard anyway rather than slice mid-character.
            let delta = full.get(prefix.len()..).unwrap_or_default().to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Text of tokens pushed but not emitted yet (an incomplete character at the end of
    /// generation), decoded lossily.
    pub fn flush(&mut self, tok: &tokenizers::Tokenizer) -> Result<String, EngineError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = decode(tok, &self.ids[self.prefix_offset..self.read_offset])?;
        let full = decode(tok, &self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

/// Decode ids, skipping special tokens.
fn decode(tok: &tokenizers::Tokenizer, ids: &[u32]) -> Result<String, EngineError> {
    tok.decode(ids, true)
        .map_err(|e| EngineError::Internal(format!("detokenizer: {e}")))
}

/// The text of one token as shown in logprobs (lossy when the token is part of a character).
pub fn token_text(tok: &tokenizers::Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// A small byte-level BPE tokenizer for tests: ids 0..256 are the bytes, 256 is `<eos>`.
#[cfg(test)]
pub(crate) fn byte_tokenizer() -> tokenizers::Tokenizer {
    // GPT-2's byte → printable char map (the alphabet ByteLevel uses).
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = bytes.clone();
    let mut n = 0;
    for b in 0..=255u32 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = bytes
        .iter()
        .zip(&chars)
        .map(|(&b, &c)| (char::from_u32(c).expect("valid").to_string(), b.into()))
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "normalizer": null, "post_processor": null,
        "added_tokens": [{"id": 256, "content": "<eos>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "pre_tokenizer": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []},
    });
    json.to_string().parse().expect("valid tokenizer.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_tokenizer_maps_bytes_to_ids() {
        let t = byte_tokenizer();
        let ids = t.encode("hé", false).expect("enc").get_ids().to_vec();
        assert_eq!(ids, vec![b'h' as u32, 0xC3, 0xA9]);
        assert_eq!(t.token_to_id("<eos>"), Some(256));
    }

    #[test]
    fn multibyte_characters_are_held_until_complete() {
        let t = byte_tokenizer();
        let mut d = IncrementalDetokenizer::new(&[b'a' as u32]);
        assert_eq!(d.push(&t, b'x' as u32).expect("ok"), "x");
        // "é" = C3 A9: nothing after the first byte, the whole character after the second.
        assert_eq!(d.push(&t, 0xC3).expect("ok"), "");
        assert_eq!(d.push(&t, 0xA9).expect("ok"), "é");
        // A special token decodes to nothing.
        assert_eq!(d.push(&t, 256).expect("ok"), "");
        assert_eq!(d.push(&t, b'!' as u32).expect("ok"), "!");
    }

    #[test]
    fn flush_returns_an_incomplete_tail_lossily() {
        let t = byte_tokenizer();
        let mut d = IncrementalDetokenizer::new(&[]);
        assert_eq!(d.push(&t, b'o' as u32).expect("ok"), "o");
        assert_eq!(d.push(&t, 0xE2).expect("ok"), "");
        assert_eq!(d.flush(&t).expect("ok"), "\u{FFFD}");
        assert_eq!(d.flush(&t).expect("ok"), "");
    }
}
