//! The query commands of the built `kiln` binary against a temporary ledger filled through the API:
//! `list [--json]`, `show`, `status --json`, `retry`, `logs [--follow]`, `submit`, and config errors.
//!
//! Run: `cargo test --test cli_queries`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kiln::error::ErrorClass;
use kiln::ledger::{
    AttemptStats, InputKind, Ledger, NewInputFile, NewTask, NewTaskBody, TaskId, TaskState,
    UnixMillis,
};
use serde_json::Value;
use sha2::Digest;

/// A temp folder with a `config.toml` (all defaults: `kiln.db`, `inputs/`, `logs/` beside it).
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[logging]\nlevel = \"warn\"\n",
        )
        .unwrap();
        Site { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    async fn ledger(&self) -> Ledger {
        Ledger::open(self.path().join("kiln.db")).await.unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        // Run from elsewhere: paths must come from --config, not the working directory.
        cmd.current_dir(std::env::temp_dir());
        cmd.arg("--config")
            .arg(self.path().join("config.toml"))
            .args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("KILN_") || k == "RUST_LOG" || k == "RUST_BACKTRACE" {
                cmd.env_remove(k);
            }
        }
        cmd.env("NO_COLOR", "1");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Run, expect success, return stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kiln {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Run, expect failure, return stdout + stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "kiln {args:?} should fail");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}

fn input(path: &str, content: &str) -> NewInputFile {
    NewInputFile {
        path: path.into(),
        sha256: hex::encode(sha2::Sha256::digest(content.as_bytes())),
        size: content.len() as u64,
        kind: InputKind::from_path(path.as_ref()).unwrap(),
    }
}

fn request(line: u32, custom_id: &str) -> NewTask {
    NewTask {
        line: Some(line),
        custom_id: Some(custom_id.into()),
        body: NewTaskBody::Request(format!(
            "{{\"messages\":[{{\"role\":\"user\",\"content\":\"question {line}\"}}],\"max_tokens\":8}}"
        )),
    }
}

/// The fixture every test starts from: `batch.jsonl` with four lines and `note.txt`.
/// - line 1 (`a`): succeeded, output written;
/// - line 2 (`b`): dead after an `oom` failure;
/// - line 3 (`c`): rejected at intake (`invalid_input`);
/// - line 4 (`d`): dead after a `timeout` failure;
/// - `note.txt`: queued.
struct Fixture {
    a: TaskId,
    b: TaskId,
    c: TaskId,
    d: TaskId,
    note: TaskId,
}

async fn fill(ledger: &Ledger) -> Fixture {
    let rejected = NewTask {
        line: Some(3),
        custom_id: Some("c".into()),
        body: NewTaskBody::Rejected {
            class: ErrorClass::InvalidInput,
            message: "line 3: `stream: true` is not supported".into(),
        },
    };
    let batch = ledger
        .record_input_file(
            &input("batch.jsonl", "four lines"),
            &[request(1, "a"), request(2, "b"), rejected, request(4, "d")],
        )
        .await
        .unwrap()
        .unwrap();
    let [a, b, c, d] = batch.task_ids[..] else {
        panic!("four tasks")
    };
    let note = ledger
        .record_input_file(
            &input("note.txt", "hello"),
            &[NewTask {
                line: None,
                custom_id: None,
                body: NewTaskBody::Request("{}".into()),
            }],
        )
        .await
        .unwrap()
        .unwrap()
        .task_ids[0];
    let claimed: Vec<TaskId> = ledger
        .claim_next(3, UnixMillis::now())
        .await
        .unwrap()
        .iter()
        .map(|t| t.task_id)
        .collect();
    // Fair claims: batch:1, note, batch:2, then batch:4; note goes back (a shutdown).
    assert_eq!(claimed, [a, note, b]);
    assert_eq!(
        ledger.claim_next(1, UnixMillis::now()).await.unwrap()[0].task_id,
        d
    );
    ledger.release_interrupted(note, "shutdown").await.unwrap();
    let stats = AttemptStats {
        prompt_tokens: Some(21),
        completion_tokens: Some(5),
        cached_tokens: Some(0),
        ttft_ms: Some(40.0),
        decode_tps: Some(55.5),
    };
    ledger
        .finish_success(a, "{\"object\":\"chat.completion\",\"choices\":[]}", stats)
        .await
        .unwrap();
    ledger
        .set_output_path(a, "2026-05-01/batch.output.jsonl")
        .await
        .unwrap();
    ledger
        .finish_failure(
            b,
            ErrorClass::Oom,
            "KV cache cannot hold 900 tokens",
            AttemptStats::default(),
            None,
        )
        .await
        .unwrap();
    ledger
        .finish_failure(
            d,
            ErrorClass::Timeout,
            "past 600 s",
            AttemptStats::default(),
            None,
        )
        .await
        .unwrap();
    Fixture { a, b, c, d, note }
}

