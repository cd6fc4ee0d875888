//! Tokenizer and chat template of the real default model against Python references.
//!
//! Reference: `tests/golden/tokenizer_smollm2.json`, generated with `scripts/gen-golden.py` from
//! Python `tokenizers` / transformers' `apply_chat_template` (its `source` and `tokenizer` fields
//! say exactly which tokenizer). Every case's ids and every chat render must match byte for byte.
//!
//! Needs the model: `models/SmolLM2-135M-Instruct.Q4_1.gguf` or `$KILN_TEST_MODEL`
//! (`kiln model fetch-default` puts it there). The test FAILS without it, on purpose.
//! Run: `cargo test --test tokenizer`.

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use kiln::engine::request::ChatMessage;
use kiln::model::gguf::GgufMetadata;
use kiln::tokenizer::{ChatTemplate, GgufVocab, SpecialTokenVars, Tokenizer};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Golden {
    source: String,
    cases: Vec<Case>,
    chat: Vec<Chat>,
}

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    add_special_tokens: bool,
    ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids: Vec<u32>,
}

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The default model, from `$KILN_TEST_MODEL` or `models/`.
fn model_path() -> Result<PathBuf> {
    let path = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    ensure!(
        path.is_file(),
        "{} is missing: run `kiln model fetch-default` or set KILN_TEST_MODEL",
        path.display()
    );
    Ok(path)
}

fn golden() -> Result<Golden> {
    let path = crate_root().join("tests/golden/tokenizer_smollm2.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn smollm2() -> Result<Tokenizer> {
    let meta = GgufMetadata::read(&model_path()?)?;
    Ok(Tokenizer::from_gguf(&meta)?)
}

fn no_kwargs() -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::new()
}

/// Compare every fixture case and chat with `tok`; returns the mismatches.
fn mismatches(tok: &Tokenizer, golden: &Golden) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    for case in &golden.cases {
        let ids = tok.encode(&case.text, case.add_special_tokens)?;
        if ids != case.ids {
            bad.push(format!(
                "encode({:?}, add_special_tokens={}) = {ids:?}, reference {:?}",
                case.text, case.add_special_tokens, case.ids
            ));
        }
    }
    for chat in &golden.chat {
        let rendered = tok.render_chat(&chat.messages, chat.add_generation_prompt, &no_kwargs())?;
        if rendered != chat.rendered {
            bad.push(format!(
                "render_chat: {rendered:?}\n  reference {:?}",
                chat.rendered
            ));
        }
        let ids = tok.encode_chat(&chat.messages, chat.add_generation_prompt, &no_kwargs())?;
        if ids != chat.ids {
            bad.push(format!("encode_chat: {ids:?}\n  reference {:?}", chat.ids));
        }
    }
    Ok(bad)
}

#[test]
fn gguf_tokenizer_matches_python_tokenizers_and_transformers_templates() -> Result<()> {
    let golden = golden()?;
    ensure!(
        golden.cases.len() >= 30,
        "the fixture should hold ≥ 30 cases"
    );
    ensure!(
        !golden.chat.is_empty(),
        "the fixture should hold chat renders"
    );
    let tok = smollm2()?;
    let bad = mismatches(&tok, &golden)?;
    ensure!(
        bad.is_empty(),
        "{} mismatches vs {}:\n{}",
        bad.len(),
        golden.source,
        bad.join("\n")
    );
    Ok(())
}

#[test]
fn gguf_special_tokens_follow_the_metadata() -> Result<()> {
    // SmolLM2-135M-Instruct's GGUF: bos_token_id 1 (<|im_start|>), eos_token_id 2 (<|im_end|>),
    // add_bos_token false, 49152 tokens of which 17 CONTROL (ids 0..=16).
    let tok = smollm2()?;
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_token_id, Some(1));
    assert_eq!(tok.eos_token_ids, [2]);
    assert!(!tok.add_bos);
    assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    assert!(tok
        .chat_template
        .as_deref()
        .is_some_and(|t| t.contains("<|im_start|>")));
    assert_eq!(tok.encode("<|im_start|><empty_output>", false)?, [1, 16]);
    assert_eq!(tok.decode(&[1, 19556, 2], true), "Hello");
    assert_eq!(
        tok.decode(&[1, 19556, 2], false),
        "<|im_start|>Hello<|im_end|>"
    );
    Ok(())
}

#[test]
fn decode_round_trips_and_streams_like_a_whole_decode() -> Result<()> {
    let golden = golden()?;
    let tok = smollm2()?;
    for case in golden.cases.iter().filter(|c| !c.add_special_tokens) {
        // Bytes whose symbol is not in the vocabulary are dropped by BPE (see the fixture's
        // `tokenizer` note), so only texts made of known bytes round-trip.
        let representable = case.text.bytes().all(|b| {
            tok.inner
                .token_to_id(&kiln::tokenizer::byte_level::bytes_to_token(&[b]))
                .is_some()
        });
        let whole = tok.decode(&case.ids, false);
        if representable {
            assert_eq!(whole, case.text, "decode(encode(text)) for {:?}", case.text);
        }
        let mut stream = tok.incremental_decoder(false);
        let mut pieces: String = case.ids.iter().map(|&id| stream.push(&tok, id)).collect();
        pieces.push_str(&stream.flush(&tok));
        assert_eq!(pieces, whole, "streamed decode of {:?}", case.text);
    }
    Ok(())
}

