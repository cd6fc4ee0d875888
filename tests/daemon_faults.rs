//! Fault injection through a scripted engine: every error class, backoff, dead after the class
//! limit, `kiln retry` (through the ledger API), bounded and fair dispatch, and an engine that
//! stops.
//!
//! Time is real, with short backoffs (jitter 0, so the schedule is exact): tokio's paused clock
//! auto-advances whenever the runtime waits on SQLite's worker thread, which fires sqlx's own
//! pool timeouts spuriously (`PoolTimedOut` at open), so it cannot drive a test through the ledger.

mod daemon_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon_support::*;
use kiln::daemon::{self, DaemonError, RunOptions};
use kiln::engine::{EngineHandle, GenerateRequest};
use kiln::error::{EngineError, ErrorClass};
use kiln::ledger::{AttemptOutcome, RetryResult, TaskState};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn json_line(custom_id: &str, content: &str) -> String {
    json!({
        "custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
        "body": { "messages": [{ "role": "user", "content": content }], "temperature": 0.7,
                  "response_format": { "type": "json_object" } },
    })
    .to_string()
}

/// The script: the prompt names the fault, the call number decides when it clears.
fn faults(prompt: &str, n: u32) -> Result<String, EngineError> {
    match prompt {
        "ok" => Ok("fine".into()),
        "oom-twice" if n <= 2 => Err(EngineError::Oom("KV cache full".into())),
        "oom-always" => Err(EngineError::Oom("KV cache full".into())),
        "timeout-always" => Err(EngineError::Timeout("deadline passed".into())),
        "internal-once" if n == 1 => Err(EngineError::Internal("kernel hiccup".into())),
        "internal-always" => Err(EngineError::Internal("kernel hiccup".into())),
        "invalid" => Err(EngineError::InvalidInput(
            "prompt longer than max_model_len".into(),
        )),
        "json-later" if n == 1 => Ok("Sure! Here is JSON: {".into()),
        "json-later" => Ok(r#"{"answer": 42}"#.into()),
        "json-never" => Ok("no json here".into()),
        _ => Ok(format!("done: {prompt}")),
    }
}

#[tokio::test]
async fn every_class_is_retried_or_failed_as_configured() {
    let mut env = Env::new();
    env.config.retry.backoff_base_secs = 0.2;
    env.config.retry.backoff_max_secs = 300.0;
    let lines = [
        batch_line("ok", "ok"),
        batch_line("oom-twice", "oom-twice"),
        batch_line("oom-always", "oom-always"),
        batch_line("timeout-always", "timeout-always"),
        batch_line("internal-once", "internal-once"),
        batch_line("internal-always", "internal-always"),
        batch_line("invalid", "invalid"),
        json_line("json-later", "json-later"),
        json_line("json-never", "json-never"),
    ];
    env.drop_input("batch.jsonl", lines.join("\n") + "\n");
    let (engine, calls) = scripted_engine(faults);
    let summary = env.run_once(&engine).await;
    assert!(!summary.shut_down);
    assert_eq!(summary.unfinished, 0);

    let ledger = env.ledger().await;
    let tasks = tasks_of(&ledger, "batch.jsonl").await;
    assert_eq!(tasks.len(), 9);
    let expect = [
        ("ok", TaskState::Succeeded, 1, None),
        ("oom-twice", TaskState::Succeeded, 3, None),
        ("oom-always", TaskState::Dead, 4, Some(ErrorClass::Oom)),
        (
            "timeout-always",
            TaskState::Dead,
            3,
            Some(ErrorClass::Timeout),
        ),
        ("internal-once", TaskState::Succeeded, 2, None),
        (
            "internal-always",
            TaskState::Dead,
            3,
            Some(ErrorClass::Internal),
        ),
        (
            "invalid",
            TaskState::Failed,
            1,
            Some(ErrorClass::InvalidInput),
        ),
        ("json-later", TaskState::Succeeded, 2, None),
        ("json-never", TaskState::Dead, 3, Some(ErrorClass::Parse)),
    ];
    for (cid, state, attempts, class) in expect {
        let t = tasks
            .iter()
            .find(|t| t.custom_id.as_deref() == Some(cid))
            .expect(cid);
        assert_eq!((t.state, t.attempts), (state, attempts), "{cid}");
        if state != TaskState::Succeeded {
            assert_eq!(t.error_class, class, "{cid}");
        }
        let rows = ledger.attempts(t.task_id).await.expect("attempts");
        assert_eq!(
            rows.len() as u32,
            attempts,
            "{cid}: one attempts row per attempt"
        );
        let last = rows.last().and_then(|r| r.outcome);
        let want = match class {
            None => AttemptOutcome::Succeeded,
            Some(c) if state != TaskState::Succeeded => AttemptOutcome::Failed(c),
            Some(_) => unreachable!(),
        };
        assert_eq!(last, Some(want), "{cid}");
        let n_calls = calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.prompt == cid)
            .count() as u32;
        assert_eq!(n_calls, attempts, "{cid}: engine calls");
    }

    // Backoff: 0.2 s, then 0.4 s (jitter 0).
    let at: Vec<tokio::time::Instant> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.prompt == "oom-twice")
        .map(|c| c.at)
        .collect();
    for (gap, want) in at.windows(2).map(|w| w[1] - w[0]).zip([0.2, 0.4]) {
        let g = gap.as_secs_f64();
        assert!(
            g >= want && g < want + 1.0,
            "backoff gap {g}s, expected about {want}s"
        );
    }

    // A response_format failure is retried with a new seed.
    let seeds: Vec<Option<u64>> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.prompt == "json-never")
        .map(|c| c.seed)
        .collect();
    assert_eq!(seeds.len(), 3);
    assert_eq!(seeds[0], None);
    assert!(
        seeds[1].is_some() && seeds[2].is_some() && seeds[1] != seeds[2],
        "{seeds:?}"
    );

    // Outputs: successes and failures, OpenAI batch format, `id` = task id, custom_id echoed.
    let out = env.output_lines("batch.output.jsonl");
    let ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["ok", "oom-twice", "internal-once", "json-later"]);
    for l in &out {
        let t = tasks
            .iter()
            .find(|t| Some(t.custom_id.as_deref().unwrap()) == l["custom_id"].as_str())
            .unwrap();
        assert_eq!(l["id"], t.task_id.to_string());
        assert_eq!(l["response"]["status_code"], 200);
        assert_eq!(l["response"]["body"]["object"], "chat.completion");
        assert_eq!(l["response"]["body"]["model"], "test-model");
    }
    assert_eq!(
        out[3]["response"]["body"]["choices"][0]["message"]["content"],
        r#"{"answer": 42}"#
    );
    let err = env.output_lines("batch.errors.jsonl");
    let codes: Vec<(String, Value)> = err
        .iter()
        .map(|l| {
            let code = l["error"]["code"].clone();
            let code = if code.is_null() {
                l["response"]["body"]["error"]["code"].clone()
            } else {
                code
            };
            (l["custom_id"].as_str().unwrap().to_string(), code)
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ("oom-always".into(), json!("oom")),
            ("timeout-always".into(), json!("timeout")),
            ("internal-always".into(), json!("internal")),
            ("invalid".into(), json!("invalid_input")),
            ("json-never".into(), json!("parse")),
        ]
    );
    let invalid = err.iter().find(|l| l["custom_id"] == "invalid").unwrap();
    assert_eq!(invalid["response"]["status_code"], 400);
    let never = err.iter().find(|l| l["custom_id"] == "json-never").unwrap();
    let msg = never["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("not valid JSON") && msg.contains("after 3 attempts"),
        "{msg}"
    );

    // Every task's outputs path is recorded and its log tells the story.
    for t in all_tasks(&ledger).await {
        assert!(
            t.output_path.is_some(),
            "{:?} has no output path",
            t.custom_id
        );
    }
    let t = tasks
        .iter()
        .find(|t| t.custom_id.as_deref() == Some("oom-twice"))
        .unwrap();
    let log = env.task_log(t);
    assert!(
        log.contains("Taken from inputs/batch.jsonl line 2 (custom_id `oom-twice`)"),
        "{log}"
    );
    assert!(
        log.contains("Attempt 1 failed (oom): out of memory: KV cache full. Retrying in 0.2s"),
        "{log}"
    );
    assert!(log.contains("Attempt 3 succeeded"), "{log}");
    assert!(log.contains("Output written"), "{log}");
}

