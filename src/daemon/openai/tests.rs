//! Tests of request parsing and the response builders.

use super::*;
use crate::engine::request::{Completion, FinishReason, Timings, TokenLogprob, TopLogprob, Usage};
use crate::error::ErrorClass;

fn parse(v: Value) -> Result<ChatRequest, RequestError> {
    parse_chat_request(&v)
}

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

#[test]
fn minimal_request_is_greedy_chat() {
    let r = parse(json!({ "messages": user("hi") })).expect("valid");
    let Prompt::Chat {
        messages,
        template_kwargs,
    } = &r.prompt
    else {
        panic!("not chat")
    };
    assert_eq!(
        messages,
        &vec![ChatMessage {
            role: "user".into(),
            content: "hi".into()
        }]
    );
    assert!(template_kwargs.is_empty());
    assert_eq!(r.sampling, SamplingParams::default());
    assert!(!r.response_format.is_constrained());
    assert!(r.warnings.is_empty());
}

#[test]
fn every_supported_field_maps_onto_sampling() {
    let r = parse(json!({
        "model": "m", "messages": user("x"), "max_completion_tokens": 12, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n\n", "END"],
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "logprobs": true, "top_logprobs": 3, "n": 1, "stream": false, "user": "u",
        "stop_token_ids": [2], "ignore_eos": true,
        "chat_template_kwargs": { "enable_thinking": false },
    }))
    .expect("valid");
    let s = &r.sampling;
    assert_eq!(s.max_tokens, Some(12));
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (0.7, 0.9, 40, 0.05)
    );
    assert_eq!(s.seed, Some(7));
    assert_eq!(s.stop, vec!["\n\n".to_string(), "END".to_string()]);
    assert_eq!(
        (
            s.presence_penalty,
            s.frequency_penalty,
            s.repetition_penalty
        ),
        (0.5, -0.5, 1.1)
    );
    assert_eq!(s.logprobs, Some(3));
    assert_eq!(s.stop_token_ids, vec![2]);
    assert!(s.ignore_eos);
    assert_eq!(r.model.as_deref(), Some("m"));
    let Prompt::Chat {
        template_kwargs, ..
    } = &r.prompt
    else {
        panic!()
    };
    assert_eq!(template_kwargs.get("enable_thinking"), Some(&json!(false)));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn text_part_arrays_are_flattened_and_developer_is_system() {
    let r = parse(json!({ "messages": [
        { "role": "developer", "content": "be brief" },
        { "role": "user", "content": [{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }] },
    ]}))
    .expect("valid");
    let Prompt::Chat { messages, .. } = &r.prompt else {
        panic!()
    };
    assert_eq!(
        messages[0],
        ChatMessage {
            role: "system".into(),
            content: "be brief".into()
        }
    );
    assert_eq!(messages[1].content, "ab");
}

#[test]
fn stop_may_be_a_string_and_max_tokens_an_alias() {
    let r = parse(json!({ "messages": user("x"), "stop": "##", "max_tokens": 5 })).expect("valid");
    assert_eq!(r.sampling.stop, vec!["##".to_string()]);
    assert_eq!(r.sampling.max_tokens, Some(5));
    let both = parse(json!({ "messages": user("x"), "max_tokens": 5, "max_completion_tokens": 5 }));
    assert_eq!(
        both.expect("same value is fine").sampling.max_tokens,
        Some(5)
    );
    let err = parse(json!({ "messages": user("x"), "max_tokens": 5, "max_completion_tokens": 6 }))
        .unwrap_err();
    assert!(err.message.contains("disagree"), "{err}");
}

