//! Ledger integration tests: every transition and its guard, concurrent claimers (one pool and two
//! pools on one file), crash recovery, `kiln retry` semantics, fairness across input files, dedupe.
//!
//! Run: `cargo test --test ledger`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use kiln::error::ErrorClass;
use kiln::ledger::{
    AttemptOutcome, AttemptStats, InputKind, Ledger, LedgerError, ListFilter, NewInputFile,
    NewTask, NewTaskBody, RetryResult, TaskId, TaskState, UnixMillis,
};
use sha2::Digest;

async fn open_temp() -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("kiln.db")).await.unwrap();
    (dir, ledger)
}

fn file(path: &str, content: &str) -> NewInputFile {
    NewInputFile {
        path: path.into(),
        sha256: hex::encode(sha2::Sha256::digest(content.as_bytes())),
        size: content.len() as u64,
        kind: InputKind::from_path(path.as_ref()).unwrap(),
    }
}

fn lines(n: u32) -> Vec<NewTask> {
    (1..=n)
        .map(|i| NewTask {
            line: Some(i),
            custom_id: Some(format!("req-{i}")),
            body: NewTaskBody::Request(format!("{{\"messages\":[],\"i\":{i}}}")),
        })
        .collect()
}

/// Record `path` with `n` line tasks; returns the task ids in line order.
async fn seed(ledger: &Ledger, path: &str, n: u32) -> Vec<TaskId> {
    ledger
        .record_input_file(&file(path, &format!("{path}:{n}")), &lines(n))
        .await
        .unwrap()
        .unwrap()
        .task_ids
}

async fn state(ledger: &Ledger, id: TaskId) -> TaskState {
    ledger.get(id).await.unwrap().unwrap().state
}

async fn claim_one(ledger: &Ledger) -> TaskId {
    let claimed = ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    assert_eq!(claimed.len(), 1, "expected one claim");
    claimed[0].task_id
}

fn expect_conflict(err: LedgerError, expected: TaskState, found: Option<TaskState>) {
    match err {
        LedgerError::Conflict {
            expected_state,
            found: f,
            ..
        } => {
            assert_eq!((expected_state, f), (expected, found));
        }
        other => panic!("expected a conflict, got {other}"),
    }
}

#[tokio::test]
async fn a_second_claimer_gets_nothing() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "one.txt", 1).await;
    let first = ledger.claim_next(5, UnixMillis::now()).await.unwrap();
    assert_eq!(first.iter().map(|t| t.task_id).collect::<Vec<_>>(), ids);
    assert!(ledger
        .claim_next(5, UnixMillis::now())
        .await
        .unwrap()
        .is_empty());
    assert_eq!(state(&ledger, ids[0]).await, TaskState::Running);
    assert_eq!(
        ledger.claim_next(0, UnixMillis::now()).await.unwrap(),
        vec![]
    );
}

#[tokio::test]
async fn finish_requires_running() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "a.jsonl", 2).await;
    let stats = AttemptStats::default();
    // queued: neither success nor failure nor release.
    expect_conflict(
        ledger
            .finish_success(ids[0], "{}", stats)
            .await
            .unwrap_err(),
        TaskState::Running,
        Some(TaskState::Queued),
    );
    expect_conflict(
        ledger
            .finish_failure(ids[0], ErrorClass::Oom, "x", stats, None)
            .await
            .unwrap_err(),
        TaskState::Running,
        Some(TaskState::Queued),
    );
    expect_conflict(
        ledger
            .release_interrupted(ids[0], "stop")
            .await
            .unwrap_err(),
        TaskState::Running,
        Some(TaskState::Queued),
    );
    // succeeded: a second finish is refused and the first result stays.
    let id = claim_one(&ledger).await;
    ledger
        .finish_success(id, "{\"first\":1}", stats)
        .await
        .unwrap();
    expect_conflict(
        ledger
            .finish_success(id, "{\"second\":2}", stats)
            .await
            .unwrap_err(),
        TaskState::Running,
        Some(TaskState::Succeeded),
    );
    expect_conflict(
        ledger
            .finish_failure(id, ErrorClass::Internal, "late", stats, None)
            .await
            .unwrap_err(),
        TaskState::Running,
        Some(TaskState::Succeeded),
    );
    assert_eq!(
        ledger
            .get(id)
            .await
            .unwrap()
            .unwrap()
            .result_json
            .as_deref(),
        Some("{\"first\":1}")
    );
    // unknown id.
    expect_conflict(
        ledger
            .finish_success(TaskId::new(), "{}", stats)
            .await
            .unwrap_err(),
        TaskState::Running,
        None,
    );
}

