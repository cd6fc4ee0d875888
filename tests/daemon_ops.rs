//! The daemon run for weeks unattended (issue 11): generation caps, `kiln cancel`, full engine
//! batches with the default concurrency, and sticky device faults.
//!
//! Two engines stand in for a real model: the scripted test double of `daemon_support` (answers
//! by prompt) and the real engine loop over [`StepRunner`], a tiny model that only emits `a`
//! tokens, records how many sequences each forward step holds, and can be told to fail with the
//! text of a sticky CUDA error.
//!
//! Run: `cargo test --test daemon_ops`.

mod daemon_support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon_support::*;
use kiln::config::Config;
use kiln::daemon::{self, DaemonError, RunOptions};
use kiln::engine::handle::EngineCommand;
use kiln::engine::{test_support, EngineConfig, EngineHandle};
use kiln::error::EngineError;
use kiln::ledger::{AttemptOutcome, CancelResult, TaskState};
use kiln::model::step::{CacheGeometry, ForwardBatch, ForwardOutput, LogitsFor, ModelRunner};
use kiln::sampling::sample_row;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const VOCAB: usize = 257;

/// Engine request ids seen by a test double.
type Ids = Arc<Mutex<Vec<u64>>>;

/// (prompt, max_tokens) of each request an engine double saw.
type Seen = Arc<Mutex<Vec<(String, Option<u32>)>>>;
const CHAT_TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
const STICKY: &str = "device error: CUDA driver: DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")";

/// A model that always prefers token `a` (never EOS, so a request runs to its `max_tokens`).
struct StepRunner {
    batch_sizes: Arc<Mutex<Vec<usize>>>,
    /// While set, every step fails as a sticky CUDA fault would.
    faulty: Arc<AtomicBool>,
    steps: Arc<AtomicUsize>,
    step_delay: Duration,
}

impl ModelRunner for StepRunner {
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn max_position_embeddings(&self) -> usize {
        4096
    }
    fn cache_geometry(&self) -> CacheGeometry {
        CacheGeometry {
            block_size: 16,
            num_blocks: 1024,
            num_state_slots: 0,
        }
    }
    fn device_name(&self) -> String {
        "step-runner".into()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, EngineError> {
        std::thread::sleep(self.step_delay);
        self.steps.fetch_add(1, Ordering::Relaxed);
        if self.faulty.load(Ordering::Relaxed) {
            return Err(EngineError::Internal(STICKY.into()));
        }
        self.batch_sizes.lock().unwrap().push(batch.seqs.len());
        let mut row = vec![0.0f32; VOCAB];
        row[b'a' as usize] = 5.0;
        let mut out = ForwardOutput::default();
        for s in &batch.seqs {
            match &s.logits {
                LogitsFor::Sample(desc) => out.samples.push(sample_row(&row, desc)),
                LogitsFor::None => {}
                LogitsFor::Last => out.logits.extend(&row),
                LogitsFor::All => {
                    for _ in 0..s.len {
                        out.logits.extend(&row);
                    }
                }
            }
        }
        Ok(out)
    }
    fn copy_block(&mut self, _src: u32, _dst: u32) -> Result<(), EngineError> {
        Ok(())
    }
}

struct Probe {
    batch_sizes: Arc<Mutex<Vec<usize>>>,
    faulty: Arc<AtomicBool>,
    steps: Arc<AtomicUsize>,
}

/// The real engine loop over a [`StepRunner`], with the engine settings of `config`.
fn step_engine(config: &Config, faulty: bool) -> (EngineHandle, Probe) {
    let probe = Probe {
        batch_sizes: Arc::default(),
        faulty: Arc::new(AtomicBool::new(faulty)),
        steps: Arc::default(),
    };
    let runner = StepRunner {
        batch_sizes: probe.batch_sizes.clone(),
        faulty: probe.faulty.clone(),
        steps: probe.steps.clone(),
        step_delay: Duration::from_millis(2),
    };
    let mut tok = test_support::byte_tokenizer();
    tok.chat_template = Some(CHAT_TEMPLATE.into());
    let cfg: EngineConfig = config.engine.clone();
    let handle = kiln::engine::spawn(Box::new(runner), tok, cfg, "step").expect("engine starts");
    (handle, probe)
}

#[tokio::test]
async fn every_task_gets_a_generation_cap_and_text_tasks_may_set_their_own() {
    let env = Env::new();
    env.drop_input("plain.txt", "Count from 32 to 35.");
    env.drop_input(
        "front.md",
        "---\nmax_tokens: 7\ntemperature: 0\nsystem: Be brief.\n---\nCount from 1 to 3.\n",
    );
    let req =
        json!({ "messages": [{ "role": "user", "content": "json" }], "max_completion_tokens": 16 });
    env.drop_input("own.json", req.to_string());
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let engine = EngineHandle::from_fn(info(), move |r| {
        s.lock()
            .unwrap()
            .push((prompt_text(&r), r.sampling.max_tokens));
        async move { Ok(completion("ok")) }
    });
    let summary = env.run_once(&engine).await;
    assert_eq!(summary.dispatch.succeeded, 3, "{summary:?}");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("Count from 1 to 3.".to_string(), Some(7)),
            ("Count from 32 to 35.".to_string(), Some(1024)),
            ("json".to_string(), Some(16)),
        ],
        "the default cap (daemon.default_max_tokens), the front matter's, the request's own"
    );
}

