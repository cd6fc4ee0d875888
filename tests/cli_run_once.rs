//! `kiln run --once` as a process with the real default model: truthful exit status and one
//! summary line per input file (issue 11, item 3).
//!
//! Needs the model file like `daemon_e2e.rs` (`kiln model fetch-default` or `KILN_TEST_MODEL`).
//! Run: `cargo test --test cli_run_once`.

use std::path::{Path, PathBuf};
use std::process::Command;

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

fn setup(dir: &Path) -> PathBuf {
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\npath = {:?}\nfetch_default = false\n\n[engine]\ndevice = \"cpu\"\nmax_model_len = 512\n\n\
         [daemon]\nstable_secs = 0.1\ndefault_max_tokens = 8\n\n[logging]\nlevel = \"warn\"\n",
        model_path().to_string_lossy()
    );
    std::fs::write(&config, text).unwrap();
    std::fs::create_dir_all(dir.join("inputs")).unwrap();
    config
}

fn run_once(config: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--config")
        .arg(config)
        .args(["run", "--once", "--no-progress"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .output()
        .expect("run kiln");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_status_says_whether_every_task_succeeded_and_every_output_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    std::fs::write(dir.path().join("inputs/ok.txt"), "Say hi.").unwrap();
    let (code, err) = run_once(&config);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("  ok.txt: 1 task(s), 1 succeeded, 0 failed -> "),
        "{err}"
    );

    // A failed task: exit 2, its own line says so.
    std::fs::write(dir.path().join("inputs/bad.json"), "{\"messages\": ]}").unwrap();
    let (code, err) = run_once(&config);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("  bad.json: 1 task(s), 0 succeeded, 1 failed -> "),
        "{err}"
    );

    // Outputs that cannot be written (today's folder is taken by a file): exit 3, not "succeeded".
    let today = time::OffsetDateTime::now_utc().date();
    let day = format!(
        "{:04}-{:02}-{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    let outputs = dir.path().join("outputs");
    std::fs::rename(outputs.join(&day), dir.path().join("moved")).unwrap();
    std::fs::write(outputs.join(&day), "not a folder").unwrap();
    std::fs::write(dir.path().join("inputs/later.txt"), "Say bye.").unwrap();
    let (code, err) = run_once(&config);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains(
            "  later.txt: 1 task(s), 1 succeeded, 0 failed; OUTPUTS NOT WRITTEN for 1 task(s)"
        ),
        "{err}"
    );
}
