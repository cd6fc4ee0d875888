//! Shutdown: intake stops, in-flight attempts finish within the grace period, the rest go back to
//! `queued` without counting the attempt, and the next run finishes them exactly once.

mod daemon_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use daemon_support::*;
use kiln::daemon::{self, RunOptions};
use kiln::engine::{EngineHandle, GenerateRequest};
use kiln::ledger::{AttemptOutcome, TaskState};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn shutdown_lets_inflight_finish_within_grace_and_requeues_the_rest() {
    let mut env = Env::new();
    env.config.daemon.concurrency = 4;
    env.config.daemon.shutdown_grace_secs = 1;
    let lines = [
        batch_line("fast-1", "fast 1"),
        batch_line("slow-1", "slow 1"),
        batch_line("fast-2", "fast 2"),
        batch_line("slow-2", "slow 2"),
    ];
    env.drop_input("batch.jsonl", lines.join("\n"));

    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let engine = EngineHandle::from_fn(info(), move |req: GenerateRequest| {
        let s = s.clone();
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            let p = prompt_text(&req);
            // Fast ones finish inside the grace period, slow ones would take a minute.
            let d = if p.starts_with("fast") {
                Duration::from_millis(400)
            } else {
                Duration::from_secs(60)
            };
            tokio::time::sleep(d).await;
            Ok(completion(&format!("done {p}")))
        }
    });

    let ledger = env.ledger().await;
    let token = CancellationToken::new();
    let run = {
        let (config, ledger, engine, token) = (
            env.config.clone(),
            ledger.clone(),
            engine.clone(),
            token.clone(),
        );
        tokio::spawn(async move {
            daemon::run(&config, ledger, engine, token, RunOptions::default()).await
        })
    };
    let t0 = std::time::Instant::now();
    while started.load(Ordering::SeqCst) < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "attempts did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A file dropped after the stop request is not taken.
    token.cancel();
    env.drop_input("late.txt", "too late");
    let stop = std::time::Instant::now();
    let summary = run.await.expect("join").expect("daemon run");
    assert!(
        stop.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        stop.elapsed()
    );
    assert!(summary.shut_down);
    assert_eq!(summary.dispatch.succeeded, 2);
    assert_eq!(summary.dispatch.interrupted, 2);

    let tasks = tasks_of(&ledger, "batch.jsonl").await;
    for t in &tasks {
        let cid = t.custom_id.as_deref().unwrap();
        let rows = ledger.attempts(t.task_id).await.unwrap();
        if cid.starts_with("fast") {
            assert_eq!(t.state, TaskState::Succeeded, "{cid}");
        } else {
            assert_eq!(
                (t.state, t.attempts),
                (TaskState::Queued, 0),
                "{cid}: the cut attempt does not count"
            );
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].outcome, Some(AttemptOutcome::Interrupted));
            assert!(
                env.task_log(t).contains("interrupted"),
                "{}",
                env.task_log(t)
            );
        }
    }
    assert!(
        tasks_of(&ledger, "late.txt").await.is_empty(),
        "intake stopped at the stop request"
    );
    assert!(
        env.outputs().is_empty(),
        "no partial batch output while tasks remain: {:?}",
        env.output_names()
    );

    // The next run finishes the rest: every task succeeded exactly once, one output file.
    let fast = echo_engine();
    let s2 = env.run_once(&fast).await;
    assert_eq!(
        s2.dispatch.succeeded, 3,
        "the two interrupted tasks and late.txt"
    );
    let tasks = tasks_of(&ledger, "batch.jsonl").await;
    for t in &tasks {
        assert_eq!(t.state, TaskState::Succeeded);
        let rows = ledger.attempts(t.task_id).await.unwrap();
        let ok = rows
            .iter()
            .filter(|r| r.outcome == Some(AttemptOutcome::Succeeded))
            .count();
        assert_eq!(ok, 1, "{:?} succeeded {ok} times", t.custom_id);
    }
    let out = env.output_lines("batch.output.jsonl");
    let mut ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec!["fast-1", "fast-2", "slow-1", "slow-2"]);
    assert_eq!(
        env.output_names()
            .iter()
            .filter(|n| n.starts_with("batch"))
            .count(),
        1
    );
}
