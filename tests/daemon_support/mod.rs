//! Shared helpers of the daemon integration tests: a temporary kiln folder, a scripted engine
//! double, and readers for outputs and the ledger.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln::config::Config;
use kiln::daemon::{self, RunOptions, RunSummary};
use kiln::engine::request::{Completion, FinishReason, Timings, Usage};
use kiln::engine::{EngineHandle, EngineInfo, GenerateRequest, Prompt};
use kiln::error::EngineError;
use kiln::ledger::{Ledger, ListFilter, Task, TaskState};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A kiln folder under a temporary directory, with fast test settings.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: Config,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::default();
        let root = dir.path();
        config.daemon.inputs = root.join("inputs");
        config.daemon.outputs = root.join("outputs");
        config.daemon.logs = root.join("logs");
        config.daemon.ledger = root.join("state/kiln.db");
        config.daemon.stable_secs = 0.2;
        config.daemon.rescan_secs = 3600;
        config.daemon.concurrency = 4;
        config.daemon.shutdown_grace_secs = 1;
        config.retry.jitter = 0.0;
        std::fs::create_dir_all(&config.daemon.inputs).expect("inputs");
        Env { dir, config }
    }

    pub fn inputs(&self) -> &Path {
        &self.config.daemon.inputs
    }

    /// Write an input file atomically (temporary name, then rename), as producers should.
    pub fn drop_input(&self, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let tmp = self.inputs().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("write input");
        let path = self.inputs().join(name);
        std::fs::rename(&tmp, &path).expect("rename input");
        path
    }

    pub async fn ledger(&self) -> Ledger {
        Ledger::open(&self.config.daemon.ledger)
            .await
            .expect("open ledger")
    }

    /// `kiln run --once` with this engine.
    pub async fn run_once(&self, engine: &EngineHandle) -> RunSummary {
        let ledger = self.ledger().await;
        let opts = RunOptions {
            once: true,
            ..Default::default()
        };
        let s = daemon::run(
            &self.config,
            ledger.clone(),
            engine.clone(),
            CancellationToken::new(),
            opts,
        )
        .await
        .expect("daemon run");
        ledger.close().await;
        s
    }

    /// Every file under `outputs/`, as (path relative to outputs/, content).
    pub fn outputs(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let root = &self.config.daemon.outputs;
        let Ok(days) = std::fs::read_dir(root) else {
            return out;
        };
        for day in days.flatten() {
            for f in std::fs::read_dir(day.path()).expect("day dir").flatten() {
                let rel = f
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read(f.path()).expect("read output")));
            }
        }
        out.sort();
        out
    }

    /// The output whose file name (after the day folder) is `name`.
    pub fn output(&self, name: &str) -> Option<Vec<u8>> {
        self.outputs()
            .into_iter()
            .find(|(rel, _)| rel.split('/').nth(1) == Some(name))
            .map(|(_, b)| b)
    }

    pub fn output_json(&self, name: &str) -> Value {
        let b = self
            .output(name)
            .unwrap_or_else(|| panic!("no output {name}: {:?}", self.output_names()));
        serde_json::from_slice(&b).expect("json output")
    }

    pub fn output_lines(&self, name: &str) -> Vec<Value> {
        let b = self
            .output(name)
            .unwrap_or_else(|| panic!("no output {name}: {:?}", self.output_names()));
        String::from_utf8(b)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).expect("jsonl line"))
            .collect()
    }

    pub fn output_names(&self) -> Vec<String> {
        self.outputs()
            .into_iter()
            .map(|(rel, _)| rel.split('/').nth(1).unwrap().to_string())
            .collect()
    }

    pub fn task_log(&self, task: &Task) -> String {
        std::fs::read_to_string(
            self.config
                .daemon
                .logs
                .join("tasks")
                .join(format!("{}.log", task.task_id)),
        )
        .unwrap_or_default()
    }
}

pub async fn all_tasks(ledger: &Ledger) -> Vec<Task> {
    ledger.list(&ListFilter::default()).await.expect("list")
}

pub async fn tasks_of(ledger: &Ledger, input: &str) -> Vec<Task> {
    all_tasks(ledger)
        .await
        .into_iter()
        .filter(|t| t.input_path == input)
        .collect()
}

pub fn info() -> EngineInfo {
    EngineInfo {
        model: "test-model".into(),
        max_model_len: 2048,
        device: "test double".into(),
        weight_bytes: 0,
    }
}

/// The text of the last user message (or the raw prompt).
pub fn prompt_text(req: &GenerateRequest) -> String {
    match &req.prompt {
        Prompt::Chat { messages, .. } => messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default(),
        Prompt::Text(t) => t.clone(),
        Prompt::TokenIds(ids) => format!("{ids:?}"),
    }
}

pub fn completion(text: &str) -> Completion {
    Completion {
        text: text.to_string(),
        token_ids: vec![1, 2, 3],
        finish_reason: FinishReason::Stop,
        usage: Usage {
            prompt_tokens: 11,
            completion_tokens: 3,
            cached_prompt_tokens: 0,
        },
        timings: Timings {
            queue: Duration::from_millis(1),
            ttft: Duration::from_millis(5),
            total: Duration::from_millis(9),
            decode_tokens_per_s: 500.0,
        },
        logprobs: None,
    }
}

/// An engine that echoes the prompt back (`echo: <prompt>`).
pub fn echo_engine() -> EngineHandle {
    EngineHandle::from_fn(info(), |req| async move {
        Ok(completion(&format!("echo: {}", prompt_text(&req))))
    })
}

/// What the scripted engine saw.
#[derive(Debug, Clone)]
pub struct Call {
    pub prompt: String,
    pub seed: Option<u64>,
    pub at: tokio::time::Instant,
}

/// An engine whose answer depends on the prompt and on how often that prompt was seen:
/// `script(prompt, n)` with `n` = 1 for the first call.
pub fn scripted_engine<F>(script: F) -> (EngineHandle, Arc<Mutex<Vec<Call>>>)
where
    F: Fn(&str, u32) -> Result<String, EngineError> + Send + Sync + 'static,
{
    let calls: Arc<Mutex<Vec<Call>>> = Arc::new(Mutex::new(Vec::new()));
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::new(Mutex::new(HashMap::new()));
    let script = Arc::new(script);
    let c = calls.clone();
    let engine = EngineHandle::from_fn(info(), move |req: GenerateRequest| {
        let prompt = prompt_text(&req);
        let n = {
            let mut s = seen.lock().unwrap();
            let e = s.entry(prompt.clone()).or_insert(0);
            *e += 1;
            *e
        };
        c.lock().unwrap().push(Call {
            prompt: prompt.clone(),
            seed: req.sampling.seed,
            at: tokio::time::Instant::now(),
        });
        let answer = script(&prompt, n);
        async move { answer.map(|t| completion(&t)) }
    });
    (engine, calls)
}

/// A batch line asking for `content`.
pub fn batch_line(custom_id: &str, content: &str) -> String {
    serde_json::json!({
        "custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
        "body": { "model": "test-model", "messages": [{ "role": "user", "content": content }] },
    })
    .to_string()
}

pub fn count_state(tasks: &[Task], state: TaskState) -> usize {
    tasks.iter().filter(|t| t.state == state).count()
}
