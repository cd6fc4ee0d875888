//! The real `kiln run` process with the real default model: `kill -9` mid-batch then a restart
//! (every task succeeds exactly once, no duplicate or partial output), SIGTERM with systemd's
//! notify protocol (READY, STATUS, WATCHDOG, STOPPING), and the ledger lock against a second daemon.
//!
//! Needs the model file like `daemon_e2e.rs` (`kiln model fetch-default` or `KILN_TEST_MODEL`).

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln::ledger::{AttemptOutcome, Ledger, ListFilter, Task, TaskState};
use serde_json::json;

fn model_path() -> PathBuf {
    let p = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.exists(),
        "{} is missing: run `cargo run -- model fetch-default` (or set KILN_TEST_MODEL)",
        p.display()
    );
    p
}

/// A kiln folder with a config file; relative paths resolve against it.
fn setup(dir: &Path, concurrency: usize, grace_secs: u64) -> PathBuf {
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\npath = {:?}\nfetch_default = false\n\n[engine]\ndevice = \"cpu\"\nmax_model_len = 1024\n\n\
         [daemon]\nconcurrency = {concurrency}\nstable_secs = 0.2\nshutdown_grace_secs = {grace_secs}\n\n\
         [logging]\nlevel = \"info\"\n",
        model_path().to_string_lossy()
    );
    std::fs::write(&config, text).unwrap();
    std::fs::create_dir_all(dir.join("inputs")).unwrap();
    config
}

fn drop_input(dir: &Path, name: &str, content: &str) {
    let tmp = dir.join("inputs").join(format!(".{name}.tmp"));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, dir.join("inputs").join(name)).unwrap();
}

fn kiln(config: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.arg("--config")
        .arg(config)
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG");
    c
}

fn spawn_logged(mut cmd: Command, log: &Path) -> Child {
    let f = std::fs::File::create(log).unwrap();
    cmd.stdout(Stdio::null())
        .stderr(f)
        .spawn()
        .expect("start kiln")
}

