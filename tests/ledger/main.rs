//! Ledger integration tests: every transition and its guard, concurrent claimers (one pool and two
//! pools on one file), crash recovery, `kiln retry` semantics, fairness across input files, dedupe.
//!
//! Run: `cargo test --test ledger`.
//!
//! Split by concept: `transitions.rs` (each transition and its guard, recovery, retry), `claims.rs`
//! (concurrent claimers, fairness, dedupe, intake validation), `reports.rs` (outputs due, listing,
//! first opens, throughput, pruning); the shared helpers are here.

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

mod claims;
mod reports;
mod transitions;
