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