fn by_id(array: &[Value], id: TaskId) -> &Value {
    array
        .iter()
        .find(|t| t["task_id"] == id.to_string())
        .unwrap_or_else(|| panic!("{id} not listed"))
}

#[tokio::test]
async fn list_json_has_the_documented_fields() {
    let site = Site::new();
    let f = fill(&site.ledger().await).await;
    let v = site.json(&["list", "--json"]);
    let array = v.as_array().unwrap();
    assert_eq!(array.len(), 5);
    for t in array {
        for key in [
            "task_id",
            "input",
            "line",
            "custom_id",
            "state",
            "attempts",
            "error_class",
            "error",
            "output",
        ] {
            assert!(t.get(key).is_some(), "{key} missing in {t}");
        }
    }
    let a = by_id(array, f.a);
    assert_eq!(
        (
            a["input"].as_str(),
            a["line"].as_u64(),
            a["custom_id"].as_str()
        ),
        (Some("batch.jsonl"), Some(1), Some("a"))
    );
    assert_eq!(
        (a["state"].as_str(), a["attempts"].as_u64()),
        (Some("succeeded"), Some(1))
    );
    assert_eq!(a["output"].as_str(), Some("2026-05-01/batch.output.jsonl"));
    assert!(a["error_class"].is_null() && a["error"].is_null());
    let b = by_id(array, f.b);
    assert_eq!(
        (b["state"].as_str(), b["error_class"].as_str()),
        (Some("dead"), Some("oom"))
    );
    assert_eq!(b["error"].as_str(), Some("KV cache cannot hold 900 tokens"));
    let c = by_id(array, f.c);
    assert_eq!(
        (
            c["state"].as_str(),
            c["attempts"].as_u64(),
            c["error_class"].as_str()
        ),
        (Some("failed"), Some(0), Some("invalid_input"))
    );
    let note = by_id(array, f.note);
    assert_eq!(
        (
            note["input"].as_str(),
            note["line"].is_null(),
            note["custom_id"].is_null()
        ),
        (Some("note.txt"), true, true)
    );
    assert_eq!(
        (note["state"].as_str(), note["attempts"].as_u64()),
        (Some("queued"), Some(0))
    );

    let dead = site.json(&["list", "--state", "dead", "--json"]);
    let mut ids: Vec<&str> = dead
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = [f.b.to_string(), f.d.to_string()];
    want.sort();
    assert_eq!(ids, want);
    let oom = site.json(&["list", "--class", "oom", "--json"]);
    assert_eq!(oom.as_array().unwrap().len(), 1);

    let table = site.ok(&["list"]);
    assert!(table.starts_with("TASK"), "{table}");
    assert_eq!(table.lines().count(), 6, "header + 5 tasks:\n{table}");
    assert!(
        table.contains(&f.b.to_string())
            && table.contains("batch.jsonl:2")
            && table.contains("oom: KV cache")
    );
    assert!(site
        .fails(&["list", "--state", "done"])
        .contains("unknown task state"));
}

#[tokio::test]
async fn show_prints_the_task_its_attempts_and_request() {
    let site = Site::new();
    let f = fill(&site.ledger().await).await;
    let text = site.ok(&["show", &f.a.to_string()]);
    for needle in [
        f.a.to_string().as_str(),
        "batch.jsonl:1",
        "custom_id    a",
        "state        succeeded (attempts 1)",
        "output       2026-05-01/batch.output.jsonl",
        "succeeded (prompt 21, completion 5, ttft 40.0 ms, 55.5 tok/s)",
        "\"max_tokens\": 8",
        "\"object\": \"chat.completion\"",
        "(none yet)",
    ] {
        assert!(text.contains(needle), "`{needle}` missing in:\n{text}");
    }
    // By a unique prefix; an interrupted attempt shows with its reason.
    let prefix = &f.note.to_string()[..30];
    let note = site.ok(&["show", prefix]);
    assert!(
        note.contains("interrupted: shutdown") && note.contains("state        queued (attempts 0)"),
        "{note}"
    );
    let v = site.json(&["show", "--json", &f.b.to_string()]);
    assert_eq!(v["state"], "dead");
    assert_eq!(v["attempts_history"][0]["outcome"]["failed"], "oom");
    assert_eq!(v["request"]["max_tokens"], 8);
    assert_eq!(v["input_file"]["path"], "batch.jsonl");
    assert!(v["log"]
        .as_str()
        .unwrap()
        .ends_with(&format!("logs/tasks/{}.log", f.b)));
    let missing = site.fails(&["show", &TaskId::new().to_string()]);
    assert!(missing.contains("no task"), "{missing}");
}

