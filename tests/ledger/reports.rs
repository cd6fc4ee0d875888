//! What the ledger reports: outputs due, listing and counts, concurrent first opens, throughput / ETA, pruning.

use super::*;

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