#[test]
fn stream_tools_and_n_are_clear_errors() {
    let e = parse(json!({ "messages": user("x"), "stream": true })).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("stream"));
    assert!(e.message.contains("stream"), "{e}");
    let e = parse(json!({ "messages": user("x"), "tools": [{ "type": "function" }] })).unwrap_err();
    assert!(e.message.contains("unsupported parameter `tools`"), "{e}");
    for k in [
        "audio",
        "modalities",
        "functions",
        "logit_bias",
        "tool_choice",
    ] {
        let e = parse(json!({ "messages": user("x"), k: { "x": 1 } })).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(k));
    }
    // Empty / null values of unsupported fields are what many clients send by default.
    assert!(parse(json!({ "messages": user("x"), "tools": [], "logit_bias": null })).is_ok());
    let e = parse(json!({ "messages": user("x"), "n": 3 })).unwrap_err();
    assert!(e.message.contains("`n` = 3 is not supported"), "{e}");
}

#[test]
fn unknown_fields_fail_naming_the_parameter_and_ignored_ones_pass() {
    let e = parse(json!({ "messages": user("x"), "max_token": 16 })).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("max_token"));
    assert!(e.message.contains("did you mean `max_tokens`"), "{e}");
    let e = parse(json!({ "messages": user("x"), "frobnicate": 1 })).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("frobnicate"));
    let r = parse(
        json!({ "messages": user("x"), "user": "u1", "metadata": {"k": "v"}, "store": false }),
    )
    .expect("ignored fields pass");
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn ranges_and_types_are_checked() {
    let cases = [
        (
            json!({ "messages": user("x"), "temperature": 3.0 }),
            "temperature",
        ),
        (
            json!({ "messages": user("x"), "temperature": "hot" }),
            "temperature",
        ),
        (json!({ "messages": user("x"), "top_p": 0 }), "top_p"),
        (
            json!({ "messages": user("x"), "presence_penalty": -2.5 }),
            "presence_penalty",
        ),
        (
            json!({ "messages": user("x"), "max_tokens": 0 }),
            "max_tokens",
        ),
        (
            json!({ "messages": user("x"), "max_tokens": -1 }),
            "max_tokens",
        ),
        (
            json!({ "messages": user("x"), "top_logprobs": 2 }),
            "top_logprobs",
        ),
        (
            json!({ "messages": user("x"), "logprobs": true, "top_logprobs": 21 }),
            "top_logprobs",
        ),
        (json!({ "messages": user("x"), "stop": [1] }), "stop"),
        (json!({ "messages": user("x"), "stop": "" }), "stop"),
        (json!({ "messages": user("x"), "seed": 1.5 }), "seed"),
        (json!({ "messages": user("x"), "top_k": -2 }), "top_k"),
        (json!({ "messages": [] }), "messages"),
        (json!({ "messages": "hi" }), "messages"),
        (json!({}), "messages"),
        (
            json!({ "messages": [{ "role": "wizard", "content": "x" }] }),
            "messages[0].role",
        ),
        (
            json!({ "messages": [{ "role": "tool", "content": "x" }] }),
            "messages[0].role",
        ),
        (
            json!({ "messages": [{ "role": "user" }] }),
            "messages[0].content",
        ),
        (
            json!({ "messages": [{ "role": "user", "content": 3 }] }),
            "messages[0].content",
        ),
        (
            json!({ "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": {} }] }] }),
            "messages[0].content[0]",
        ),
        (
            json!({ "messages": user("x"), "response_format": { "type": "yaml" } }),
            "response_format.type",
        ),
        (
            json!({ "messages": user("x"), "response_format": { "type": "json_schema", "json_schema": { "schema": {} } } }),
            "response_format.json_schema.name",
        ),
        (
            json!({ "messages": user("x"), "chat_template_kwargs": [1] }),
            "chat_template_kwargs",
        ),
    ];
    for (body, param) in cases {
        let e = parse(body.clone()).expect_err(&body.to_string());
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        assert!(!e.message.is_empty());
    }
    let e = parse(json!([1, 2])).unwrap_err();
    assert!(e.message.contains("must be a JSON object"), "{e}");
}

#[test]
fn negative_top_k_and_seed_are_accepted_as_vllm_and_openai_do() {
    let r = parse(json!({ "messages": user("x"), "top_k": -1, "seed": -3 })).expect("valid");
    assert_eq!(r.sampling.top_k, 0);
    assert_eq!(r.sampling.seed, Some((-3i64) as u64));
}