#[tokio::test]
async fn failure_goes_to_retry_wait_failed_or_dead() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "f.jsonl", 3).await;
    let stats = AttemptStats {
        prompt_tokens: Some(7),
        ..Default::default()
    };
    let later = UnixMillis::now().after(Duration::from_secs(3600));

    let a = claim_one(&ledger).await;
    let s = ledger
        .finish_failure(a, ErrorClass::Oom, "kv cache full", stats, Some(later))
        .await
        .unwrap();
    assert_eq!(s, TaskState::RetryWait);
    let t = ledger.get(a).await.unwrap().unwrap();
    assert_eq!(
        (t.state, t.next_attempt_at, t.error_class),
        (TaskState::RetryWait, Some(later), Some(ErrorClass::Oom))
    );
    assert_eq!(t.error.as_deref(), Some("kv cache full"));

    // invalid_input is final even when a retry time is given.
    let b = claim_one(&ledger).await;
    let s = ledger
        .finish_failure(
            b,
            ErrorClass::InvalidInput,
            "prompt too long",
            stats,
            Some(later),
        )
        .await
        .unwrap();
    assert_eq!(s, TaskState::Failed);
    assert_eq!(ledger.get(b).await.unwrap().unwrap().next_attempt_at, None);

    // a retryable class with no retry time: attempts used up.
    let c = claim_one(&ledger).await;
    let s = ledger
        .finish_failure(c, ErrorClass::Timeout, "deadline", stats, None)
        .await
        .unwrap();
    assert_eq!(s, TaskState::Dead);

    assert_eq!(
        ids.iter().copied().collect::<HashSet<_>>(),
        HashSet::from([a, b, c])
    );
    let attempts = ledger.attempts(a).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        attempts[0].outcome,
        Some(AttemptOutcome::Failed(ErrorClass::Oom))
    );
    assert_eq!(attempts[0].message.as_deref(), Some("kv cache full"));
    assert_eq!(attempts[0].stats.prompt_tokens, Some(7));
    assert!(attempts[0].finished_at.is_some());
}

#[tokio::test]
async fn retry_wait_is_claimable_once_due() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "w.txt", 1).await;
    let t0 = UnixMillis::now();
    let due = t0.after(Duration::from_secs(60));
    let id = claim_one(&ledger).await;
    ledger
        .finish_failure(
            id,
            ErrorClass::Parse,
            "bad json",
            AttemptStats::default(),
            Some(due),
        )
        .await
        .unwrap();
    assert_eq!(ledger.next_attempt_at().await.unwrap(), Some(due));
    assert!(
        ledger.claim_next(1, t0).await.unwrap().is_empty(),
        "not before next_attempt_at"
    );
    assert!(ledger
        .claim_next(1, UnixMillis(due.0 - 1))
        .await
        .unwrap()
        .is_empty());
    let again = ledger.claim_next(1, due).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (
            again[0].task_id,
            again[0].attempts,
            again[0].next_attempt_at
        ),
        (ids[0], 2, None)
    );
    assert_eq!(
        ledger
            .attempts(id)
            .await
            .unwrap()
            .iter()
            .map(|a| a.n)
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(ledger.next_attempt_at().await.unwrap(), None);
}

