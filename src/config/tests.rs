//! Unit tests of `config.rs`: defaults, unknown keys, environment overrides, paths, validation.

use super::*;
use crate::engine::config::Device;
use crate::error::ErrorClass;

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn empty_file_gives_the_documented_defaults() {
    let c = Config::from_toml_str("", Path::new("config.toml"), no_env()).unwrap();
    assert_eq!(c.daemon.concurrency, 0, "auto");
    assert_eq!(
        c.daemon_concurrency(),
        2 * c.engine.max_num_seqs,
        "auto keeps every engine slot busy with a queue ahead"
    );
    assert_eq!(c.daemon.default_max_tokens, 1024);
    assert_eq!(c.daemon.task_timeout_secs, 600);
    assert_eq!(c.daemon.shutdown_grace_secs, 30);
    assert_eq!(c.daemon.stable_secs, 1.0);
    assert_eq!(c.daemon.rescan_secs, 30);
    assert!(!c.daemon.poll);
    assert_eq!(c.daemon.poll_interval_secs, 2.0);
    assert!(!c.daemon.follow_symlinks);
    assert_eq!(c.daemon.max_input_bytes, 16_777_216);
    assert_eq!(c.daemon.ledger, PathBuf::from("kiln.db"));
    assert_eq!(
        c.model.path,
        PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    assert!(c.model.fetch_default && c.model.is_embedded_default());
    assert_eq!(
        c.retry.max_attempts,
        MaxAttempts {
            oom: 4,
            timeout: 3,
            parse: 3,
            internal: 3
        }
    );
    assert_eq!(c.retry.max_attempts.for_class(ErrorClass::InvalidInput), 1);
    assert_eq!(c.logging.level, "info");
    assert_eq!(c.logging.format, LogFormat::Text);
    assert_eq!(c.engine, EngineConfig::default());
    c.validate().unwrap();
}

#[test]
fn repo_config_toml_parses_to_the_defaults() {
    // config.toml at the repo root documents every key with its default value.
    let text = include_str!("../../config.toml");
    let c = Config::from_toml_str(text, Path::new("config.toml"), no_env()).unwrap();
    assert_eq!(c, Config::default());
}

#[test]
fn unknown_key_is_an_error_naming_it() {
    let err = Config::from_toml_str("[daemon]\nconcurency = 3\n", Path::new("c.toml"), no_env())
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("concurency"), "{msg}");
    let err = Config::from_toml_str("[deamon]\n", Path::new("c.toml"), no_env()).unwrap_err();
    assert!(err.to_string().contains("deamon"), "{err}");
    let err = Config::from_toml_str("[engine]\nthreadz = 1\n", Path::new("c.toml"), no_env())
        .unwrap_err();
    assert!(err.to_string().contains("threadz"), "{err}");
}

#[test]
fn env_overrides_are_typed_like_the_key() {
    let text = "[daemon]\nconcurrency = 2\n[retry.max_attempts]\ntimeout = 5\n";
    let c = Config::from_toml_str(
        text,
        Path::new("c.toml"),
        env(&[
            ("KILN_DAEMON_CONCURRENCY", "8"),
            ("KILN_ENGINE_DEVICE", "cpu"),
            ("KILN_DAEMON_POLL", "true"),
            ("KILN_DAEMON_STABLE_SECS", "2.5"),
            ("KILN_MODEL_NAME", "123"),
            ("KILN_RETRY_MAX_ATTEMPTS_OOM", "7"),
            ("KILN_LOGGING_FORMAT", "json"),
            ("KILN_CONFIG", "ignored: not a section"),
            ("PATH", "/usr/bin"),
        ]),
    )
    .unwrap();
    assert_eq!(c.daemon.concurrency, 8);
    assert_eq!(c.engine.device, Device::Cpu);
    assert!(c.daemon.poll);
    assert_eq!(c.daemon.stable_secs, 2.5);
    assert_eq!(c.model.name, "123");
    assert_eq!(c.retry.max_attempts.oom, 7);
    assert_eq!(
        c.retry.max_attempts.timeout, 5,
        "the file's other nested keys stay"
    );
    assert_eq!(c.logging.format, LogFormat::Json);
}

#[test]
fn env_inline_table_merges_into_the_file_table() {
    let text = "[retry]\nmax_attempts = { timeout = 5 }\n";
    let c = Config::from_toml_str(
        text,
        Path::new("c.toml"),
        env(&[("KILN_RETRY_MAX_ATTEMPTS", "{ parse = 9 }")]),
    )
    .unwrap();
    assert_eq!(
        c.retry.max_attempts,
        MaxAttempts {
            oom: 4,
            timeout: 5,
            parse: 9,
            internal: 3
        }
    );
}