#[tokio::test]
async fn status_json_counts_states_and_sees_the_daemon_lock() {
    let site = Site::new();
    let ledger = site.ledger().await;
    fill(&ledger).await;
    let v = site.json(&["status", "--json"]);
    assert_eq!(v["tasks"]["total"], 5);
    assert_eq!(
        (
            &v["tasks"]["queued"],
            &v["tasks"]["succeeded"],
            &v["tasks"]["failed"],
            &v["tasks"]["dead"],
            &v["tasks"]["running"]
        ),
        (
            &Value::from(1),
            &Value::from(1),
            &Value::from(1),
            &Value::from(2),
            &Value::from(0)
        )
    );
    assert_eq!(
        v["failed_by_class"],
        serde_json::json!({"oom": 1, "timeout": 1, "invalid_input": 1})
    );
    assert_eq!(v["input_files"], 2);
    assert_eq!(v["daemon_running"], false);
    assert_eq!(
        PathBuf::from(v["ledger"].as_str().unwrap()),
        site.path().join("kiln.db")
    );
    let lock = ledger.lock_exclusive().await.unwrap();
    assert_eq!(site.json(&["status", "--json"])["daemon_running"], true);
    drop(lock);
    let text = site.ok(&["status"]);
    assert!(text.contains("5 total: 1 queued, 0 running, 1 succeeded, 0 retry_wait, 1 failed, 2 dead, 0 cancelled"), "{text}");
}

#[tokio::test]
async fn status_without_a_ledger_shows_zeros_and_creates_nothing() {
    let site = Site::new();
    let v = site.json(&["status", "--json"]);
    assert_eq!(
        (v["ledger_exists"].as_bool(), v["tasks"]["total"].as_u64()),
        (Some(false), Some(0))
    );
    assert!(!site.path().join("kiln.db").exists());
    assert_eq!(site.json(&["list", "--json"]), serde_json::json!([]));
}

#[tokio::test]
async fn retry_failed_by_class_requeues_only_that_class() {
    let site = Site::new();
    let ledger = site.ledger().await;
    let f = fill(&ledger).await;
    let out = site.ok(&["retry", "--failed", "--class", "oom"]);
    assert!(
        out.contains("requeued 1 failed or dead task(s) of class oom")
            && out.contains(&f.b.to_string()),
        "{out}"
    );
    let b = ledger.get(f.b).await.unwrap().unwrap();
    assert_eq!(
        (b.state, b.attempts, b.error_class),
        (TaskState::Queued, 0, None)
    );
    assert_eq!(
        ledger.get(f.d).await.unwrap().unwrap().state,
        TaskState::Dead,
        "timeout is not oom"
    );
    // By id: the timeout task goes; a succeeded one and the rejected one are refused (exit status 1).
    let out = site.fails(&[
        "retry",
        &f.d.to_string(),
        &f.a.to_string(),
        &f.c.to_string(),
    ]);
    assert!(out.contains(&format!("requeued {}", f.d)), "{out}");
    assert!(out.contains("it is succeeded"), "{out}");
    assert!(out.contains("rejected at intake"), "{out}");
    assert_eq!(
        ledger.get(f.d).await.unwrap().unwrap().state,
        TaskState::Queued
    );
    assert_eq!(
        ledger.get(f.a).await.unwrap().unwrap().state,
        TaskState::Succeeded
    );
    // Nothing left to retry in `failed`/`dead` that has a request.
    assert!(site.ok(&["retry", "--failed"]).contains("requeued 0"));
    assert!(site.fails(&["retry"]).contains("required"));
    assert!(site
        .fails(&["retry", "--failed", "--class", "gpu"])
        .contains("unknown error class"));
}

