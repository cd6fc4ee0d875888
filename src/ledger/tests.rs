//! Unit tests of the ledger's basics; the full transition matrix and concurrency are in `tests/ledger.rs`.

use super::*;

async fn open_temp() -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path().join("state/kiln.db"))
        .await
        .unwrap();
    (dir, ledger)
}

fn file(path: &str, content: &str) -> NewInputFile {
    use sha2::Digest;
    NewInputFile {
        path: path.into(),
        sha256: hex::encode(sha2::Sha256::digest(content.as_bytes())),
        size: content.len() as u64,
        kind: InputKind::from_path(path.as_ref()).unwrap(),
    }
}

fn request(n: u32) -> NewTask {
    NewTask {
        line: Some(n),
        custom_id: Some(format!("req-{n}")),
        body: NewTaskBody::Request(format!("{{\"n\":{n}}}")),
    }
}

#[tokio::test]
async fn open_creates_the_file_in_wal_mode_and_reopens() {
    let (dir, ledger) = open_temp().await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&ledger.pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&ledger.pool)
        .await
        .unwrap();
    assert_eq!(sync, 2, "synchronous = FULL");
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&ledger.pool)
        .await
        .unwrap();
    assert_eq!(fk, 1);
    ledger.close().await;
    // Migrations are idempotent: a second open of the same file works and sees the data.
    let again = Ledger::open(dir.path().join("state/kiln.db"))
        .await
        .unwrap();
    assert_eq!(again.counts().await.unwrap().total, 0);
}

