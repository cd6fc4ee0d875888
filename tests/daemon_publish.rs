//! Publishing outputs exactly once and cheaply (issue 11, items 8 and 9): a crash between the
//! files of one output group leaves no partial group and no duplicate `<stem>-1` after the
//! restart; publishing reads a file's rows once, when it completes, not once per finished task;
//! start-up does not re-read or re-hash unchanged inputs.
//!
//! A crash is reproduced by driving the publisher's steps by hand (stage, record the plan, link
//! part of it) and then starting `kiln run --once` on the same folder, which runs the real
//! start-up sequence (recover plans, remove stale temporaries, publish what is due).
//!
//! Run: `cargo test --test daemon_publish`.

mod daemon_support;

use std::path::{Path, PathBuf};

use daemon_support::*;
use kiln::daemon::publish::Publisher;
use kiln::daemon::task_log::TaskLogs;
use kiln::daemon::writer::{render, FinishedTask, OutputDir, Staged, StoredResult, TaskOutcome};
use kiln::ledger::{
    AttemptStats, InputKind, Ledger, NewInputFile, NewTask, NewTaskBody, TaskId, UnixMillis,
};

/// Record a `.txt` input with one task and finish it; returns the task id and its stored result.
async fn finished_txt(ledger: &Ledger, path: &str, text: &str) -> (i64, TaskId, StoredResult) {
    let rec = ledger
        .record_input_file(
            &NewInputFile {
                path: path.into(),
                sha256: format!("{:064x}", path.len()),
                size: 5,
                kind: InputKind::Txt,
            },
            &[NewTask {
                line: None,
                custom_id: None,
                body: NewTaskBody::Request(
                    r#"{"messages":[{"role":"user","content":"hi"}]}"#.into(),
                ),
            }],
        )
        .await
        .unwrap()
        .expect("recorded");
    let claimed = ledger.claim_next(1, UnixMillis::now()).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let result = StoredResult {
        model: "test-model".into(),
        created: 1_700_000_000,
        completion: completion(text),
    };
    ledger
        .finish_success(
            rec.task_ids[0],
            &serde_json::to_string(&result).unwrap(),
            AttemptStats::default(),
        )
        .await
        .unwrap();
    (rec.input_file_id, rec.task_ids[0], result)
}

fn all_files(root: &Path) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(days) = std::fs::read_dir(root) else {
        return v;
    };
    for d in days.flatten() {
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            v.push(f.file_name().to_string_lossy().into_owned());
        }
    }
    v.sort();
    v
}

fn staged_group(
    out: &OutputDir,
    task: TaskId,
    result: &StoredResult,
) -> kiln::daemon::writer::GroupPlan {
    let files = render(
        InputKind::Txt,
        "q.txt",
        &[FinishedTask {
            task_id: task.to_string(),
            line: None,
            custom_id: None,
            outcome: TaskOutcome::Succeeded(result.clone()),
        }],
    );
    let today = time::OffsetDateTime::now_utc().date();
    match out
        .stage("q.txt", InputKind::Txt, &files, today, &[])
        .unwrap()
    {
        Staged::New(plan) => plan,
        Staged::Reused(_) => panic!("nothing was published yet"),
    }
}

#[tokio::test]
async fn a_crash_between_the_files_of_a_group_is_completed_at_restart_without_a_duplicate() {
    let env = Env::new();
    let ledger = env.ledger().await;
    let (file_id, task, result) = finished_txt(&ledger, "q.txt", "Paris.").await;
    let out = OutputDir::new(&env.config.daemon.outputs);

    // The publisher's steps, cut after the first file of the group was linked into place.
    let plan = staged_group(&out, task, &result);
    assert_eq!(plan.files.len(), 2, ".md + .json");
    ledger
        .record_output_intent(file_id, &serde_json::to_string(&plan).unwrap())
        .await
        .unwrap();
    std::fs::hard_link(&plan.files[0].tmp, &plan.files[0].path).unwrap();
    ledger.close().await;
    let before = all_files(&env.config.daemon.outputs);
    assert_eq!(
        before.iter().filter(|n| !n.starts_with('.')).count(),
        1,
        "a partial group on disk: {before:?}"
    );

    // Restart.
    env.run_once(&echo_engine()).await;

    let after = all_files(&env.config.daemon.outputs);
    assert_eq!(
        after,
        vec!["q.json", "q.md"],
        "one whole group, no q-1, no .tmp"
    );
    let ledger = env.ledger().await;
    let t = ledger.get(task).await.unwrap().unwrap();
    assert_eq!(
        t.output_path.as_deref().map(PathBuf::from),
        Some(plan.files[0].path.clone())
    );
    assert!(ledger.output_intents().await.unwrap().is_empty());
    assert_eq!(env.output("q.md").unwrap(), b"Paris.\n");
}

