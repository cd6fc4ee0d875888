//! Helpers for the engine's tests (unit and integration); not part of the supported API.

use crate::tokenizer::Tokenizer;

/// A byte-level BPE tokenizer without merges: ids 0..256 are the bytes, 256 is `<eos>` (EOS).
pub fn byte_tokenizer() -> Tokenizer {
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
    Tokenizer {
        inner: json.to_string().parse().expect("valid tokenizer.json"),
        chat_template: None,
        bos_token_id: None,
        eos_token_ids: vec![256],
        add_bos: false,
    }
}