/// An engine double served by the test: it never answers, and records submits and cancels.
fn hanging_engine() -> (EngineHandle, Ids, Ids) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let submitted: Ids = Arc::default();
    let cancelled: Ids = Arc::default();
    let (s, c) = (submitted.clone(), cancelled.clone());
    tokio::spawn(async move {
        let mut replies = Vec::new();
        while let Some(cmd) = rx.recv().await {
            match cmd {
                EngineCommand::Submit { id, reply, .. } => {
                    s.lock().unwrap().push(id);
                    replies.push(reply); // never answered
                }
                EngineCommand::Cancel { id } => c.lock().unwrap().push(id),
                EngineCommand::Stats { reply } => {
                    let _ = reply.send(Default::default());
                }
                EngineCommand::Shutdown => break,
            }
        }
    });
    (EngineHandle::from_channel(tx, info()), submitted, cancelled)
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_task_in_the_engine_and_a_queued_one_at_once() {
    let mut env = Env::new();
    env.config.daemon.concurrency = 1;
    env.drop_input(
        "b.jsonl",
        [batch_line("first", "hang"), batch_line("second", "hang")].join("\n") + "\n",
    );
    let (engine, submitted, cancelled) = hanging_engine();
    let ledger = env.ledger().await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (config, ledger, engine, shutdown) = (
            env.config.clone(),
            ledger.clone(),
            engine.clone(),
            shutdown.clone(),
        );
        async move { daemon::run(&config, ledger, engine, shutdown, RunOptions::default()).await }
    });
    wait_for("the first task to reach the engine", || {
        submitted.lock().unwrap().len() == 1
    })
    .await;
    let tasks = tasks_of(&ledger, "b.jsonl").await;
    let running = tasks
        .iter()
        .find(|t| t.state == TaskState::Running)
        .unwrap();
    let queued = tasks.iter().find(|t| t.state == TaskState::Queued).unwrap();

    // What `kiln cancel` does, through a second handle on the ledger as the CLI would.
    let cli = env.ledger().await;
    let r = cli
        .request_cancel(&[running.task_id, queued.task_id])
        .await
        .unwrap();
    assert_eq!(
        r,
        vec![
            (running.task_id, CancelResult::Requested),
            (queued.task_id, CancelResult::Cancelled)
        ]
    );
    let engine_id = submitted.lock().unwrap()[0];
    wait_for("the engine request to be cancelled", || {
        cancelled.lock().unwrap().contains(&engine_id)
    })
    .await;
    for _ in 0..100 {
        if ledger.get(running.task_id).await.unwrap().unwrap().state == TaskState::Cancelled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = ledger.get(running.task_id).await.unwrap().unwrap();
    assert_eq!(t.state, TaskState::Cancelled, "{t:?}");
    assert_eq!(
        ledger.get(queued.task_id).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    assert_eq!(
        submitted.lock().unwrap().len(),
        1,
        "the cancelled queued task never reached the engine"
    );
    // Cancelling again says it already ended; the outputs say "cancelled".
    let again = cli.request_cancel(&[running.task_id]).await.unwrap();
    assert_eq!(
        again[0].1,
        CancelResult::AlreadyFinished {
            state: TaskState::Cancelled
        }
    );
    wait_for("the error file", || env.output("b.errors.jsonl").is_some()).await;
    let errs = env.output_lines("b.errors.jsonl");
    assert_eq!(errs.len(), 2, "{errs:?}");
    shutdown.cancel();
    run.await.unwrap().expect("daemon ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_queued_tasks_share_engine_steps_with_the_default_config() {
    let mut env = Env::new();
    let defaults = Config::default();
    env.config.daemon.concurrency = defaults.daemon.concurrency;
    env.config.engine = defaults.engine.clone();
    assert_eq!(env.config.engine.max_num_seqs, 16);
    let lines: Vec<String> = (0..16)
        .map(|i| {
            json!({ "custom_id": format!("r{i}"), "body": {
                "messages": [{ "role": "user", "content": format!("q{i}") }], "max_tokens": 24 } })
            .to_string()
        })
        .collect();
    env.drop_input("b.jsonl", lines.join("\n") + "\n");
    let (engine, probe) = step_engine(&env.config, false);
    let summary = env.run_once(&engine).await;
    engine.shutdown();
    assert_eq!(summary.dispatch.succeeded, 16, "{summary:?}");
    let sizes = probe.batch_sizes.lock().unwrap().clone();
    let widest = sizes.iter().copied().max().unwrap_or(0);
    assert_eq!(
        widest, 16,
        "with the default daemon.concurrency every engine slot is used (steps: {sizes:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_device_fault_stops_the_engine_and_the_daemon_without_using_attempts() {
    let mut env = Env::new();
    env.config.engine.max_num_seqs = 4;
    let lines: Vec<String> = (0..6)
        .map(|i| batch_line(&format!("r{i}"), &format!("q{i}")))
        .collect();
    env.drop_input("b.jsonl", lines.join("\n") + "\n");

    let (engine, probe) = step_engine(&env.config, true);
    let ledger = env.ledger().await;
    let opts = RunOptions {
        once: true,
        ..Default::default()
    };
    let err = daemon::run(
        &env.config,
        ledger.clone(),
        engine.clone(),
        CancellationToken::new(),
        opts,
    )
    .await
    .expect_err("the daemon must stop on a sticky device fault");
    // Which one the daemon sees first depends on which attempt it hears from first: one whose
    // request the engine failed with the fault, or one submitted as the engine thread ended.
    assert!(
        matches!(&err, DaemonError::DeviceLost(m) if m.contains("CUDA_ERROR_ILLEGAL_ADDRESS"))
            || matches!(&err, DaemonError::EngineStopped),
        "{err}"
    );
    // The engine stopped after the first failed step instead of failing step after step.
    assert_eq!(probe.steps.load(Ordering::Relaxed), 1);
    assert!(engine.stats().await.is_none(), "the engine thread ended");
    let tasks = tasks_of(&ledger, "b.jsonl").await;
    assert_eq!(count_state(&tasks, TaskState::Queued), 6, "{tasks:?}");
    for t in &tasks {
        assert_eq!(
            t.attempts, 0,
            "an interrupted attempt is not counted: {t:?}"
        );
        for a in ledger.attempts(t.task_id).await.unwrap() {
            assert_eq!(a.outcome, Some(AttemptOutcome::Interrupted));
        }
    }
    ledger.close().await;

    // The restart (systemd's job) on a healthy device finishes everything exactly once.
    let (engine, _) = step_engine(&env.config, false);
    let summary = env.run_once(&engine).await;
    engine.shutdown();
    assert_eq!(summary.dispatch.succeeded, 6, "{summary:?}");
    assert_eq!(env.output_lines("b.output.jsonl").len(), 6);
}

#[tokio::test]
async fn a_successful_retry_removes_the_stale_error_file_and_numbers_attempts_as_the_ledger() {
    let env = Env::new();
    env.drop_input("q.txt", "flaky");
    let (engine, _) = scripted_engine(|_, n| {
        if n == 1 {
            Err(EngineError::InvalidInput("prompt too long".into()))
        } else {
            Ok("fine".into())
        }
    });
    env.run_once(&engine).await;
    assert!(
        env.output("q.error.json").is_some(),
        "{:?}",
        env.output_names()
    );
    let ledger = env.ledger().await;
    let task = tasks_of(&ledger, "q.txt").await.remove(0);
    assert_eq!(task.state, TaskState::Failed);
    ledger.retry(&[task.task_id]).await.unwrap();
    ledger.close().await;

    env.run_once(&engine).await;
    assert_eq!(env.output("q.md").unwrap(), b"fine\n");
    assert_eq!(
        env.output_names()
            .iter()
            .filter(|n| n.ends_with(".error.json"))
            .count(),
        0,
        "the stale error file is gone: {:?}",
        env.output_names()
    );
    let ledger = env.ledger().await;
    let task = tasks_of(&ledger, "q.txt").await.remove(0);
    assert_eq!(task.state, TaskState::Succeeded);
    assert_eq!(task.attempt_number, 2);
    let log = env.task_log(&task);
    assert!(log.contains("Attempt 1 failed"), "{log}");
    assert!(log.contains("Attempt 2 started"), "{log}");
    assert!(log.contains("Attempt 2 succeeded"), "{log}");
    assert!(log.contains("Removed the superseded error file"), "{log}");
}
