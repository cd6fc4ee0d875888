//! GPT-2's byte ↔ character alphabet used by byte-level BPE vocabularies.
//!
//! Byte-level BPE (GPT-2, SmolLM, Qwen, Llama 3) spells every token as a string over a
//! 256-character alphabet: each raw byte maps to one printable character (`' '` → `'Ġ'`,
//! `'\n'` → `'Ċ'`). The table is the one of GPT-2's `bytes_to_unicode()`: printable Latin-1
//! bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) map to themselves, and the remaining 68 bytes map,
//! in increasing byte order, to U+0100, U+0101, ….
//!
//! Invariant: [`byte_to_char`] and [`char_to_byte`] are inverse bijections between the 256 byte
//! values and the 256 alphabet characters.

use std::sync::OnceLock;

/// Whether byte `b` is one of the bytes that GPT-2 keeps as its own Latin-1 character.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `[byte] -> alphabet character`, built once.
fn table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next_extra = 0u32;
        for b in 0..=255u8 {
            table[b as usize] = if is_self_mapped(b) {
                char::from(b)
            } else {
                let c = char::from_u32(256 + next_extra).expect("U+0100..U+0143 are valid chars");
                next_extra += 1;
                c
            };
        }
        table
    })
}

/// The alphabet character that spells byte `b`.
pub fn byte_to_char(b: u8) -> char {
    table()[b as usize]
}

/// The byte a character of the alphabet stands for; `None` for characters outside it.
pub fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    match code {
        0..=255 if is_self_mapped(code as u8) => Some(code as u8),
        256..=323 => table().iter().position(|&t| t == c).map(|b| b as u8),
        _ => None,
    }
}

/// Whether every character of `token` belongs to the byte-level alphabet.
pub fn is_spelled_in_alphabet(token: &str) -> bool {
    token.chars().all(|c| char_to_byte(c).is_some())
}

/// The raw bytes a byte-level token stands for; `None` if it uses characters outside the alphabet.
pub fn token_to_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(char_to_byte).collect()
}

/// Spell raw bytes in the byte-level alphabet.
pub fn bytes_to_token(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_over_all_bytes() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate char {c:?}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn well_known_spellings_match_gpt2() {
        // From GPT-2's vocabulary: space is `Ġ` (U+0120), newline `Ċ` (U+010A), tab `ĉ` (U+0109).
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń'); // the soft hyphen is the last remapped byte
        assert_eq!(bytes_to_token(" hé".as_bytes()), "ĠhÃ©");
    }

    #[test]
    fn tokens_outside_the_alphabet_have_no_bytes() {
        assert_eq!(token_to_bytes("Ġhi"), Some(b" hi".to_vec()));
        assert_eq!(
            token_to_bytes("<|im_start|>"),
            Some(b"<|im_start|>".to_vec())
        );
        assert_eq!(token_to_bytes("你"), None);
        assert!(!is_spelled_in_alphabet("a b"));
    }
}
