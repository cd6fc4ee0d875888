//! Every ledger transition and its guard: claim, finish, fail, release, recover, cancel, reject, retry.

use super::*;

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