#[tokio::test]
async fn a_crash_before_the_plan_was_recorded_leaves_nothing_visible_and_one_group_after_restart() {
    let env = Env::new();
    let ledger = env.ledger().await;
    let (_, task, result) = finished_txt(&ledger, "q.txt", "Paris.").await;
    let out = OutputDir::new(&env.config.daemon.outputs);
    let _plan = staged_group(&out, task, &result); // temporaries only; the crash comes here
    ledger.close().await;
    assert!(all_files(&env.config.daemon.outputs)
        .iter()
        .all(|n| n.starts_with('.') && n.ends_with(".tmp")));

    env.run_once(&echo_engine()).await;

    assert_eq!(
        all_files(&env.config.daemon.outputs),
        vec!["q.json", "q.md"]
    );
}

#[tokio::test]
async fn publishing_reads_a_files_rows_once_when_it_completes_not_once_per_finished_task() {
    const N: u32 = 300;
    let env = Env::new();
    let ledger = env.ledger().await;
    let tasks: Vec<NewTask> = (1..=N)
        .map(|l| NewTask {
            line: Some(l),
            custom_id: Some(format!("c{l}")),
            body: NewTaskBody::Request(r#"{"messages":[{"role":"user","content":"x"}]}"#.into()),
        })
        .collect();
    let rec = ledger
        .record_input_file(
            &NewInputFile {
                path: "big.jsonl".into(),
                sha256: "ab".repeat(32),
                size: 1,
                kind: InputKind::Jsonl,
            },
            &tasks,
        )
        .await
        .unwrap()
        .unwrap();
    let publisher = Publisher::new(
        ledger.clone(),
        OutputDir::new(&env.config.daemon.outputs),
        TaskLogs::new(&env.config.daemon.logs),
    );
    let result = serde_json::to_string(&StoredResult {
        model: "test-model".into(),
        created: 1,
        completion: completion("ok"),
    })
    .unwrap();
    let claimed = ledger
        .claim_next(N as usize, UnixMillis::now())
        .await
        .unwrap();
    assert_eq!(claimed.len(), N as usize);
    let read0 = ledger.task_rows_read();
    let mut published = 0;
    // As the daemon does: publish the file after each of its tasks finished.
    for t in &claimed {
        ledger
            .finish_success(t.task_id, &result, AttemptStats::default())
            .await
            .unwrap();
        if publisher.publish_file(rec.input_file_id).await.unwrap() {
            published += 1;
        }
    }
    assert_eq!(published, 1, "published once, when the last task finished");
    let read = ledger.task_rows_read() - read0;
    // Reloading every row on each finished task reads N(N+1)/2 = 45,150 rows here.
    assert_eq!(read, u64::from(N), "rows read to publish {N} tasks");
    assert!(!publisher.publish_file(rec.input_file_id).await.unwrap());
    assert_eq!(
        ledger.task_rows_read() - read0,
        u64::from(N),
        "nothing due: no rows read"
    );
    assert_eq!(
        env.output_lines("big.output.jsonl").len(),
        N as usize,
        "every line published"
    );
}

#[tokio::test]
async fn start_up_does_not_reread_or_rehash_unchanged_inputs() {
    use sha2::Digest;
    let env = Env::new();
    env.drop_input("a.txt", "Say hi.");
    env.drop_input("b.json", r#"{"messages":[{"role":"user","content":"b"}]}"#);
    env.drop_input(
        "c.jsonl",
        format!("{}\n{}\n", batch_line("1", "x"), batch_line("2", "y")),
    );
    let engine = echo_engine();
    let first = env.run_once(&engine).await;
    assert_eq!((first.inputs_hashed, first.inputs_unchanged), (3, 0));

    // A restart over the same inputs: nothing is read.
    let second = env.run_once(&engine).await;
    assert_eq!((second.inputs_hashed, second.inputs_unchanged), (0, 3));
    assert_eq!(second.tasks, 0);

    // New content (a new inode, as producers write), and `kiln submit --force` of another:
    // exactly those two are read again.
    env.drop_input("b.json", r#"{"messages":[{"role":"user","content":"B!"}]}"#);
    let ledger = env.ledger().await;
    let sha = hex::encode(sha2::Sha256::digest(b"Say hi."));
    ledger.request_rerun("a.txt", &sha).await.unwrap();
    ledger.close().await;
    let third = env.run_once(&engine).await;
    assert_eq!((third.inputs_hashed, third.inputs_unchanged), (2, 1));
    assert_eq!(third.tasks, 2, "b.json's new content and a.txt's rerun");
}
