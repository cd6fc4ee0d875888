//! Unit tests of task-file intake: formats, front matter, batch lines, truncation, limits.

use super::*;
use serde_json::json;

fn tasks(kind: InputKind, bytes: &[u8]) -> Vec<TaskSpec> {
    match parse_bytes(kind, bytes, true) {
        IntakeOutcome::Tasks(t) => t,
        IntakeOutcome::Incomplete(m) => panic!("unexpected incomplete: {m}"),
    }
}

fn only_error(kind: InputKind, bytes: &[u8]) -> IntakeError {
    let t = tasks(kind, bytes);
    assert_eq!(t.len(), 1, "{t:?}");
    t[0].body.clone().expect_err("should fail")
}

#[test]
fn kinds_by_extension() {
    assert_eq!(
        InputKind::from_path(Path::new("a b/ü.TXT")),
        Some(InputKind::Txt)
    );
    assert_eq!(InputKind::from_path(Path::new("x.md")), Some(InputKind::Md));
    assert_eq!(
        InputKind::from_path(Path::new("x.Json")),
        Some(InputKind::Json)
    );
    assert_eq!(
        InputKind::from_path(Path::new("x.jsonl")),
        Some(InputKind::Jsonl)
    );
    assert_eq!(InputKind::from_path(Path::new("x.csv")), None);
    assert_eq!(InputKind::from_path(Path::new("README")), None);
    for k in [
        InputKind::Txt,
        InputKind::Md,
        InputKind::Json,
        InputKind::Jsonl,
    ] {
        assert_eq!(k.as_str().parse::<InputKind>(), Ok(k));
    }
}

#[test]
fn text_file_is_one_user_message() {
    let t = tasks(
        InputKind::Txt,
        "\u{feff}What is the capital of France?\n".as_bytes(),
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].line, None);
    let body = t[0].body.as_ref().expect("ok");
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(
        body["messages"][0]["content"],
        "What is the capital of France?"
    );
}

#[test]
fn empty_binary_and_bad_utf8_fail_clearly() {
    for kind in [
        InputKind::Txt,
        InputKind::Md,
        InputKind::Json,
        InputKind::Jsonl,
    ] {
        let e = only_error(kind, b"");
        assert_eq!(e.class, ErrorClass::InvalidInput);
        assert!(e.message.contains("empty"), "{e}");
        assert!(only_error(kind, b" \n\t\n")
            .message
            .contains("only whitespace"));
        let e = only_error(kind, b"PK\x03\x04\x00\x00binary");
        assert!(
            e.message.contains("binary file") && e.message.contains("offset 4"),
            "{e}"
        );
    }
    let e = only_error(InputKind::Txt, b"caf\xe9 au lait");
    assert!(e.message.contains("invalid UTF-8 at byte offset 3"), "{e}");
    assert!(only_error(InputKind::Json, b"{\"a\": \"\xff\"}")
        .message
        .contains("invalid UTF-8"));
}

#[test]
fn front_matter_sets_request_fields_of_a_text_task() {
    let t = tasks(
        InputKind::Md,
        b"---\nmax_tokens: 64\ntemperature: 0.5\nsystem: Be brief.\n---\n# Count\nFrom 32 to 35.\n",
    );
    let body = t[0].body.as_ref().expect("valid");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][0]["content"], "Be brief.");
    assert_eq!(body["messages"][1]["content"], "# Count\nFrom 32 to 35.");
    // No closing line: plain text, the dashes included.
    let t = tasks(InputKind::Txt, b"---\nnot front matter\n");
    assert_eq!(
        t[0].body.as_ref().unwrap()["messages"][0]["content"],
        "---\nnot front matter"
    );
    // Plain files are unchanged.
    let t = tasks(InputKind::Txt, b"  hi  \n");
    assert_eq!(
        t[0].body.as_ref().unwrap(),
        &serde_json::json!({ "messages": [{ "role": "user", "content": "hi" }] })
    );
    let e = only_error(InputKind::Txt, b"---\nmax_token: 5\n---\nhi\n");
    assert!(e.message.contains("unknown parameter `max_token`"), "{e}");
    let e = only_error(InputKind::Txt, b"---\nmax_tokens 5\n---\nhi\n");
    assert!(e.message.contains("front matter line 2"), "{e}");
    let e = only_error(InputKind::Txt, b"---\nmax_tokens: 5\n---\n\n");
    assert!(e.message.contains("no text after it"), "{e}");
}

#[test]
fn json_file_is_validated_at_intake() {
    let ok = tasks(
        InputKind::Json,
        br#"{"messages":[{"role":"user","content":"hi"}],"temperature":0.2,"user":"u"}"#,
    );
    assert!(ok[0].body.is_ok());
    let e = only_error(
        InputKind::Json,
        br#"{"messages":[{"role":"user","content":"hi"}],"x":1}"#,
    );
    assert!(e.message.contains("unknown parameter `x`"), "{e}");
    let e = only_error(
        InputKind::Json,
        br#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#,
    );
    assert!(
        e.message.contains("invalid request") && e.message.contains("stream"),
        "{e}"
    );
    let e = only_error(InputKind::Json, b"{\"messages\": [}");
    assert!(e.message.starts_with("malformed JSON"), "{e}");
    let e = only_error(
        InputKind::Json,
        br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}"#,
    );
    assert!(e.message.contains("batch line"), "{e}");
}

