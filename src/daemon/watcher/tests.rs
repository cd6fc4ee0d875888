//! Tests of the input watcher: the start scan, files reported once stable, ignored names,
//! unknown types and symlinks leaving the inputs folder, polling mode and the periodic rescan.

use super::*;

fn cfg(dir: &Path) -> WatchConfig {
    WatchConfig {
        inputs: dir.to_path_buf(),
        stable: Duration::from_millis(150),
        rescan: Duration::from_secs(3600),
        poll: false,
        poll_interval: Duration::from_millis(50),
        follow_symlinks: false,
    }
}

async fn next_any(rx: &mut mpsc::UnboundedReceiver<Found>) -> Found {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("timely")
        .expect("open")
}

/// The next file or rejection (the one-time `InitialScanDone` is skipped).
async fn next(rx: &mut mpsc::UnboundedReceiver<Found>) -> Found {
    loop {
        match next_any(rx).await {
            Found::InitialScanDone => continue,
            f => return f,
        }
    }
}

/// Nothing but (at most) the one-time `InitialScanDone` arrives within `for_`.
async fn quiet(rx: &mut mpsc::UnboundedReceiver<Found>, for_: Duration) {
    let end = tokio::time::Instant::now() + for_;
    while let Ok(Some(f)) = tokio::time::timeout_at(end, rx.recv()).await {
        assert_eq!(f, Found::InitialScanDone, "unexpected {f:?}");
    }
}

#[test]
fn ignored_names() {
    for n in [
        ".hidden.txt",
        "a.txt.tmp",
        "a.jsonl.part",
        "a.PART",
        "x.partial",
        "y.crdownload",
        "z.swp",
        "w~",
    ] {
        assert!(is_ignored_name(n), "{n}");
    }
    for n in ["a.txt", "my file ü.jsonl", "tmp.txt", "part.md"] {
        assert!(!is_ignored_name(n), "{n}");
    }
}

#[tokio::test]
async fn scans_at_start_and_waits_for_stable_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir_all(inputs.join("sub")).unwrap();
    std::fs::write(inputs.join("old one.txt"), "hi").unwrap();
    std::fs::write(inputs.join(".hidden.txt"), "no").unwrap();
    std::fs::write(inputs.join("b.json.tmp"), "no").unwrap();
    std::fs::write(inputs.join("sub/nested.txt"), "no").unwrap();
    let token = CancellationToken::new();
    let (_h, mut rx) = spawn(cfg(&inputs), token.clone()).expect("spawn");
    let f = next_any(&mut rx).await;
    assert_eq!(
        f,
        Found::File {
            path: inputs.join("old one.txt"),
            rel: "old one.txt".into(),
            kind: InputKind::Txt
        }
    );

    assert_eq!(next_any(&mut rx).await, Found::InitialScanDone);

    // A file being written is not taken while it grows.
    let growing = inputs.join("grow ü.jsonl");
    let mut last_write = std::time::Instant::now();
    for i in 0..5 {
        std::fs::write(&growing, "x".repeat(i + 1)).unwrap();
        last_write = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let f = next(&mut rx).await;
    assert!(
        matches!(&f, Found::File { rel, .. } if rel == "grow ü.jsonl"),
        "{f:?}"
    );
    let waited = last_write.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "taken {waited:?} after the last write"
    );
    assert_eq!(std::fs::read(&growing).unwrap().len(), 5);

    // Renamed into place from a temporary name: taken once.
    std::fs::write(inputs.join("c.md.part"), "body").unwrap();
    std::fs::rename(inputs.join("c.md.part"), inputs.join("c.md")).unwrap();
    let f = next(&mut rx).await;
    assert!(
        matches!(&f, Found::File { rel, kind: InputKind::Md, .. } if rel == "c.md"),
        "{f:?}"
    );
    quiet(&mut rx, Duration::from_millis(400)).await;
    token.cancel();
}

#[tokio::test]
async fn rejects_unknown_types_and_outside_symlinks_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let outside = dir.path().join("secret.txt");
    std::fs::write(&outside, "s").unwrap();
    std::fs::write(inputs.join("inside.txt"), "i").unwrap();
    std::os::unix::fs::symlink(&outside, inputs.join("out link.txt")).unwrap();
    std::os::unix::fs::symlink(inputs.join("inside.txt"), inputs.join("in link.txt")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nowhere"), inputs.join("dangling.txt")).unwrap();
    std::fs::write(inputs.join("data.csv"), "a,b").unwrap();
    let token = CancellationToken::new();
    let (h, mut rx) = spawn(cfg(&inputs), token.clone()).expect("spawn");
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(next(&mut rx).await);
    }
    got.sort_by_key(|f| match f {
        Found::File { rel, .. } | Found::Rejected { rel, .. } => rel.clone(),
        Found::InitialScanDone => String::new(),
    });
    let summary: Vec<(String, bool)> = got
        .iter()
        .map(|f| match f {
            Found::File { rel, .. } => (rel.clone(), true),
            Found::Rejected { rel, .. } => (rel.clone(), false),
            Found::InitialScanDone => unreachable!("skipped by next()"),
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("dangling.txt".into(), false),
            ("data.csv".into(), false),
            ("in link.txt".into(), true),
            ("inside.txt".into(), true),
            ("out link.txt".into(), false),
        ]
    );
    let reason = |i: usize| match &got[i] {
        Found::Rejected { reason, .. } => reason.clone(),
        _ => unreachable!(),
    };
    assert!(reason(0).contains("broken symlink"));
    assert!(reason(1).contains("unsupported file type"));
    assert!(reason(4).contains("follow_symlinks"));
    // A rescan does not report anything again.
    h.rescan();
    quiet(&mut rx, Duration::from_millis(400)).await;
    token.cancel();
}

#[tokio::test]
async fn follows_outside_symlinks_when_configured_and_retries_on_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    std::fs::write(dir.path().join("elsewhere.md"), "s").unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere.md"), inputs.join("link.md")).unwrap();
    let token = CancellationToken::new();
    let (h, mut rx) = spawn(
        WatchConfig {
            follow_symlinks: true,
            ..cfg(&inputs)
        },
        token.clone(),
    )
    .expect("spawn");
    assert!(matches!(next(&mut rx).await, Found::File { rel, .. } if rel == "link.md"));
    h.retry_later(inputs.join("link.md"), Duration::from_millis(50));
    assert!(matches!(next(&mut rx).await, Found::File { rel, .. } if rel == "link.md"));
    token.cancel();
}

#[tokio::test]
async fn polling_mode_and_periodic_rescan_find_new_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inputs = dir.path().join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let token = CancellationToken::new();
    let c = WatchConfig {
        poll: true,
        rescan: Duration::from_millis(200),
        ..cfg(&inputs)
    };
    let (_h, mut rx) = spawn(c, token.clone()).expect("spawn");
    std::fs::write(inputs.join("late.txt"), "x").unwrap();
    assert!(matches!(next(&mut rx).await, Found::File { rel, .. } if rel == "late.txt"));
    // Changed content is handed over again; unchanged content is not.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(inputs.join("late.txt"), "changed").unwrap();
    assert!(matches!(next(&mut rx).await, Found::File { rel, .. } if rel == "late.txt"));
    quiet(&mut rx, Duration::from_millis(500)).await;
    token.cancel();
}
