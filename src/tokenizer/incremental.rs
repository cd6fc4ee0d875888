//! Streaming detokenization: one token id in, the newly completed text out.
//!
//! Decoding token by token and concatenating is wrong in two ways: a byte-level token can end in
//! the middle of a multi-byte UTF-8 character (the rest arrives with the next token), and some
//! decoders change a token's text depending on what precedes it (SentencePiece's leading space).
//! [`IncrementalDecoder`] therefore keeps a small window of ids and decodes
//! `window[prefix..]` against `window[prefix..read]` (the technique of HF `DecodeStream` / TGI):
//! the difference is new text only once it does not end in an incomplete character (`U+FFFD`).
//!
//! Invariants: `prefix <= read <= ids.len()`; the text emitted so far equals
//! `decode(all ids pushed)` up to the last complete character; a genuine `U+FFFD` (an invalid
//! byte sequence that will never complete) is released after [`MAX_PENDING`] further tokens so
//! the stream cannot stall.

use super::Tokenizer;

/// Prompt tokens kept as decoding context in front of the first generated token.
const PROMPT_CONTEXT: usize = 5;

/// Tokens that may stay pending while their text ends in `U+FFFD`. A UTF-8 character has at most
/// 4 bytes, so past this the replacement character is real, not an incomplete character.
const MAX_PENDING: usize = 4;

/// Per-sequence streaming detokenizer. Holds no reference to the tokenizer, so it can live inside
/// the engine's sequence state; pass the same [`Tokenizer`] to every call.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    /// The window of recent ids: `ids[..prefix]` were dropped from the window's text, `ids[prefix..read]`
    /// is already emitted context, `ids[read..]` is pending.
    ids: Vec<u32>,
    /// Start of the context used to decode the next text.
    prefix: usize,
    /// End of the text already emitted.
    read: usize,
    /// Whether special tokens (BOS, `<|im_end|>`, …) are left out of the text.
    skip_special: bool,
}

impl IncrementalDecoder {
    /// A decoder for a new sequence.
    pub fn new(skip_special: bool) -> Self {
        IncrementalDecoder {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            skip_special,
        }
    }

    /// A decoder for output that follows `prompt_ids`: the last few prompt tokens are decoding
    /// context, so the first generated token gets the text it has after the prompt (SentencePiece
    /// decoders drop a leading space at the very start of a text, not after a prompt).
    pub fn with_prompt(prompt_ids: &[u32], skip_special: bool) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDecoder {
            ids: context.to_vec(),
            prefix: 0,
            read: context.len(),
            skip_special,
        }
    }

    /// Feed one generated id; returns the text it completes (often empty mid-character).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.ids.push(id);
        let context = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special);
        let full = tokenizer.decode(&self.ids[self.prefix..], self.skip_special);
        let pending = self.ids.len() - self.read;
        let incomplete = full.ends_with('\u{FFFD}') && pending < MAX_PENDING;
        if full.len() <= context.len() || incomplete || !full.is_char_boundary(context.len()) {
            if !incomplete && full.len() <= context.len() {
                // Nothing visible (a skipped special token): keep the window short anyway.
                self.advance();
            }
            return String::new();
        }
        let new_text = full[context.len()..].to_owned();
        self.advance();
        new_text
    }

    /// Text still pending at the end of the stream (an incomplete character, printed as `U+FFFD`).
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> String {
        if self.read == self.ids.len() {
            return String::new();
        }
        let context = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special);
        let full = tokenizer.decode(&self.ids[self.prefix..], self.skip_special);
        self.advance();
        match full.get(context.len()..) {
            Some(rest) if full.starts_with(&context) => rest.to_owned(),
            _ => String::new(),
        }
    }

    /// Mark everything pushed as emitted and drop ids that no longer serve as context.
    fn advance(&mut self) {
        self.prefix = self.read;
        self.read = self.ids.len();
        if self.prefix > 0 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_vocab::{byte_id, toy_tokenizer};

    /// Push every id, collecting what each push returns, then flush.
    fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
        let mut dec = tok.incremental_decoder(skip_special);
        let mut out: Vec<String> = ids.iter().map(|&id| dec.push(tok, id)).collect();
        out.push(dec.flush(tok));
        out
    }

    #[test]
    fn multibyte_characters_are_emitted_once_complete() {
        let tok = toy_tokenizer();
        // "hé 🎉": h, é = C3 A9, space, 🎉 = F0 9F 8E 89 (one byte per token), then <|im_end|>.
        let mut ids = vec![byte_id(b'h'), byte_id(0xC3), byte_id(0xA9), byte_id(b' ')];
        ids.extend([0xF0, 0x9F, 0x8E, 0x89].map(byte_id));
        ids.push(2);
        let out = stream(&tok, &ids, true);
        assert_eq!(out, ["h", "", "é", " ", "", "", "", "🎉", "", ""]);
        assert_eq!(out.concat(), tok.decode(&ids, true));
    }

    #[test]
    fn special_tokens_show_unless_skipped() {
        let tok = toy_tokenizer();
        let ids = [1, 261, byte_id(b'o'), 2];
        assert_eq!(
            stream(&tok, &ids, false).concat(),
            "<|im_start|>hello<|im_end|>"
        );
        assert_eq!(stream(&tok, &ids, true).concat(), "hello");
    }

    #[test]
    fn invalid_bytes_do_not_stall_the_stream() {
        let tok = toy_tokenizer();
        // A lone continuation byte never completes: it is released after MAX_PENDING tokens.
        let ids = [byte_id(0xA9); 6];
        let out = stream(&tok, &ids, true);
        assert_eq!(out.concat(), tok.decode(&ids, true));
        assert!(
            out[..MAX_PENDING - 1].iter().all(String::is_empty),
            "{out:?}"
        );
        // An incomplete character at the very end comes out of `flush`.
        let out = stream(&tok, &[byte_id(b'x'), byte_id(0xE4)], true);
        assert_eq!(out, ["x", "", "\u{FFFD}"]);
    }

    #[test]
    fn prompt_context_is_not_emitted() {
        let tok = toy_tokenizer();
        let prompt = tok
            .encode("<|im_start|>user\nhello world<|im_end|>", false)
            .unwrap();
        let mut dec = IncrementalDecoder::with_prompt(&prompt, true);
        let out: String = [262, byte_id(b'!'), 2]
            .iter()
            .map(|&id| dec.push(&tok, id))
            .collect();
        assert_eq!(out, " w!");
    }

    #[test]
    fn long_streams_keep_a_short_window() {
        let tok = toy_tokenizer();
        let mut dec = IncrementalDecoder::new(true);
        let mut text = String::new();
        for i in 0..1000u32 {
            text.push_str(&dec.push(&tok, byte_id(b'a' + (i % 26) as u8)));
        }
        assert_eq!(text.len(), 1000);
        assert!(dec.ids.len() <= 2, "window grew to {}", dec.ids.len());
    }
}
