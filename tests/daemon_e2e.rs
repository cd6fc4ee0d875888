//! End to end with the real default model (SmolLM2-135M-Instruct Q4_1 on the CPU): a `.txt`, a
//! `.json` and a `.jsonl` with broken and blank lines → the documented outputs.
//!
//! Needs the model file: `models/SmolLM2-135M-Instruct.Q4_1.gguf` (`kiln model fetch-default`,
//! which `scripts/test` runs first) or the path in `KILN_TEST_MODEL`. Without it the test fails
//! with that instruction rather than skipping.

mod daemon_support;

use std::path::PathBuf;

use daemon_support::*;
use kiln::engine::{Device, EngineConfig};
use serde_json::json;

/// The default model, or a failure saying how to get it.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.exists(),
        "{} is missing: run `cargo run -- model fetch-default` (or set KILN_TEST_MODEL)",
        p.display()
    );
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_model_turns_files_into_outputs() {
    let mut env = Env::new();
    env.config.engine = EngineConfig {
        device: Device::Cpu,
        max_model_len: 1024,
        ..Default::default()
    };
    env.config.daemon.concurrency = 4;
    let model = model_path();
    let cfg = env.config.engine.clone();
    let engine = tokio::task::spawn_blocking(move || kiln::engine::spawn_from_path(&model, cfg))
        .await
        .expect("join")
        .expect("the default model loads");

    env.drop_input("capital.txt", "What is the capital of France?");
    let req = json!({
        "model": "smollm2",
        "messages": [
            { "role": "system", "content": "You answer in one short sentence." },
            { "role": "user", "content": "Name a primary color." },
        ],
        "max_tokens": 24,
        "temperature": 0,
    });
    env.drop_input("one request.json", req.to_string());
    let lines = [
        batch_line("q1", "What is 2 + 2? Answer with a number."),
        String::new(),
        r#"{"custom_id": "broken", "body": {"messages": [}"#.to_string(),
        "   ".to_string(),
        json!({ "custom_id": "q2", "method": "POST", "url": "/v1/chat/completions",
                "body": { "messages": [{ "role": "user", "content": "Say hello." }], "max_completion_tokens": 16, "stop": ["\n"] } })
        .to_string(),
    ];
    env.drop_input("batch.jsonl", lines.join("\n") + "\n");

    let summary = env.run_once(&engine).await;
    engine.shutdown();
    assert_eq!(summary.unfinished, 0);
    assert_eq!(summary.dispatch.succeeded, 4, "{summary:?}");

    // .txt → .md (the answer) + .json (metadata).
    let answer = String::from_utf8(env.output("capital.md").expect("capital.md")).unwrap();
    assert!(
        answer.contains("Paris"),
        "the capital of France: {answer:?}"
    );
    let meta = env.output_json("capital.json");
    assert_eq!(meta["input"], "capital.txt");
    assert!(meta["usage"]["prompt_tokens"].as_u64().unwrap() > 5);
    assert!(meta["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert!(["stop", "length"].contains(&meta["finish_reason"].as_str().unwrap()));
    assert!(meta["timings"]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(!meta["model"].as_str().unwrap().is_empty());

    // .json → a chat.completion.
    let chat = env.output_json("one request.json");
    assert_eq!(chat["object"], "chat.completion");
    let content = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty());
    assert!(chat["usage"]["completion_tokens"].as_u64().unwrap() <= 24);

    // .jsonl → output lines for the good requests, an error line for the broken one.
    let out = env.output_lines("batch.output.jsonl");
    let mut ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec!["q1", "q2"]);
    let q1 = out.iter().find(|l| l["custom_id"] == "q1").unwrap();
    let q1_text = q1["response"]["body"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_lowercase();
    assert!(q1_text.contains('4') || q1_text.contains("four"), "{q1}");
    let q2 = out.iter().find(|l| l["custom_id"] == "q2").unwrap();
    assert!(!q2["response"]["body"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains('\n'));
    let err = env.output_lines("batch.errors.jsonl");
    assert_eq!(err.len(), 1);
    let msg = err[0]["response"]["body"]["error"]["message"]
        .as_str()
        .unwrap();
    assert!(msg.starts_with("line 3: malformed JSON"), "{msg}");

    let ledger = env.ledger().await;
    for t in all_tasks(&ledger).await {
        assert!(t.state.is_terminal() && t.output_path.is_some(), "{t:?}");
        assert!(env.task_log(&t).contains("Taken from inputs/"));
    }
}