#[test]
fn env_errors_name_the_variable() {
    let err = Config::from_toml_str(
        "",
        Path::new("c.toml"),
        env(&[("KILN_DAEMON_CONCURENCY", "8")]),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("KILN_DAEMON_CONCURENCY") && msg.contains("concurency"),
        "{msg}"
    );
    let err = Config::from_toml_str(
        "",
        Path::new("c.toml"),
        env(&[("KILN_DAEMON_CONCURRENCY", "many")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("KILN_DAEMON_CONCURRENCY"), "{err}");
    let err = Config::from_toml_str(
        "",
        Path::new("c.toml"),
        env(&[("KILN_ENGINE_DEVICE", "gpu")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("KILN_ENGINE_DEVICE"), "{err}");
    let err = Config::from_toml_str(
        "",
        Path::new("c.toml"),
        env(&[("KILN_DAEMON_CONCURRENCY", "-1")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("KILN_DAEMON_CONCURRENCY"), "{err}");
}

#[test]
fn relative_paths_resolve_against_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("etc");
    std::fs::create_dir(&sub).unwrap();
    let path = write_config(
        &sub,
        "[model]\npath = \"/opt/m.gguf\"\n[daemon]\ninputs = \"in\"\noutputs = \"../out\"\nledger = \"state/kiln.db\"\n",
    );
    let c = Config::load_with_env(Some(&path), no_env()).unwrap();
    assert_eq!(c.source.as_deref(), Some(path.as_path()));
    assert_eq!(c.daemon.inputs, sub.join("in"));
    assert_eq!(c.daemon.outputs, sub.join("../out"));
    assert_eq!(c.daemon.logs, sub.join("logs"));
    assert_eq!(c.daemon.ledger, sub.join("state/kiln.db"));
    assert_eq!(
        c.model.path,
        PathBuf::from("/opt/m.gguf"),
        "absolute paths stay"
    );
    assert_eq!(c.daemon.task_log("abc"), sub.join("logs/tasks/abc.log"));
}

#[test]
fn an_explicit_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Config::load_with_env(Some(&dir.path().join("nope.toml")), no_env()).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err}");
    assert!(err.to_string().contains("nope.toml"));
}

#[test]
fn validation_errors_name_the_key() {
    let cases = [
        ("[daemon]\nconcurrency = 1000000\n", "daemon.concurrency"),
        (
            "[daemon]\ndefault_max_tokens = 0\n",
            "daemon.default_max_tokens",
        ),
        ("[engine]\nthreads = 100000\n", "engine.threads"),
        ("[logging]\nlevel = \"warning\"\n", "logging.level"),
        ("[logging]\nlevel = \"kiln\"\n", "logging.level"),
        ("[logging]\nlevel = \"info,sqlx=loud\"\n", "logging.level"),
        ("[logging]\nlevel = \"\"\n", "logging.level"),
        (
            "[daemon]\ntask_timeout_secs = 0\n",
            "daemon.task_timeout_secs",
        ),
        ("[daemon]\nstable_secs = -1.0\n", "daemon.stable_secs"),
        (
            "[daemon]\npoll_interval_secs = 0.0\n",
            "daemon.poll_interval_secs",
        ),
        ("[daemon]\nrescan_secs = 0\n", "daemon.rescan_secs"),
        ("[daemon]\nmax_input_bytes = 0\n", "daemon.max_input_bytes"),
        (
            "[daemon]\ninputs = \"data\"\noutputs = \"data/out\"\n",
            "daemon.outputs",
        ),
        ("[retry]\njitter = 1.5\n", "retry.jitter"),
        (
            "[retry]\nbackoff_base_secs = 0.0\n",
            "retry.backoff_base_secs",
        ),
        (
            "[retry]\nbackoff_base_secs = 10.0\nbackoff_max_secs = 5.0\n",
            "retry.backoff_max_secs",
        ),
        ("[retry.max_attempts]\noom = 0\n", "retry.max_attempts.oom"),
        ("[logging]\nlevel = \"kiln=[\"\n", "logging.level"),
        ("[engine]\nblock_size = 12\n", "engine.block_size"),
    ];
    for (text, key) in cases {
        let mut c = Config::from_toml_str(text, Path::new("c.toml"), no_env()).unwrap();
        c.resolve_paths(Path::new("/srv/kiln"));
        let err = c.validate().expect_err(text);
        assert!(err.to_string().contains(key), "{text}: {err}");
    }
}

#[test]
fn good_log_levels_and_an_explicit_concurrency_pass() {
    for level in [
        "info",
        "WARN",
        "kiln=debug,sqlx=warn",
        "warn,kiln::engine=trace",
        "off",
    ] {
        crate::config::check_log_level(level).unwrap_or_else(|e| panic!("{level}: {e}"));
    }
    let c = Config::from_toml_str("[daemon]\nconcurrency = 3\n", Path::new("c.toml"), no_env())
        .unwrap();
    assert_eq!(c.daemon_concurrency(), 3);
}

#[test]
fn bad_enum_values_are_parse_errors() {
    let err = Config::from_toml_str(
        "[logging]\nformat = \"xml\"\n",
        Path::new("c.toml"),
        no_env(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("xml"), "{err}");
}

#[test]
fn display_name_falls_back_to_the_stem() {
    let mut m = ModelSettings::default();
    assert_eq!(m.display_name(), "SmolLM2-135M-Instruct.Q4_1");
    m.name = "smol".into();
    assert_eq!(m.display_name(), "smol");
}

#[test]
fn non_ascii_variables_are_not_overrides() {
    let c = Config::from_toml_str(
        "",
        Path::new("c.toml"),
        env(&[("KILN_é_X", "1"), ("KILN_DAEMONé", "1")]),
    )
    .unwrap();
    assert_eq!(c, Config::default());
}

/// Every key path (`daemon.concurrency`, `retry.max_attempts.oom`, …) of a TOML table.
fn key_paths(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => key_paths(t, &path, out),
            _ => out.push(path),
        }
    }
}

#[test]
fn config_toml_documents_every_key() {
    // A key added to a settings struct (engine included) must be added to config.toml too.
    let documented: toml::Table = toml::from_str(include_str!("../../config.toml")).unwrap();
    let defaults = toml::Table::try_from(Config::default()).unwrap();
    let (mut have, mut want) = (Vec::new(), Vec::new());
    key_paths(&documented, "", &mut have);
    key_paths(&defaults, "", &mut want);
    have.sort();
    want.sort();
    assert_eq!(have, want);
    // Each key's comment block names its environment override.
    let text = include_str!("../../config.toml");
    for path in want.iter().filter(|p| p.matches('.').count() == 1) {
        let var = format!("KILN_{}", path.replace('.', "_").to_ascii_uppercase());
        assert!(text.contains(&var), "config.toml does not name {var}");
    }
}