#[tokio::test]
async fn a_wedged_engine_times_out_per_attempt() {
    let mut env = Env::new();
    env.config.daemon.task_timeout_secs = 1;
    env.config.retry.max_attempts.timeout = 2;
    env.config.retry.backoff_base_secs = 0.1;
    env.drop_input("slow.txt", "never answers");
    let engine = EngineHandle::from_fn(info(), |_req: GenerateRequest| async move {
        // Wedged: no answer, no error (the daemon's own deadline must fire).
        std::future::pending::<Result<kiln::engine::Completion, EngineError>>().await
    });
    let t0 = tokio::time::Instant::now();
    env.run_once(&engine).await;
    let ledger = env.ledger().await;
    let t = &tasks_of(&ledger, "slow.txt").await[0];
    assert_eq!(
        (t.state, t.attempts, t.error_class),
        (TaskState::Dead, 2, Some(ErrorClass::Timeout))
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "two attempts of 1 s each: {:?}",
        t0.elapsed()
    );
    let e = env.output_json("slow.error.json");
    assert_eq!(e["error_class"], "timeout");
    assert_eq!(e["state"], "dead");
    assert!(
        e["error"].as_str().unwrap().contains("task timeout of 1s"),
        "{e}"
    );
}

#[tokio::test]
async fn kiln_retry_requeues_dead_tasks_and_outputs_are_reassembled() {
    let mut env = Env::new();
    env.config.retry.max_attempts.internal = 2;
    env.config.retry.backoff_base_secs = 0.1;
    env.drop_input(
        "mixed.jsonl",
        [batch_line("a", "ok"), batch_line("b", "flaky")].join("\n"),
    );
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = healthy.clone();
    let (engine, _calls) = scripted_engine(move |p, _| {
        if p == "flaky" && !h.load(Ordering::SeqCst) {
            Err(EngineError::Internal("boom".into()))
        } else {
            Ok(format!("answer to {p}"))
        }
    });
    env.run_once(&engine).await;
    let ledger = env.ledger().await;
    let b = tasks_of(&ledger, "mixed.jsonl")
        .await
        .into_iter()
        .find(|t| t.custom_id.as_deref() == Some("b"))
        .unwrap();
    assert_eq!(b.state, TaskState::Dead);
    let first_out = env.output("mixed.output.jsonl").expect("output");
    let first_err = env.output("mixed.errors.jsonl").expect("errors");

    // `kiln retry ID` (ledger API): back to queued with a fresh budget; the next run succeeds.
    let r = ledger.retry(&[b.task_id]).await.expect("retry");
    assert_eq!(r, vec![(b.task_id, RetryResult::Requeued)]);
    healthy.store(true, Ordering::SeqCst);
    let s = env.run_once(&engine).await;
    assert_eq!(s.dispatch.succeeded, 1, "only the retried task runs again");
    let tasks = tasks_of(&ledger, "mixed.jsonl").await;
    assert!(
        tasks.iter().all(|t| t.state == TaskState::Succeeded),
        "{tasks:?}"
    );

    // The first results are untouched, the stale error file of the retried task is removed (issue
    // 11: it no longer sits beside the new result); the re-assembled file has both answers under a
    // suffix.
    assert_eq!(env.output("mixed.output.jsonl").unwrap(), first_out);
    assert!(!first_err.is_empty());
    assert!(
        env.output("mixed.errors.jsonl").is_none(),
        "{:?}",
        env.output_names()
    );
    let again = env.output_lines("mixed-1.output.jsonl");
    let ids: Vec<&str> = again
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert!(
        env.output("mixed-1.errors.jsonl").is_none(),
        "no failures left"
    );
    for t in &tasks {
        assert!(
            t.output_path
                .as_deref()
                .unwrap()
                .ends_with("mixed-1.output.jsonl"),
            "{:?}",
            t.output_path
        );
    }
    // Retrying everything that failed, by class, through the ledger.
    assert!(ledger
        .retry_failed(Some(ErrorClass::Internal))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn dispatch_is_bounded_and_fair_across_files() {
    let mut env = Env::new();
    env.config.daemon.concurrency = 2;
    let many: Vec<String> = (0..8)
        .map(|i| batch_line(&format!("a{i}"), &format!("big {i}")))
        .collect();
    env.drop_input("big.jsonl", many.join("\n"));
    env.drop_input(
        "small.jsonl",
        [batch_line("s0", "small 0"), batch_line("s1", "small 1")].join("\n"),
    );
    let now = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let (n, p, o) = (now.clone(), peak.clone(), order.clone());
    let engine = EngineHandle::from_fn(info(), move |req: GenerateRequest| {
        let (n, p, o) = (n.clone(), p.clone(), o.clone());
        async move {
            let cur = n.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(cur, Ordering::SeqCst);
            o.lock().unwrap().push(prompt_text(&req));
            tokio::time::sleep(Duration::from_millis(30)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Ok(completion("x"))
        }
    });
    let s = env.run_once(&engine).await;
    assert_eq!(s.dispatch.succeeded, 10);
    assert!(
        peak.load(Ordering::SeqCst) <= 2,
        "at most `concurrency` in flight"
    );
    assert_eq!(peak.load(Ordering::SeqCst), 2, "the slots are used");
    // Both files are stable at the same time: the small one is not starved behind the big one.
    let order = order.lock().unwrap().clone();
    let last_small = order.iter().rposition(|p| p.starts_with("small")).unwrap();
    assert!(last_small < 6, "small file's tasks ran late: {order:?}");
}

#[tokio::test]
async fn a_stopped_engine_fails_the_daemon_not_the_tasks() {
    let env = Env::new();
    env.drop_input("q.txt", "hello");
    let engine = echo_engine();
    engine.shutdown();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ledger = env.ledger().await;
    let opts = RunOptions {
        once: true,
        ..Default::default()
    };
    let r = daemon::run(
        &env.config,
        ledger.clone(),
        engine,
        CancellationToken::new(),
        opts,
    )
    .await;
    assert!(matches!(r, Err(DaemonError::EngineStopped)), "{r:?}");
    let t = &tasks_of(&ledger, "q.txt").await[0];
    assert_eq!(
        (t.state, t.attempts),
        (TaskState::Queued, 0),
        "the attempt is not counted"
    );
    let rows = ledger.attempts(t.task_id).await.unwrap();
    assert_eq!(rows[0].outcome, Some(AttemptOutcome::Interrupted));
}