fn tasks(rt: &tokio::runtime::Runtime, ledger: &Ledger) -> Vec<Task> {
    rt.block_on(ledger.list(&ListFilter::default())).unwrap()
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_exit(child: &mut Child, timeout: Duration, log: &Path) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("kiln did not exit within {timeout:?}; its log:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every file under outputs/, relative.
fn output_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(days) = std::fs::read_dir(dir.join("outputs")) {
        for d in days.flatten() {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                out.push(f.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn kill_9_mid_batch_then_restart_runs_every_task_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = setup(root, 2, 10);
    for i in 0..6 {
        drop_input(
            root,
            &format!("prompt {i}.txt"),
            &format!("Write one sentence about the number {i}."),
        );
    }
    let lines: Vec<String> = (0..8)
        .map(|i| {
            json!({ "custom_id": format!("line-{i}"), "method": "POST", "url": "/v1/chat/completions",
                    "body": { "messages": [{ "role": "user", "content": format!("List {i} colors.") }], "max_tokens": 40 } })
            .to_string()
        })
        .collect();
    drop_input(root, "batch.jsonl", &(lines.join("\n") + "\n"));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut first = spawn_logged(kiln(&config, &["run"]), &root.join("first.log"));
    let ledger_path = root.join("kiln.db");
    wait_for("the ledger", Duration::from_secs(120), || {
        ledger_path.exists()
    });
    let ledger = rt.block_on(Ledger::open(&ledger_path)).unwrap();
    // Kill once some tasks are done and others are in flight.
    wait_for("a few finished tasks", Duration::from_secs(600), || {
        let t = tasks(&rt, &ledger);
        let done = t.iter().filter(|t| t.state == TaskState::Succeeded).count();
        let running = t.iter().filter(|t| t.state == TaskState::Running).count();
        done >= 3 && running > 0
    });
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let before = tasks(&rt, &ledger);
    assert_eq!(before.len(), 14);
    let cut: Vec<_> = before
        .iter()
        .filter(|t| t.state == TaskState::Running)
        .map(|t| t.task_id)
        .collect();
    assert!(!cut.is_empty(), "the kill hit tasks in flight");

    let mut second = spawn_logged(kiln(&config, &["run", "--once"]), &root.join("second.log"));
    let status = wait_exit(
        &mut second,
        Duration::from_secs(900),
        &root.join("second.log"),
    );
    let log = std::fs::read_to_string(root.join("second.log")).unwrap();
    assert!(status.success(), "restart failed: {log}");
    assert!(
        log.contains("14 task(s)") || log.contains("succeeded"),
        "summary printed: {log}"
    );

    let after = tasks(&rt, &ledger);
    assert_eq!(after.len(), 14, "no task recorded twice");
    for t in &after {
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        let rows = rt.block_on(ledger.attempts(t.task_id)).unwrap();
        let ok = rows
            .iter()
            .filter(|r| r.outcome == Some(AttemptOutcome::Succeeded))
            .count();
        assert_eq!(ok, 1, "{} succeeded {ok} times", t.task_id);
        if cut.contains(&t.task_id) {
            assert!(
                rows.iter()
                    .any(|r| r.outcome == Some(AttemptOutcome::Interrupted)),
                "{rows:?}"
            );
        }
    }
    // One output group per input, no suffixed duplicates, no temporaries left behind.
    let files = output_files(root);
    let mut want: Vec<String> = (0..6)
        .flat_map(|i| [format!("prompt {i}.json"), format!("prompt {i}.md")])
        .collect();
    want.push("batch.output.jsonl".into());
    want.sort();
    assert_eq!(files, want);
    let day = std::fs::read_dir(root.join("outputs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let out = std::fs::read_to_string(day.join("batch.output.jsonl")).unwrap();
    let mut ids: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["custom_id"]
                .as_str()
                .unwrap()
                .into()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8);
    for i in 0..6 {
        let md = std::fs::read_to_string(day.join(format!("prompt {i}.md"))).unwrap();
        assert!(!md.trim().is_empty());
    }
    rt.block_on(ledger.close());
}

/// Collects every datagram on a socket from a background thread (systemd always reads its
/// notify socket; a test that stopped reading would fill the queue).
fn collect_notifications(sock: UnixDatagram) -> Arc<Mutex<Vec<String>>> {
    let messages = Arc::new(Mutex::new(Vec::new()));
    let m = messages.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            m.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    messages
}

fn seen(messages: &Arc<Mutex<Vec<String>>>, what: &str) -> bool {
    messages.lock().unwrap().iter().any(|m| m.contains(what))
}

#[test]
fn sigterm_under_systemd_notify_and_the_ledger_lock() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let config = setup(root, 2, 20);
    let sock_path = root.join("notify.sock");
    let messages = collect_notifications(UnixDatagram::bind(&sock_path).unwrap());

    let mut cmd = kiln(&config, &["run"]);
    cmd.env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "1500000");
    let mut child = spawn_logged(cmd, &root.join("run.log"));
    let log = || std::fs::read_to_string(root.join("run.log")).unwrap_or_default();
    wait_for("READY=1", Duration::from_secs(300), || {
        assert!(
            child.try_wait().unwrap().is_none(),
            "kiln exited: {}",
            log()
        );
        seen(&messages, "READY=1")
    });
    let ready = messages
        .lock()
        .unwrap()
        .iter()
        .find(|m| m.contains("READY=1"))
        .cloned()
        .unwrap();
    assert!(ready.contains("STATUS=0 queued"), "{ready}");
    // Idle is healthy: the watchdog is pinged.
    wait_for("WATCHDOG=1", Duration::from_secs(10), || {
        seen(&messages, "WATCHDOG=1")
    });

    // A second daemon on the same ledger is refused.
    let second = kiln(&config, &["run", "--once"]).output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("locked"), "{err}");

    // Work arrives; SIGTERM while it runs.
    for i in 0..3 {
        drop_input(
            root,
            &format!("q{i}.txt"),
            "Write a short poem about the sea.",
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ledger = rt.block_on(Ledger::open(root.join("kiln.db"))).unwrap();
    wait_for("a task in flight", Duration::from_secs(120), || {
        tasks(&rt, &ledger)
            .iter()
            .any(|t| t.state == TaskState::Running)
    });
    let kill = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    let t2 = Instant::now();
    let exit = wait_exit(&mut child, Duration::from_secs(60), &root.join("run.log"));
    assert!(exit.success(), "exit {exit:?}: {}", log());
    assert!(
        t2.elapsed() < Duration::from_secs(25),
        "stopped within the grace period"
    );
    wait_for("STOPPING=1", Duration::from_secs(5), || {
        seen(&messages, "STOPPING=1")
    });
    assert!(
        seen(&messages, "STATUS=stopping"),
        "{:?}",
        messages.lock().unwrap()
    );
    for t in tasks(&rt, &ledger) {
        // Finished within the grace period, or back to queued with the attempt not counted.
        assert!(
            t.state == TaskState::Succeeded || (t.state == TaskState::Queued && t.attempts == 0),
            "{t:?}"
        );
    }
    rt.block_on(ledger.close());
}