#[tokio::test]
async fn logs_prints_the_task_log_and_follows_it_until_the_task_ends() {
    let site = Site::new();
    let ledger = site.ledger().await;
    let f = fill(&ledger).await;
    let tasks_dir = site.path().join("logs/tasks");
    std::fs::create_dir_all(&tasks_dir).unwrap();
    let log = tasks_dir.join(format!("{}.log", f.b));
    let content = "2026-05-01T10:00:00.000Z INFO intake batch.jsonl line 2\n\
                   2026-05-01T10:00:01.000Z ERROR attempt 1 failed: oom: KV cache cannot hold 900 tokens\n";
    std::fs::write(&log, content).unwrap();
    assert_eq!(site.ok(&["logs", &f.b.to_string()]), content);
    assert_eq!(
        site.ok(&["logs", &f.b.to_string()[..30]]),
        content,
        "by prefix"
    );
    assert!(site
        .fails(&["logs", &f.a.to_string()])
        .contains("no log for task"));

    // --follow on a queued task: prints what is there, what is appended, and ends once the task is done.
    let note_log = tasks_dir.join(format!("{}.log", f.note));
    std::fs::write(&note_log, "line one\n").unwrap();
    let child = site
        .command(&["logs", "--follow", &f.note.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    append(&note_log, "line two\n");
    let claimed = ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    assert_eq!(claimed[0].task_id, f.note);
    append(&note_log, "line three\n");
    ledger
        .finish_success(f.note, "{}", AttemptStats::default())
        .await
        .unwrap();
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "--follow ends after the task is terminal"
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "line one\nline two\nline three\n"
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

#[tokio::test]
async fn submit_copies_atomically_and_force_asks_for_a_rerun() {
    let site = Site::new();
    let src = site.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("q.txt"), "What is the capital of France?").unwrap();
    std::fs::write(src.join("data.csv"), "a,b").unwrap();
    let q = src.join("q.txt");
    let out = site.ok(&["submit", q.to_str().unwrap()]);
    assert!(out.contains("submitted"), "{out}");
    let dest = site.path().join("inputs/q.txt");
    assert_eq!(
        std::fs::read_to_string(&dest).unwrap(),
        "What is the capital of France?"
    );
    let leftovers: Vec<_> = std::fs::read_dir(site.path().join("inputs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["q.txt"], "no temporary file left behind");
    assert!(site
        .fails(&["submit", src.join("data.csv").to_str().unwrap()])
        .contains(".txt, .md, .json and .jsonl"));

    // The daemon records it; submitting the same content again is refused without --force.
    let ledger = site.ledger().await;
    let f = input("q.txt", "What is the capital of France?");
    let task = NewTask {
        line: None,
        custom_id: None,
        body: NewTaskBody::Request("{}".into()),
    };
    ledger
        .record_input_file(&f, std::slice::from_ref(&task))
        .await
        .unwrap()
        .unwrap();
    assert!(site
        .fails(&["submit", q.to_str().unwrap()])
        .contains("already ran"));
    assert_eq!(
        ledger
            .record_input_file(&f, std::slice::from_ref(&task))
            .await
            .unwrap(),
        None
    );
    site.ok(&["submit", "--force", q.to_str().unwrap()]);
    let again = ledger
        .record_input_file(&f, std::slice::from_ref(&task))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.generation, 1,
        "--force makes the next intake run it again"
    );

    // A different file of the same name in inputs/ is not replaced without --force.
    std::fs::write(src.join("q.txt"), "changed").unwrap();
    std::fs::write(&dest, "someone else's").unwrap();
    assert!(site
        .fails(&["submit", q.to_str().unwrap()])
        .contains("different content"));
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "someone else's");
    site.ok(&["submit", "--force", q.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "changed");
}

#[tokio::test]
async fn config_errors_and_env_overrides_reach_the_commands() {
    let site = Site::new();
    std::fs::write(
        site.path().join("config.toml"),
        "[daemon]\nconcurency = 2\n",
    )
    .unwrap();
    let err = site.fails(&["status"]);
    assert!(err.contains("concurency"), "{err}");
    std::fs::write(site.path().join("config.toml"), "").unwrap();
    let other = site.path().join("elsewhere/k.db");
    let out = site
        .command(&["status", "--json"])
        .env("KILN_DAEMON_LEDGER", &other)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(PathBuf::from(v["ledger"].as_str().unwrap()), other);
    let missing = site.path().join("nope.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--config")
        .arg(&missing)
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.toml"));
}
