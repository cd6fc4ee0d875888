//! Concurrent claimers (one pool and two pools on one file), fairness across input files, dedupe of the same content, refused intake records.

use super::*;

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