#[test]
fn json_object_format_checks_output() {
    let r = parse(json!({ "messages": user("x"), "response_format": { "type": "json_object" } }))
        .expect("valid");
    let f = &r.response_format;
    assert!(f.is_constrained());
    assert_eq!(f.check(" {\"a\": 1}\n"), Ok(()));
    assert!(f.check("[1]").unwrap_err().contains("not an object"));
    assert!(f
        .check("```json\n{}\n```")
        .unwrap_err()
        .contains("not valid JSON"));
}

#[test]
fn json_schema_format_validates_output() {
    let r = parse(json!({ "messages": user("x"), "response_format": { "type": "json_schema", "json_schema": {
        "name": "city", "strict": true,
        "schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
    }}}))
    .expect("valid");
    let f = &r.response_format;
    assert_eq!(f.check(r#"{"city": "Paris"}"#), Ok(()));
    let e = f.check(r#"{"town": "Paris"}"#).unwrap_err();
    assert!(e.contains("schema `city`") && e.contains("city"), "{e}");
    let e = f.check(r#"{"city": 3}"#).unwrap_err();
    assert!(e.contains("/city"), "{e}");
}

#[test]
fn invalid_schema_is_a_request_error() {
    let e = parse(
        json!({ "messages": user("x"), "response_format": { "type": "json_schema", "json_schema": {
        "name": "bad", "schema": { "type": "no-such-type" } }}}),
    )
    .unwrap_err();
    assert_eq!(
        e.param.as_deref(),
        Some("response_format.json_schema.schema")
    );
}

fn completion() -> Completion {
    Completion {
        text: "Paris.".into(),
        token_ids: vec![5, 6],
        finish_reason: FinishReason::Stop,
        usage: Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
            cached_prompt_tokens: 4,
        },
        timings: Timings::default(),
        logprobs: Some(vec![TokenLogprob {
            token_id: 5,
            token: "Paris".into(),
            logprob: -0.25,
            top: vec![TopLogprob {
                token_id: 5,
                token: "Paris".into(),
                logprob: -0.25,
            }],
        }]),
    }
}

#[test]
fn chat_completion_has_openai_shape() {
    let v = chat_completion("0190-abc", "smol", 1_700_000_000, &completion());
    assert_eq!(v["id"], "chatcmpl-0190-abc");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["created"], 1_700_000_000);
    assert_eq!(v["model"], "smol");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 12);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    let lp = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(lp["token"], "Paris");
    assert_eq!(lp["bytes"], json!([80, 97, 114, 105, 115]));
    assert_eq!(lp["top_logprobs"][0]["logprob"], -0.25);
}

#[test]
fn batch_lines_echo_ids() {
    let ok = batch_output_line("t1", Some("req-1"), json!({ "x": 1 }));
    assert_eq!(ok["id"], "t1");
    assert_eq!(ok["custom_id"], "req-1");
    assert_eq!(ok["response"]["status_code"], 200);
    assert_eq!(ok["response"]["body"]["x"], 1);
    assert!(ok["error"].is_null());

    let bad = batch_error_line(
        "t2",
        Some("req-2"),
        ErrorClass::InvalidInput,
        "`n` = 2 is not supported",
    );
    assert_eq!(bad["response"]["status_code"], 400);
    assert_eq!(
        bad["response"]["body"]["error"]["type"],
        "invalid_request_error"
    );
    assert_eq!(bad["response"]["body"]["error"]["code"], "invalid_input");
    assert!(bad["error"].is_null());

    let dead = batch_error_line("t3", None, ErrorClass::Timeout, "timed out 3 times");
    assert!(dead["response"].is_null());
    assert!(dead["custom_id"].is_null());
    assert_eq!(dead["error"]["code"], "timeout");
    assert_eq!(dead["error"]["message"], "timed out 3 times");
}