#[tokio::test]
async fn release_after_shutdown_does_not_count_the_attempt() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "r.txt", 1).await;
    let id = claim_one(&ledger).await;
    assert_eq!(ledger.get(id).await.unwrap().unwrap().attempts, 1);
    ledger.release_interrupted(id, "shutdown").await.unwrap();
    let t = ledger.get(id).await.unwrap().unwrap();
    assert_eq!((t.state, t.attempts), (TaskState::Queued, 0));
    let again = ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    assert_eq!((again[0].task_id, again[0].attempts), (ids[0], 1));
    let attempts = ledger.attempts(id).await.unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.n, a.outcome))
            .collect::<Vec<_>>(),
        [(1, Some(AttemptOutcome::Interrupted)), (2, None)]
    );
    assert_eq!(attempts[0].message.as_deref(), Some("shutdown"));
}

#[tokio::test]
async fn recover_running_requeues_and_gives_up_after_the_internal_limit() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "crash.jsonl", 2).await;
    let now = UnixMillis::now();
    let claimed = ledger.claim_next(2, now).await.unwrap();
    assert_eq!(claimed.len(), 2);
    // A crash during the first attempts of both tasks.
    let rec = ledger.recover_running(3).await.unwrap();
    assert_eq!(rec.requeued.len(), 2);
    assert!(rec.dead.is_empty());
    for &id in &ids {
        let t = ledger.get(id).await.unwrap().unwrap();
        assert_eq!(
            (t.state, t.attempts),
            (TaskState::Queued, 1),
            "a crashed attempt still counts"
        );
    }
    // A second crash during both second attempts.
    ledger.claim_next(2, now).await.unwrap();
    ledger.recover_running(3).await.unwrap();
    // Task 1 finishes its third attempt; a third crash hits task 0's third attempt: the limit.
    let claimed = ledger.claim_next(2, now).await.unwrap();
    assert_eq!(claimed.len(), 2);
    ledger
        .finish_success(ids[1], "{}", AttemptStats::default())
        .await
        .unwrap();
    let rec = ledger.recover_running(3).await.unwrap();
    assert_eq!((rec.requeued, rec.dead), (vec![], vec![ids[0]]));
    let t = ledger.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(
        (t.state, t.error_class, t.attempts),
        (TaskState::Dead, Some(ErrorClass::Internal), 3)
    );
    assert!(t.error.unwrap().contains("giving up"));
    let outcomes: Vec<_> = ledger
        .attempts(ids[0])
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(outcomes, vec![Some(AttemptOutcome::Interrupted); 3]);
    // Nothing running: a no-op.
    let rec = ledger.recover_running(3).await.unwrap();
    assert!(rec.requeued.is_empty() && rec.dead.is_empty());
    assert_eq!(state(&ledger, ids[1]).await, TaskState::Succeeded);
}

#[tokio::test]
async fn cancel_only_from_queued_or_retry_wait() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "c.jsonl", 3).await;
    ledger.cancel(ids[2]).await.unwrap();
    assert_eq!(state(&ledger, ids[2]).await, TaskState::Cancelled);
    expect_conflict(
        ledger.cancel(ids[2]).await.unwrap_err(),
        TaskState::Queued,
        Some(TaskState::Cancelled),
    );
    let running = claim_one(&ledger).await;
    expect_conflict(
        ledger.cancel(running).await.unwrap_err(),
        TaskState::Queued,
        Some(TaskState::Running),
    );
    ledger
        .finish_failure(
            running,
            ErrorClass::Oom,
            "oom",
            AttemptStats::default(),
            Some(UnixMillis::now()),
        )
        .await
        .unwrap();
    ledger.cancel(running).await.unwrap();
    let t = ledger.get(running).await.unwrap().unwrap();
    assert_eq!((t.state, t.next_attempt_at), (TaskState::Cancelled, None));
}