#[tokio::test]
async fn check_constraints_mirror_the_enums() {
    let (_dir, ledger) = open_temp().await;
    let rec = ledger
        .record_input_file(&file("a.jsonl", "x"), &[request(1)])
        .await
        .unwrap()
        .unwrap();
    let bad = sqlx::query("UPDATE tasks SET state = 'done' WHERE task_id = ?")
        .bind(rec.task_ids[0].to_string())
        .execute(&ledger.pool)
        .await;
    assert!(
        bad.is_err(),
        "a state outside TaskState is refused by CHECK"
    );
    let bad = sqlx::query("UPDATE tasks SET error_class = 'oops' WHERE task_id = ?")
        .bind(rec.task_ids[0].to_string())
        .execute(&ledger.pool)
        .await;
    assert!(
        bad.is_err(),
        "a class outside ErrorClass is refused by CHECK"
    );
    // Every TaskState label is accepted by the CHECK constraint (retry_wait needs next_attempt_at).
    for s in TaskState::ALL {
        let next = (s == TaskState::RetryWait).then_some(1_i64);
        sqlx::query("UPDATE tasks SET state = ?, next_attempt_at = ? WHERE task_id = ?")
            .bind(s.as_str())
            .bind(next)
            .bind(rec.task_ids[0].to_string())
            .execute(&ledger.pool)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

#[tokio::test]
async fn lock_is_exclusive_and_released_on_drop() {
    let (_dir, ledger) = open_temp().await;
    assert!(!Ledger::is_locked(ledger.path()));
    let lock = ledger.lock_exclusive().await.unwrap();
    assert!(lock.path().ends_with("kiln.db.lock"));
    assert!(Ledger::is_locked(ledger.path()));
    let second = Ledger::open(ledger.path()).await.unwrap();
    assert!(matches!(
        second.lock_exclusive().await,
        Err(LedgerError::Locked { .. })
    ));
    drop(lock);
    assert!(!Ledger::is_locked(ledger.path()));
    let _again = second.lock_exclusive().await.unwrap();
}

/// Issue 11: `ln -s kiln.db link.db; KILN_DAEMON_LEDGER=link.db kiln run` started a second daemon
/// because the lock was keyed on the path given. The lock file is the canonical one, and the
/// `daemon_owner` row catches a path that canonicalizes elsewhere (a bind mount; simulated here
/// by a row naming another lock file that is held).
#[tokio::test]
async fn no_other_path_to_the_ledger_gets_a_second_lock() {
    let (dir, ledger) = open_temp().await;
    let lock = ledger.lock_exclusive().await.unwrap();
    let sym = dir.path().join("link.db");
    std::os::unix::fs::symlink(ledger.path(), &sym).unwrap();
    let second = Ledger::open(&sym).await.unwrap();
    assert!(Ledger::is_locked(&sym));
    match second.lock_exclusive().await {
        Err(LedgerError::Locked { lock, .. }) => {
            assert_eq!(lock, Ledger::lock_path(ledger.path()))
        }
        other => panic!("{other:?}"),
    }
    drop(lock);

    // Another daemon, reaching the file by a path with another canonical form, holds its lock.
    let elsewhere = dir.path().join("mnt-kiln.db.lock");
    let held = std::fs::File::create(&elsewhere).unwrap();
    held.try_lock().unwrap();
    sqlx::query("UPDATE daemon_owner SET lock_path = ? WHERE id = 1")
        .bind(elsewhere.to_string_lossy().into_owned())
        .execute(&ledger.pool)
        .await
        .unwrap();
    match second.lock_exclusive().await {
        Err(LedgerError::Locked { lock, .. }) => assert_eq!(lock, elsewhere),
        other => panic!("{other:?}"),
    }
    // Once that daemon is gone (its lock released), this one takes over.
    drop(held);
    let _l = second.lock_exclusive().await.unwrap();
    let owner: String = sqlx::query_scalar("SELECT lock_path FROM daemon_owner")
        .fetch_one(&ledger.pool)
        .await
        .unwrap();
    assert_eq!(PathBuf::from(owner), Ledger::lock_path(ledger.path()));
}

#[tokio::test]
async fn record_claim_succeed_round_trip() {
    let (_dir, ledger) = open_temp().await;
    let RecordedFile {
        input_file_id,
        generation,
        task_ids,
    } = ledger
        .record_input_file(&file("b.jsonl", "two lines"), &[request(1), request(2)])
        .await
        .unwrap()
        .unwrap();
    assert_eq!((generation, task_ids.len()), (0, 2));
    let claimed = ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let t = &claimed[0];
    assert_eq!(
        (t.task_id, t.state, t.attempts, t.line),
        (task_ids[0], TaskState::Running, 1, Some(1))
    );
    assert_eq!(t.input_path, "b.jsonl");
    assert_eq!(t.request_json.as_deref(), Some("{\"n\":1}"));
    let stats = AttemptStats {
        prompt_tokens: Some(10),
        completion_tokens: Some(3),
        ..Default::default()
    };
    ledger
        .finish_success(t.task_id, "{\"ok\":true}", stats)
        .await
        .unwrap();
    let got = ledger.get(t.task_id).await.unwrap().unwrap();
    assert_eq!(got.state, TaskState::Succeeded);
    assert_eq!(got.result_json.as_deref(), Some("{\"ok\":true}"));
    let attempts = ledger.attempts(t.task_id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, Some(AttemptOutcome::Succeeded));
    assert_eq!(attempts[0].stats.prompt_tokens, Some(10));
    assert_eq!(ledger.file_tasks(input_file_id).await.unwrap().len(), 2);
}

#[tokio::test]
async fn finish_on_a_task_not_running_is_a_conflict() {
    let (_dir, ledger) = open_temp().await;
    let rec = ledger
        .record_input_file(&file("c.txt", "hi"), &[request(1)])
        .await
        .unwrap()
        .unwrap();
    let err = ledger
        .finish_success(rec.task_ids[0], "{}", AttemptStats::default())
        .await
        .unwrap_err();
    match err {
        LedgerError::Conflict {
            task_id,
            expected_state,
            found,
        } => {
            assert_eq!(task_id, rec.task_ids[0]);
            assert_eq!(expected_state, TaskState::Running);
            assert_eq!(found, Some(TaskState::Queued));
        }
        other => panic!("expected a conflict, got {other}"),
    }
    let missing = TaskId::new();
    let err = ledger.release_interrupted(missing, "x").await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Conflict { found: None, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn prefix_ids_resolve_when_unique() {
    let (_dir, ledger) = open_temp().await;
    let rec = ledger
        .record_input_file(&file("d.txt", "x"), &[request(1)])
        .await
        .unwrap()
        .unwrap();
    let full = rec.task_ids[0].to_string();
    assert_eq!(
        ledger.resolve_task_id(&full[..13]).await.unwrap(),
        rec.task_ids[0]
    );
    assert!(matches!(
        ledger.resolve_task_id("ffffffff").await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        ledger.resolve_task_id("ab").await,
        Err(LedgerError::NotFound(_))
    ));
}