#[test]
fn token_bytes_concatenate_to_the_utf8_text() -> Result<()> {
    let tok = smollm2()?;
    let text = "Résumé 你好 🙂 ½";
    let ids = tok.encode(text, false)?;
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
    assert_eq!(bytes, text.as_bytes());
    // "🙂" spans several byte-level tokens: one of them alone is not valid UTF-8.
    assert!(ids
        .iter()
        .any(|&id| tok.token_text(id).contains('\u{FFFD}')));
    Ok(())
}

#[test]
fn hf_folder_with_the_same_tokenizer_gives_the_same_ids() -> Result<()> {
    // Write the GGUF-built pipeline as a Hugging Face folder and load it back through
    // `from_hf_dir`: tokenizer.json + tokenizer_config.json (template as a named list, special
    // tokens as objects) + generation_config.json (eos as a list).
    let golden = golden()?;
    let gguf = smollm2()?;
    let dir = tempfile::tempdir()?;
    gguf.inner
        .save(dir.path().join("tokenizer.json"), false)
        .map_err(anyhow::Error::msg)?;
    let config = serde_json::json!({
        "bos_token": {"content": "<|im_start|>", "special": true},
        "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": gguf.chat_template}],
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string())?;
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )?;

    let hf = Tokenizer::from_hf_dir(dir.path())?;
    assert_eq!(hf.bos_token_id, Some(1));
    assert_eq!(hf.eos_token_ids, [2, 0]);
    assert!(!hf.add_bos);
    let bad = mismatches(&hf, &golden)?;
    ensure!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );

    // chat_template.jinja wins over tokenizer_config.json, as in transformers.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ messages[0].content }}!",
    )?;
    let hf = Tokenizer::from_hf_dir(dir.path())?;
    let msgs = [ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    }];
    assert_eq!(hf.render_chat(&msgs, false, &no_kwargs())?, "hi!");
    Ok(())
}

#[test]
fn hf_folder_without_tokenizer_json_is_an_io_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[derive(Debug, Deserialize)]
struct TemplateFixture {
    source: String,
    cases: Vec<TemplateCase>,
}

#[derive(Debug, Deserialize)]
struct TemplateCase {
    name: String,
    template: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    kwargs: serde_json::Map<String, serde_json::Value>,
    special_tokens: SpecialTokens,
    rendered: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SpecialTokens {
    bos_token: String,
    eos_token: String,
}

#[test]
fn chat_templates_render_like_transformers() -> Result<()> {
    // tests/tokenizer/chat_templates.json: templates written for this test (Qwen3-, Llama 3-style
    // and Python value printing), rendered by transformers' `render_jinja_template`.
    let path = crate_root().join("tests/tokenizer/chat_templates.json");
    let fixture: TemplateFixture = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    ensure!(
        fixture.cases.len() >= 10,
        "fixture too small: {}",
        path.display()
    );
    let mut bad = Vec::new();
    for case in &fixture.cases {
        let special = SpecialTokenVars {
            bos_token: Some(case.special_tokens.bos_token.clone()),
            eos_token: Some(case.special_tokens.eos_token.clone()),
        };
        let result = ChatTemplate::compile(&case.template)?.render(
            &case.messages,
            case.add_generation_prompt,
            &special,
            &case.kwargs,
        );
        match (&result, &case.rendered, &case.error) {
            (Ok(got), Some(want), _) if got == want => {}
            (Err(e), None, Some(want)) if e.to_string().contains(want.as_str()) => {}
            _ => bad.push(format!(
                "{}: got {result:?}\n  reference rendered={:?} error={:?}",
                case.name, case.rendered, case.error
            )),
        }
    }
    ensure!(
        bad.is_empty(),
        "{} mismatches vs {}:\n{}",
        bad.len(),
        fixture.source,
        bad.join("\n")
    );
    Ok(())
}

#[derive(Debug, Deserialize)]
struct PreTokenizerFixture {
    source: String,
    cases: Vec<PreTokenizerCase>,
}

#[derive(Debug, Deserialize)]
struct PreTokenizerCase {
    pre: String,
    text: String,
    ids: Vec<u32>,
}

#[test]
fn other_gguf_pre_tokenizers_match_their_transformers_pipelines() -> Result<()> {
    // tests/tokenizer/pretokenizer_cases.json: the SmolLM2 vocabulary encoded by transformers'
    // Qwen2 / Llama 3 / GPT-2 pipelines. Rebuild the GGUF tokenizer under each `tokenizer.ggml.pre`.
    let path = crate_root().join("tests/tokenizer/pretokenizer_cases.json");
    let fixture: PreTokenizerFixture = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let meta = GgufMetadata::read(&model_path()?)?;
    let mut bad = Vec::new();
    let mut names: Vec<&str> = fixture.cases.iter().map(|c| c.pre.as_str()).collect();
    names.dedup();
    ensure!(
        names.len() >= 3,
        "expected several pre-tokenizers in {}",
        path.display()
    );
    for name in names {
        let mut vocab = GgufVocab::from_metadata(&meta)?;
        vocab.pre = Some(name.to_owned());
        let tok = vocab.into_tokenizer()?;
        for case in fixture.cases.iter().filter(|c| c.pre == name) {
            let ids = tok.encode(&case.text, false)?;
            if ids != case.ids {
                bad.push(format!(
                    "[{name}] {:?}: {ids:?}\n  reference {:?}",
                    case.text, case.ids
                ));
            }
        }
    }
    ensure!(
        bad.is_empty(),
        "{} mismatches vs {}:\n{}",
        bad.len(),
        fixture.source,
        bad.join("\n")
    );
    Ok(())
}
