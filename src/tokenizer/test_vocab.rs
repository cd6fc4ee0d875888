//! A small but complete byte-level vocabulary for unit tests (no model file needed).
//!
//! Ids: 0 `<|endoftext|>` and 1 `<|im_start|>` and 2 `<|im_end|>` (control), 3..259 the 256
//! single bytes in byte order (id = 3 + byte), then merges `h e`, `l l`, `he ll`, `Ġ w`.
//! Pre-tokenizer `smollm`, no BOS added, EOS = `<|im_end|>`.

use super::byte_level::bytes_to_token;
use super::gguf_vocab::{GgufTokenType, GgufVocab};
use super::Tokenizer;

/// Id of the single-byte token for `b`.
pub fn byte_id(b: u8) -> u32 {
    3 + u32::from(b)
}

/// The toy vocabulary's metadata.
pub fn toy_vocab() -> GgufVocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![GgufTokenType::Control; 3];
    for b in 0..=255u8 {
        tokens.push(bytes_to_token(&[b]));
        token_types.push(GgufTokenType::Normal);
    }
    for merged in ["he", "ll", "hell", "Ġw"] {
        tokens.push(merged.into());
        token_types.push(GgufTokenType::Normal);
    }
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: ["h e", "l l", "he ll", "Ġ w"].map(String::from).to_vec(),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        add_bos_token: Some(false),
        chat_template: Some(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
             {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
                .into(),
        ),
        ..Default::default()
    }
}

/// The toy tokenizer.
pub fn toy_tokenizer() -> Tokenizer {
    toy_vocab()
        .into_tokenizer()
        .expect("the toy vocabulary is valid")
}