#[test]
fn truncated_json_is_incomplete_then_a_parse_failure() {
    let cut = br#"{"messages":[{"role":"user","content":"hi"#;
    assert!(matches!(
        parse_bytes(InputKind::Json, cut, true),
        IntakeOutcome::Incomplete(_)
    ));
    let IntakeOutcome::Tasks(t) = parse_bytes(InputKind::Json, cut, false) else {
        panic!()
    };
    let e = t[0].body.clone().unwrap_err();
    assert_eq!(e.class, ErrorClass::Parse);
    assert!(e.message.contains("may still be being written"), "{e}");
}

fn line(id: &str, content: &str) -> String {
    json!({ "custom_id": id, "method": "POST", "url": "/v1/chat/completions",
            "body": { "model": "m", "messages": [{ "role": "user", "content": content }] } })
    .to_string()
}

#[test]
fn jsonl_bad_lines_fail_alone_and_blank_lines_are_skipped() {
    let file = [
        line("a", "one"),
        String::new(),
        "{not json".to_string(),
        "   ".to_string(),
        line("b", "two"),
        r#"{"custom_id":"c","body":{"messages":[{"role":"user","content":"x"}],"n":2}}"#
            .to_string(),
        line("a", "dup"),
        r#"{"method":"POST","body":{}}"#.to_string(),
        r#"{"custom_id":"e","url":"/v1/embeddings","body":{}}"#.to_string(),
        "[1,2]".to_string(),
        String::new(),
    ]
    .join("\r\n");
    let t = tasks(InputKind::Jsonl, file.as_bytes());
    let summary: Vec<(Option<u32>, Option<&str>, bool)> = t
        .iter()
        .map(|s| (s.line, s.custom_id.as_deref(), s.body.is_ok()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (Some(1), Some("a"), true),
            (Some(3), None, false),
            (Some(5), Some("b"), true),
            (Some(6), Some("c"), false),
            (Some(7), Some("a"), false),
            (Some(8), None, false),
            (Some(9), Some("e"), false),
            (Some(10), None, false),
        ]
    );
    let msg = |i: usize| t[i].body.clone().unwrap_err().message;
    assert!(msg(1).starts_with("line 3: malformed JSON"), "{}", msg(1));
    assert!(msg(3).contains("`n` = 2"), "{}", msg(3));
    assert!(
        msg(4).contains("duplicate custom_id `a` (first used on line 1)"),
        "{}",
        msg(4)
    );
    assert!(msg(5).contains("`custom_id` is required"), "{}", msg(5));
    assert!(msg(6).contains("/v1/embeddings"), "{}", msg(6));
    assert!(msg(7).contains("must be a JSON object"), "{}", msg(7));
    assert!(t
        .iter()
        .filter_map(|s| s.body.as_ref().err())
        .all(|e| e.class == ErrorClass::InvalidInput));
    assert_eq!(t[0].body.as_ref().unwrap()["messages"][0]["content"], "one");
}

#[test]
fn jsonl_with_bad_utf8_line_keeps_the_others() {
    let mut bytes = line("a", "ok").into_bytes();
    bytes.extend_from_slice(b"\n{\"custom_id\":\"b\",\"body\":\"\xff\"}\n");
    let t = tasks(InputKind::Jsonl, &bytes);
    assert!(t[0].body.is_ok());
    assert!(t[1]
        .body
        .clone()
        .unwrap_err()
        .message
        .contains("line 2: invalid UTF-8"));
}

#[test]
fn jsonl_cut_mid_line_is_incomplete_but_a_broken_middle_line_is_not() {
    let cut = format!("{}\n{{\"custom_id\":\"b\",\"bo", line("a", "x"));
    assert!(matches!(
        parse_bytes(InputKind::Jsonl, cut.as_bytes(), true),
        IntakeOutcome::Incomplete(_)
    ));
    let IntakeOutcome::Tasks(t) = parse_bytes(InputKind::Jsonl, cut.as_bytes(), false) else {
        panic!()
    };
    assert!(t[0].body.is_ok());
    assert_eq!(t[1].body.clone().unwrap_err().class, ErrorClass::Parse);
    let middle = format!("{{\"custom_id\":\"b\",\"bo\n{}\n", line("a", "x"));
    let t = tasks(InputKind::Jsonl, middle.as_bytes());
    assert_eq!(
        t[0].body.clone().unwrap_err().class,
        ErrorClass::InvalidInput
    );
    assert!(t[1].body.is_ok());
}

#[test]
fn read_input_hashes_and_enforces_the_size_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("big prompt ü.txt");
    std::fs::write(&p, "hello").expect("write");
    let r = read_input(&p, InputKind::Txt, 100, true).expect("read");
    assert_eq!(r.sha256, hex::encode(Sha256::digest(b"hello")));
    assert_eq!(r.size, 5);
    let r = read_input(&p, InputKind::Txt, 4, true).expect("read");
    assert_eq!(r.sha256, hex::encode(Sha256::digest(b"hello")));
    let IntakeOutcome::Tasks(t) = r.outcome else {
        panic!()
    };
    let e = t[0].body.clone().unwrap_err();
    assert!(e.message.contains("over the limit of 4 bytes"), "{e}");
    assert!(read_input(&dir.path().join("missing.txt"), InputKind::Txt, 4, true).is_err());
}
