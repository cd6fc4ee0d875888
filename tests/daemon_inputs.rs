//! Bad and unusual inputs: each fails alone with a clear error file while the daemon keeps going;
//! a file still being written is taken only once complete; re-runs are idempotent and changed
//! content runs again.

mod daemon_support;

use std::io::Write;
use std::time::Duration;

use daemon_support::*;
use kiln::ledger::TaskState;
use serde_json::{json, Value};

fn error_of(env: &Env, name: &str) -> (String, String) {
    let e = env.output_json(name);
    (
        e["error_class"].as_str().unwrap_or("").to_string(),
        e["error"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn bad_inputs_fail_clearly_and_the_daemon_keeps_going() {
    let mut env = Env::new();
    env.config.daemon.max_input_bytes = 4096;
    env.config.daemon.stable_secs = 0.3;
    env.config.retry.backoff_base_secs = 0.05;

    // Good inputs, with spaces and unicode in names.
    env.drop_input("good prompt ü.txt", "What is 2+2?");
    env.drop_input("notes.MD", "# Title\nSummarize this.");
    let req = json!({ "model": "x", "messages": [{ "role": "system", "content": "Be brief." },
                     { "role": "user", "content": [{ "type": "text", "text": "Hi " }, { "type": "text", "text": "there" }] }],
                     "max_tokens": 16, "user": "ignored offline" });
    env.drop_input("request.json", req.to_string());
    // A typo of `max_tokens` must not run uncapped: it fails, naming the parameter.
    env.drop_input(
        "typo.json",
        json!({ "messages": [{ "role": "user", "content": "x" }], "max_token": 16 }).to_string(),
    );

    // Bad inputs.
    env.drop_input("empty.txt", "");
    env.drop_input("binary.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00");
    env.drop_input("latin1.md", b"caf\xe9 cr\xe8me");
    env.drop_input("huge.txt", "x".repeat(5000));
    env.drop_input(
        "broken.json",
        r#"{"messages": [{"role": "user", "content": "cut"#,
    );
    env.drop_input("syntax.json", r#"{"messages": ]}"#);
    env.drop_input(
        "stream.json",
        json!({ "messages": [{ "role": "user", "content": "x" }], "stream": true }).to_string(),
    );
    let batch = [
        batch_line("a", "first"),
        String::new(),
        "{this is not json".to_string(),
        "   ".to_string(),
        batch_line("b", "second"),
        json!({ "custom_id": "c", "body": { "messages": [{ "role": "user", "content": "x" }], "tools": [{ "type": "function" }] } })
            .to_string(),
        batch_line("a", "duplicate id"),
    ];
    env.drop_input("batch.jsonl", batch.join("\n") + "\n");
    env.drop_input("data.csv", "a,b\n1,2\n");
    env.drop_input(".hidden.txt", "ignored");
    std::fs::write(env.inputs().join("upload.txt.part"), "ignored").unwrap();

    // Symlinks: inside inputs/ (followed), outside (refused), dangling (refused).
    let outside = env.dir.path().join("secret.txt");
    std::fs::write(&outside, "outside inputs").unwrap();
    std::os::unix::fs::symlink(&outside, env.inputs().join("outside.txt")).unwrap();
    std::os::unix::fs::symlink(
        env.inputs().join("good prompt ü.txt"),
        env.inputs().join("link.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        env.dir.path().join("nowhere.txt"),
        env.inputs().join("dangling.txt"),
    )
    .unwrap();

    // A file still being written when the daemon starts: chunks every 100 ms for ~1 s.
    let slow = env.inputs().join("slow.txt");
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::File::create(&slow).unwrap();
        for i in 0..10 {
            write!(f, "part{i} ").unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;

    let summary = env.run_once(&echo_engine()).await;
    writer.join().unwrap();
    assert!(!summary.shut_down);
    assert_eq!(summary.unfinished, 0);

    // Good inputs ran.
    assert_eq!(
        env.output("good prompt ü.md").unwrap(),
        b"echo: What is 2+2?\n"
    );
    let meta = env.output_json("good prompt ü.json");
    assert_eq!(meta["model"], "test-model");
    assert_eq!(meta["finish_reason"], "stop");
    assert_eq!(meta["usage"]["total_tokens"], 14);
    assert_eq!(meta["input"], "good prompt ü.txt");
    assert_eq!(
        env.output("notes.md").unwrap(),
        b"echo: # Title\nSummarize this.\n"
    );
    let chat = env.output_json("request.json");
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["content"], "echo: Hi there");
    assert_eq!(env.output("link.md").unwrap(), b"echo: What is 2+2?\n");
    let slow_text = String::from_utf8(env.output("slow.md").expect("slow output")).unwrap();
    assert!(
        slow_text.contains("part0") && slow_text.contains("part9"),
        "taken before complete: {slow_text}"
    );

    // Each bad input has an error file saying why.
    let cases = [
        ("empty.error.json", "invalid_input", "empty"),
        ("binary.error.json", "invalid_input", "binary file"),
        (
            "latin1.error.json",
            "invalid_input",
            "invalid UTF-8 at byte offset 3",
        ),
        (
            "huge.error.json",
            "invalid_input",
            "over the limit of 4096 bytes",
        ),
        ("broken.error.json", "parse", "may still be being written"),
        ("syntax.error.json", "invalid_input", "malformed JSON"),
        (
            "stream.error.json",
            "invalid_input",
            "`stream: true` is not supported",
        ),
        (
            "typo.error.json",
            "invalid_input",
            "unknown parameter `max_token` (did you mean `max_tokens`?)",
        ),
        ("outside.error.json", "invalid_input", "follow_symlinks"),
        ("dangling.error.json", "invalid_input", "broken symlink"),
    ];
    for (name, class, needle) in cases {
        let (c, msg) = error_of(&env, name);
        assert_eq!(c, class, "{name}: {msg}");
        assert!(msg.contains(needle), "{name}: {msg}");
    }

    // The batch: good lines answered, each bad line explained with its line number.
    let out = env.output_lines("batch.output.jsonl");
    let ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["a", "b"]);
    let err = env.output_lines("batch.errors.jsonl");
    let msgs: Vec<String> = err
        .iter()
        .map(|l| {
            l["response"]["body"]["error"]["message"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(err.len(), 3, "{msgs:?}");
    assert!(msgs[0].starts_with("line 3: malformed JSON"), "{msgs:?}");
    assert!(
        msgs[1].starts_with("line 6:") && msgs[1].contains("`tools`"),
        "{msgs:?}"
    );
    assert!(
        msgs[2].starts_with("line 7:") && msgs[2].contains("duplicate custom_id `a`"),
        "{msgs:?}"
    );
    assert_eq!(err[1]["custom_id"], "c");
    assert!(err[0]["custom_id"].is_null());

    // Nothing for ignored names or non-task files; every output name stays inside outputs/.
    let names = env.output_names();
    assert!(
        !names
            .iter()
            .any(|n| n.contains("hidden") || n.contains("upload") || n.contains("data")),
        "{names:?}"
    );

    // The ledger agrees.
    let ledger = env.ledger().await;
    let tasks = all_tasks(&ledger).await;
    assert!(tasks.iter().all(|t| t.state.is_terminal()), "{tasks:?}");
    assert!(tasks.iter().all(|t| t.output_path.is_some()));
    assert_eq!(count_state(&tasks, TaskState::Succeeded), 7);
}

#[tokio::test]
async fn reruns_are_idempotent_and_changed_content_runs_again() {
    let env = Env::new();
    env.drop_input("q.txt", "one");
    env.drop_input(
        "b.jsonl",
        [batch_line("x", "1"), batch_line("y", "2")].join("\n"),
    );
    let engine = echo_engine();
    let s1 = env.run_once(&engine).await;
    assert_eq!((s1.files, s1.dispatch.succeeded), (2, 3));
    let before = env.outputs();

    // A restart over the same inputs: nothing new runs, nothing new is written.
    let s2 = env.run_once(&engine).await;
    assert_eq!((s2.files, s2.dispatch.attempts), (0, 0));
    assert_eq!(env.outputs(), before);

    // Changed content is a new task; its output gets a suffix, the old one is kept.
    env.drop_input("q.txt", "two");
    let s3 = env.run_once(&engine).await;
    assert_eq!((s3.files, s3.dispatch.succeeded), (1, 1));
    assert_eq!(env.output("q.md").unwrap(), b"echo: one\n");
    assert_eq!(env.output("q-1.md").unwrap(), b"echo: two\n");
    let meta: Value = env.output_json("q-1.json");
    let ledger = env.ledger().await;
    let tasks = tasks_of(&ledger, "q.txt").await;
    assert_eq!(tasks.len(), 2);
    assert_eq!(meta["task_id"], tasks[1].task_id.to_string());
}