#[tokio::test]
async fn rejected_tasks_start_failed_and_are_never_claimed_or_retried() {
    let (_dir, ledger) = open_temp().await;
    let tasks = vec![
        NewTask {
            line: Some(1),
            custom_id: Some("ok".into()),
            body: NewTaskBody::Request("{}".into()),
        },
        NewTask {
            line: Some(2),
            custom_id: None,
            body: NewTaskBody::Rejected {
                class: ErrorClass::InvalidInput,
                message: "line 2: not JSON".into(),
            },
        },
    ];
    let rec = ledger
        .record_input_file(&file("mixed.jsonl", "m"), &tasks)
        .await
        .unwrap()
        .unwrap();
    let bad = ledger.get(rec.task_ids[1]).await.unwrap().unwrap();
    assert_eq!(
        (bad.state, bad.error_class, bad.attempts),
        (TaskState::Failed, Some(ErrorClass::InvalidInput), 0)
    );
    assert_eq!(bad.request_json, None);
    let claimed = ledger.claim_next(10, UnixMillis::now()).await.unwrap();
    assert_eq!(
        claimed.iter().map(|t| t.task_id).collect::<Vec<_>>(),
        [rec.task_ids[0]]
    );
    assert_eq!(
        ledger.retry(&[rec.task_ids[1]]).await.unwrap(),
        [(rec.task_ids[1], RetryResult::NoRequest)]
    );
    assert!(ledger.retry_failed(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn retry_by_id_resets_attempts_and_reports_each_id() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "retry.jsonl", 4).await;
    let s = AttemptStats::default();
    let claimed: Vec<TaskId> = ledger
        .claim_next(4, UnixMillis::now())
        .await
        .unwrap()
        .iter()
        .map(|t| t.task_id)
        .collect();
    assert_eq!(claimed, ids);
    ledger
        .finish_failure(ids[0], ErrorClass::InvalidInput, "bad", s, None)
        .await
        .unwrap(); // failed
    ledger
        .finish_failure(ids[1], ErrorClass::Oom, "oom", s, None)
        .await
        .unwrap(); // dead
    ledger.finish_success(ids[2], "{}", s).await.unwrap(); // succeeded
    ledger
        .set_output_path(ids[0], "outputs/2026-01-01/retry.errors.jsonl")
        .await
        .unwrap();
    let unknown = TaskId::new();
    let out = ledger
        .retry(&[ids[0], ids[1], ids[2], ids[3], unknown])
        .await
        .unwrap();
    assert_eq!(
        out,
        vec![
            (ids[0], RetryResult::Requeued),
            (ids[1], RetryResult::Requeued),
            (
                ids[2],
                RetryResult::WrongState {
                    state: TaskState::Succeeded
                }
            ),
            (
                ids[3],
                RetryResult::WrongState {
                    state: TaskState::Running
                }
            ),
            (unknown, RetryResult::NotFound),
        ]
    );
    for id in [ids[0], ids[1]] {
        let t = ledger.get(id).await.unwrap().unwrap();
        assert_eq!(
            (t.state, t.attempts, t.error_class, t.error, t.output_path),
            (TaskState::Queued, 0, None, None, None)
        );
        // The history stays.
        assert_eq!(ledger.attempts(id).await.unwrap().len(), 1);
    }
    // A requeued task runs again with attempt number 2 in the history but attempts = 1 in its new round.
    let again = ledger.claim_next(2, UnixMillis::now()).await.unwrap();
    assert!(again.iter().all(|t| t.attempts == 1));
    assert_eq!(ledger.attempts(ids[0]).await.unwrap().last().unwrap().n, 2);
}

#[tokio::test]
async fn retry_failed_filters_by_class() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "classes.jsonl", 5).await;
    let s = AttemptStats::default();
    ledger.claim_next(5, UnixMillis::now()).await.unwrap();
    ledger
        .finish_failure(ids[0], ErrorClass::Oom, "oom", s, None)
        .await
        .unwrap(); // dead, oom
    ledger
        .finish_failure(ids[1], ErrorClass::Oom, "oom", s, Some(UnixMillis::now()))
        .await
        .unwrap(); // retry_wait
    ledger
        .finish_failure(ids[2], ErrorClass::Timeout, "slow", s, None)
        .await
        .unwrap(); // dead, timeout
    ledger
        .finish_failure(ids[3], ErrorClass::InvalidInput, "bad", s, None)
        .await
        .unwrap(); // failed
    ledger.finish_success(ids[4], "{}", s).await.unwrap();
    let mut only_oom = ledger.retry_failed(Some(ErrorClass::Oom)).await.unwrap();
    only_oom.sort();
    assert_eq!(
        only_oom,
        vec![ids[0]],
        "retry_wait is not failed; other classes stay"
    );
    assert_eq!(state(&ledger, ids[1]).await, TaskState::RetryWait);
    assert_eq!(state(&ledger, ids[2]).await, TaskState::Dead);
    let mut rest = ledger.retry_failed(None).await.unwrap();
    rest.sort();
    let mut want = vec![ids[2], ids[3]];
    want.sort();
    assert_eq!(rest, want);
    assert_eq!(state(&ledger, ids[4]).await, TaskState::Succeeded);
    let counts = ledger.counts().await.unwrap();
    assert_eq!(
        (
            counts.get(TaskState::Queued),
            counts.get(TaskState::RetryWait)
        ),
        (3, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_claim_each_task_exactly_once() {
    let (_dir, ledger) = open_temp().await;
    // Two pools on one file (as two processes would have) plus clones of the first.
    let other = Ledger::open(ledger.path()).await.unwrap();
    let mut all = Vec::new();
    for f in 0..5 {
        all.extend(seed(&ledger, &format!("batch-{f}.jsonl"), 60).await);
    }
    let mut workers = Vec::new();
    for w in 0..12 {
        let l = if w % 2 == 0 {
            ledger.clone()
        } else {
            other.clone()
        };
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = l.claim_next(1 + w % 3, UnixMillis::now()).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                for t in batch {
                    assert_eq!(t.state, TaskState::Running);
                    l.finish_success(t.task_id, "{}", AttemptStats::default())
                        .await
                        .unwrap();
                    mine.push(t.task_id);
                }
            }
            mine
        }));
    }
    let mut seen = BTreeMap::new();
    for w in workers {
        for id in w.await.unwrap() {
            *seen.entry(id).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), all.len(), "every task was claimed");
    assert!(seen.values().all(|&n| n == 1), "no task was claimed twice");
    for id in all {
        let t = ledger.get(id).await.unwrap().unwrap();
        assert_eq!((t.state, t.attempts), (TaskState::Succeeded, 1));
        assert_eq!(ledger.attempts(id).await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn claims_are_fair_across_input_files() {
    let (_dir, ledger) = open_temp().await;
    let a = seed(&ledger, "a.jsonl", 10).await;
    let b = seed(&ledger, "b.jsonl", 3).await;
    let c = seed(&ledger, "c.jsonl", 2).await;
    let file_of = |id: TaskId| {
        if a.contains(&id) {
            'a'
        } else if b.contains(&id) {
            'b'
        } else {
            assert!(c.contains(&id));
            'c'
        }
    };
    // One batch: round robin, each file in line order.
    let batch = ledger.claim_next(6, UnixMillis::now()).await.unwrap();
    let files: String = batch.iter().map(|t| file_of(t.task_id)).collect();
    assert_eq!(files, "abcabc");
    assert_eq!(batch[0].task_id, a[0]);
    assert_eq!(batch[3].task_id, a[1]);
    // Single claims while others are in flight: the file with the fewest running tasks goes first.
    let next: String = {
        let mut s = String::new();
        for _ in 0..4 {
            s.push(file_of(claim_one(&ledger).await));
        }
        s
    };
    // c is drained; a and b tie (2 in flight each, claimed at the same instant) and a has the lower
    // file id; then b has fewer in flight than a; then only a is left.
    assert_eq!(next, "abaa");
}

#[tokio::test]
async fn single_claims_alternate_between_files() {
    let (_dir, ledger) = open_temp().await;
    let a = seed(&ledger, "a.txt", 3).await;
    let b = seed(&ledger, "b.txt", 3).await;
    let mut order = String::new();
    for _ in 0..6 {
        let id = claim_one(&ledger).await;
        order.push(if a.contains(&id) { 'a' } else { 'b' });
        assert!(a.contains(&id) || b.contains(&id));
        ledger
            .finish_success(id, "{}", AttemptStats::default())
            .await
            .unwrap();
        // Distinct claim times so "least recently claimed" is well defined.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert_eq!(order, "ababab");
}

#[tokio::test]
async fn the_same_content_is_recorded_once() {
    let (_dir, ledger) = open_temp().await;
    let f = file("in/x.jsonl", "content v1");
    let first = ledger
        .record_input_file(&f, &lines(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.generation, 0);
    assert!(ledger.input_file_known(&f.path, &f.sha256).await.unwrap());
    assert_eq!(
        ledger.record_input_file(&f, &lines(2)).await.unwrap(),
        None,
        "same path + sha256"
    );
    // Upper-case hex is the same content.
    let upper = NewInputFile {
        sha256: f.sha256.to_ascii_uppercase(),
        ..f.clone()
    };
    assert_eq!(
        ledger.record_input_file(&upper, &lines(2)).await.unwrap(),
        None
    );
    // Changed content at the same path: new row, new tasks.
    let changed = file("in/x.jsonl", "content v2");
    assert!(!ledger
        .input_file_known(&changed.path, &changed.sha256)
        .await
        .unwrap());
    let second = ledger
        .record_input_file(&changed, &lines(3))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(second.input_file_id, first.input_file_id);
    assert_eq!(second.task_ids.len(), 3);
    // The same content under another name is another file.
    let copy = file("in/y.jsonl", "content v1");
    assert!(ledger
        .record_input_file(&copy, &lines(1))
        .await
        .unwrap()
        .is_some());
    // `kiln submit --force`: one more generation, once.
    ledger.request_rerun(&f.path, &f.sha256).await.unwrap();
    assert!(!ledger.input_file_known(&f.path, &f.sha256).await.unwrap());
    let forced = ledger
        .record_input_file(&f, &lines(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(forced.generation, 1);
    assert_eq!(
        ledger.record_input_file(&f, &lines(2)).await.unwrap(),
        None,
        "the request is consumed"
    );
    let gens: Vec<u32> = ledger
        .input_files_by_path(&f.path)
        .await
        .unwrap()
        .iter()
        .map(|f| f.generation)
        .collect();
    assert_eq!(gens, [1, 0, 0], "newest first: forced v1, v2, v1");
    assert_eq!(ledger.counts().await.unwrap().input_files, 4);
    assert_eq!(ledger.counts().await.unwrap().total, 2 + 3 + 1 + 2);
    // A rerun requested for content not seen yet is consumed by its first intake, not kept for later.
    let fresh = file("in/z.jsonl", "fresh");
    ledger
        .request_rerun(&fresh.path, &fresh.sha256)
        .await
        .unwrap();
    let first = ledger
        .record_input_file(&fresh, &lines(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.generation, 0);
    assert_eq!(
        ledger.record_input_file(&fresh, &lines(1)).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn bad_input_file_records_are_refused() {
    let (_dir, ledger) = open_temp().await;
    let bad = NewInputFile {
        sha256: "abc".into(),
        ..file("z.txt", "z")
    };
    assert!(matches!(
        ledger.record_input_file(&bad, &lines(1)).await,
        Err(LedgerError::Invalid(_))
    ));
    // Two tasks on one line of one file violate UNIQUE (input_file_id, line): nothing is recorded.
    let dup = vec![lines(1)[0].clone(), lines(1)[0].clone()];
    assert!(ledger
        .record_input_file(&file("dup.jsonl", "d"), &dup)
        .await
        .is_err());
    assert_eq!(
        ledger.counts().await.unwrap().input_files,
        0,
        "the whole intake rolled back"
    );
}

#[tokio::test]
async fn outputs_are_due_when_every_task_of_a_file_is_terminal() {
    let (_dir, ledger) = open_temp().await;
    let rec = ledger
        .record_input_file(&file("o.jsonl", "o"), &lines(2))
        .await
        .unwrap()
        .unwrap();
    let ids = rec.task_ids;
    assert!(ledger.files_ready_for_output().await.unwrap().is_empty());
    ledger.claim_next(2, UnixMillis::now()).await.unwrap();
    ledger
        .finish_success(ids[0], "{}", AttemptStats::default())
        .await
        .unwrap();
    assert!(
        ledger.files_ready_for_output().await.unwrap().is_empty(),
        "one task still running"
    );
    ledger
        .finish_failure(
            ids[1],
            ErrorClass::InvalidInput,
            "bad",
            AttemptStats::default(),
            None,
        )
        .await
        .unwrap();
    let ready = ledger.files_ready_for_output().await.unwrap();
    assert_eq!(
        ready.iter().map(|f| (f.id, f.kind)).collect::<Vec<_>>(),
        [(rec.input_file_id, InputKind::Jsonl)]
    );
    ledger
        .set_output_paths(&[
            (ids[0], "2026-01-01/o.output.jsonl".into()),
            (ids[1], "2026-01-01/o.errors.jsonl".into()),
        ])
        .await
        .unwrap();
    assert!(ledger.files_ready_for_output().await.unwrap().is_empty());
    let tasks = ledger.file_tasks(rec.input_file_id).await.unwrap();
    assert_eq!(
        tasks.iter().map(|t| t.line).collect::<Vec<_>>(),
        [Some(1), Some(2)]
    );
    assert_eq!(
        tasks[1].output_path.as_deref(),
        Some("2026-01-01/o.errors.jsonl")
    );
    assert!(matches!(
        ledger.set_output_path(TaskId::new(), "x").await,
        Err(LedgerError::NotFound(_))
    ));
    // A retried task makes the file due again once it finishes.
    ledger.retry(&[ids[1]]).await.unwrap();
    // The publisher of the old group loses the race with `kiln retry`: nothing is recorded, not
    // even the path of the task that did not change.
    assert!(matches!(
        ledger
            .set_output_paths(&[
                (ids[0], "2026-01-01/o-1.output.jsonl".into()),
                (ids[1], "2026-01-01/o-1.errors.jsonl".into()),
            ])
            .await,
        Err(LedgerError::Conflict {
            found: Some(TaskState::Queued),
            ..
        })
    ));
    assert_eq!(
        ledger
            .get(ids[0])
            .await
            .unwrap()
            .unwrap()
            .output_path
            .as_deref(),
        Some("2026-01-01/o.output.jsonl")
    );
    assert!(ledger.files_ready_for_output().await.unwrap().is_empty());
    ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    ledger
        .finish_success(ids[1], "{}", AttemptStats::default())
        .await
        .unwrap();
    assert_eq!(ledger.files_ready_for_output().await.unwrap().len(), 1);
}

#[tokio::test]
async fn list_filters_and_counts() {
    let (_dir, ledger) = open_temp().await;
    let ids = seed(&ledger, "l.jsonl", 4).await;
    let other = ledger
        .record_input_file(&file("m.txt", "m"), &lines(1))
        .await
        .unwrap()
        .unwrap();
    ledger.claim_next(2, UnixMillis::now()).await.unwrap(); // l:1 and m:1 (fair)
    ledger
        .finish_failure(
            ids[0],
            ErrorClass::Timeout,
            "slow",
            AttemptStats::default(),
            None,
        )
        .await
        .unwrap();
    let all = ledger.list(&ListFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    let dead = ledger
        .list(&ListFilter {
            state: Some(TaskState::Dead),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.iter().map(|t| t.task_id).collect::<Vec<_>>(), [ids[0]]);
    let by_class = ledger
        .list(&ListFilter {
            error_class: Some(ErrorClass::Timeout),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_class.len(), 1);
    let of_file = ledger
        .list(&ListFilter {
            input_file_id: Some(other.input_file_id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        of_file
            .iter()
            .map(|t| t.input_path.as_str())
            .collect::<Vec<_>>(),
        ["m.txt"]
    );
    let limited = ledger
        .list(&ListFilter {
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        limited.iter().map(|t| t.task_id).collect::<Vec<_>>(),
        all[..2].iter().map(|t| t.task_id).collect::<Vec<_>>()
    );
    let c = ledger.counts().await.unwrap();
    assert_eq!((c.total, c.input_files), (5, 2));
    assert_eq!(
        (
            c.get(TaskState::Queued),
            c.get(TaskState::Running),
            c.get(TaskState::Dead)
        ),
        (3, 1, 1)
    );
    assert_eq!(c.unfinished_by_class, [(ErrorClass::Timeout, 1)]);
    assert_eq!(c.by_state.len(), TaskState::ALL.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_of_a_fresh_ledger_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let p = path.clone();
            tokio::spawn(async move { Ledger::open(p).await })
        })
        .collect();
    for o in opens {
        let ledger = o
            .await
            .unwrap()
            .expect("every open migrates or sees the migration applied");
        assert_eq!(ledger.counts().await.unwrap().total, 0);
    }
}

/// The race behind `concurrent_first_opens_…`, many times over: both connections of a fresh file
/// take a read lock and try to upgrade it to switch the file to WAL; SQLite answers one of them
/// `SQLITE_BUSY` at once (no busy handler, to avoid a deadlock). `Ledger::open` must retry that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_rounds_of_concurrent_first_opens_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..40 {
        let path = dir.path().join(format!("fresh-{round}.db"));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let p = path.clone();
                tokio::spawn(async move { Ledger::open(p).await })
            })
            .collect();
        for o in opens {
            let ledger = o
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
            assert_eq!(ledger.counts().await.unwrap().total, 0);
            ledger.close().await;
        }
    }
}

/// `kiln status`: throughput over a window, the ETA of what is open, and per-file reports.
#[tokio::test]
async fn throughput_eta_and_file_reports() {
    let (_dir, ledger) = open_temp().await;
    let t0 = UnixMillis::now();
    let ids = seed(&ledger, "t.jsonl", 3).await;
    let stats = AttemptStats {
        completion_tokens: Some(10),
        ..AttemptStats::default()
    };
    for _ in 0..2 {
        let id = claim_one(&ledger).await;
        ledger.finish_success(id, "{}", stats).await.unwrap();
    }
    let r = ledger.throughput(UnixMillis::now(), 300_000).await.unwrap();
    assert_eq!((r.tasks, r.tokens, r.open), (2, 20, 1));
    assert!((r.tasks_per_s - 2.0 / 300.0).abs() < 1e-9, "{r:?}");
    assert!((r.eta_secs.unwrap() - 150.0).abs() < 1e-6, "{r:?}");
    let files = ledger.file_reports(t0).await.unwrap();
    assert_eq!(files.len(), 1);
    let f = &files[0];
    assert_eq!(
        (f.path.as_str(), f.total, f.succeeded, f.open, f.unwritten),
        ("t.jsonl", 3, 2, 1, 2)
    );
    assert!(!f.is_complete());
    let _ = ids;
}

/// `kiln prune`: only whole, finished, published, old input files lose their rows.
#[tokio::test]
async fn prune_forgets_only_whole_old_published_files() {
    let (_dir, ledger) = open_temp().await;
    let done = seed(&ledger, "done.jsonl", 2).await;
    let open = seed(&ledger, "open.jsonl", 2).await;
    for _ in 0..3 {
        let id = claim_one(&ledger).await;
        ledger
            .finish_success(id, "{}", AttemptStats::default())
            .await
            .unwrap();
    }
    // done.jsonl: both finished; open.jsonl: one finished, one queued.
    assert_eq!(state(&ledger, open[1]).await, TaskState::Queued);
    ledger
        .set_output_paths(&[(done[0], "d".into()), (done[1], "d".into())])
        .await
        .unwrap();
    ledger.set_output_path(open[0], "o").await.unwrap();
    let future = UnixMillis(UnixMillis::now().0 + 60_000);
    // Not old enough: nothing.
    assert!(ledger
        .prune(UnixMillis(UnixMillis::now().0 - 60_000))
        .await
        .unwrap()
        .is_empty());
    let mut pruned = ledger.prune(future).await.unwrap();
    pruned.sort();
    let mut want = done.clone();
    want.sort();
    assert_eq!(pruned, want, "only the whole finished file");
    assert!(ledger.get(done[0]).await.unwrap().is_none());
    assert!(ledger.attempts(done[0]).await.unwrap().is_empty());
    assert!(ledger.get(open[0]).await.unwrap().is_some());
    // The input file record stays: the same content is still known and will not run again.
    assert!(ledger
        .input_file_known("done.jsonl", &file("done.jsonl", "done.jsonl:2").sha256)
        .await
        .unwrap());
}
