//! Outputs: what a finished input file turns into, and how it lands under `outputs/`.
//!
//! Rendering (pure): [`render`] maps an input file's finished tasks onto a group of output files
//! (`<stem>.md` + `<stem>.json`, `<stem>.json`, `<stem>.error.json`, `<stem>.output.jsonl` +
//! `<stem>.errors.jsonl`), byte-for-byte determined by the ledger rows (no clocks read here), so
//! rendering the same rows twice gives the same bytes.
//!
//! Placing: the group goes to `outputs/<YYYY-MM-DD>/` (UTC), all its files under one stem.
//! Invariants:
//! - a name never escapes `outputs/`: the stem is one sanitized path component and the day folder
//!   is created by us (a symlinked day folder is refused);
//! - all or nothing ([`OutputDir::stage`], then [`OutputDir::link_plan`]): every file of the group
//!   is first written to a hidden temporary in the day folder and fsynced; the publisher records
//!   the plan in the ledger (`output_intents`); then each temporary is linked into place without
//!   replacing anything (`link(2)` fails on an existing name) and the folder is fsynced; then the
//!   tasks' output paths are recorded and the plan forgotten in one transaction. A crash anywhere
//!   leaves either no visible file (temporaries only, removed at start) or a recorded plan that
//!   the next start completes from its temporaries ([`OutputDir::link_plan`] is idempotent) or
//!   rolls back ([`OutputDir::roll_back`]): never a partial group, never a second `<stem>-1`;
//! - nothing is overwritten: when the stem is taken (any file of its group exists), the next free
//!   `<stem>-1`, `<stem>-2`, ... is used;
//! - an identical group is reused: if the group at one of the bases the ledger recorded for the
//!   input (its tasks' output paths, whatever their day folder) is byte-identical, nothing is
//!   written.

mod place;

pub use place::{
    group_base, write_new, GroupPlan, OutputDir, Placed, Staged, StagedFile, WriteError,
};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::daemon::intake::InputKind;
use crate::daemon::openai;
use crate::engine::request::Completion;
use crate::error::ErrorClass;

/// What the ledger's `result_json` holds for a succeeded task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    /// The model that produced it (`EngineInfo::model`).
    pub model: String,
    /// When it finished, unix seconds (the `created` of the `chat.completion`).
    pub created: i64,
    /// What the engine returned.
    pub completion: Completion,
}

/// How a task ended, as far as outputs care.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// It produced a result.
    Succeeded(StoredResult),
    /// It ended without one (`failed`, `dead` or `cancelled`).
    Failed {
        /// The ledger state label.
        state: String,
        /// The class of the last failure (`None` for a cancelled task that never failed).
        class: Option<ErrorClass>,
        /// The last error message.
        message: String,
        /// Attempts made.
        attempts: u32,
    },
}

/// A terminal task of one input file.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedTask {
    /// UUID v7 text.
    pub task_id: String,
    /// 1-based line (`.jsonl`).
    pub line: Option<u32>,
    /// Echoed `custom_id` (`.jsonl`).
    pub custom_id: Option<String>,
    /// How it ended.
    pub outcome: TaskOutcome,
}

/// One file of an output group: the extension after the stem and the bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputFile {
    /// `.md`, `.json`, `.error.json`, `.output.jsonl`, `.errors.jsonl`.
    pub ext: &'static str,
    /// The whole content.
    pub bytes: Vec<u8>,
    /// The tasks this file reports on (their `output_path` becomes this file).
    pub task_ids: Vec<String>,
}

/// Every extension an input kind's output group may use: a stem is taken when any exists.
pub fn group_exts(kind: InputKind) -> &'static [&'static str] {
    match kind {
        InputKind::Txt | InputKind::Md => &[".md", ".json", ".error.json"],
        InputKind::Json => &[".json", ".error.json"],
        InputKind::Jsonl => &[".output.jsonl", ".errors.jsonl"],
    }
}

/// Render the output group of an input file whose tasks are all terminal. `input` is the path
/// relative to `inputs/`, recorded in metadata and error files.
pub fn render(kind: InputKind, input: &str, tasks: &[FinishedTask]) -> Vec<OutputFile> {
    match kind {
        InputKind::Jsonl => render_jsonl(tasks),
        InputKind::Txt | InputKind::Md | InputKind::Json => {
            // Single-task files have exactly one task; render each defensively.
            tasks
                .iter()
                .flat_map(|t| render_single(kind, input, t))
                .collect()
        }
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(v).unwrap_or_default();
    b.push(b'\n');
    b
}

fn render_single(kind: InputKind, input: &str, t: &FinishedTask) -> Vec<OutputFile> {
    let ids = vec![t.task_id.clone()];
    match &t.outcome {
        TaskOutcome::Succeeded(r) if kind == InputKind::Json => vec![OutputFile {
            ext: ".json",
            bytes: pretty(&openai::chat_completion(
                &t.task_id,
                &r.model,
                r.created,
                &r.completion,
            )),
            task_ids: ids,
        }],
        TaskOutcome::Succeeded(r) => {
            let c = &r.completion;
            let meta = json!({
                "task_id": t.task_id,
                "input": input,
                "model": r.model,
                "created": r.created,
                "finish_reason": c.finish_reason.as_str(),
                "usage": {
                    "prompt_tokens": c.usage.prompt_tokens,
                    "completion_tokens": c.usage.completion_tokens,
                    "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens,
                    "cached_tokens": c.usage.cached_prompt_tokens,
                },
                "timings": {
                    "queue_ms": c.timings.queue.as_secs_f64() * 1e3,
                    "ttft_ms": c.timings.ttft.as_secs_f64() * 1e3,
                    "total_ms": c.timings.total.as_secs_f64() * 1e3,
                    "decode_tokens_per_s": c.timings.decode_tokens_per_s,
                },
            });
            let mut text = c.text.clone().into_bytes();
            if !text.ends_with(b"\n") {
                text.push(b'\n');
            }
            vec![
                OutputFile {
                    ext: ".md",
                    bytes: text,
                    task_ids: ids.clone(),
                },
                OutputFile {
                    ext: ".json",
                    bytes: pretty(&meta),
                    task_ids: ids,
                },
            ]
        }
        TaskOutcome::Failed {
            state,
            class,
            message,
            attempts,
        } => vec![OutputFile {
            ext: ".error.json",
            bytes: pretty(&json!({
                "task_id": t.task_id,
                "input": input,
                "state": state,
                "error_class": class.map(ErrorClass::as_str),
                "error": message,
                "attempts": attempts,
            })),
            task_ids: ids,
        }],
    }
}

fn render_jsonl(tasks: &[FinishedTask]) -> Vec<OutputFile> {
    let mut sorted: Vec<&FinishedTask> = tasks.iter().collect();
    sorted.sort_by_key(|t| (t.line.unwrap_or(0), t.task_id.clone()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_ids, mut err_ids) = (Vec::new(), Vec::new());
    for t in sorted {
        let cid = t.custom_id.as_deref();
        let line = match &t.outcome {
            TaskOutcome::Succeeded(r) => {
                let body = openai::chat_completion(&t.task_id, &r.model, r.created, &r.completion);
                out_ids.push(t.task_id.clone());
                (&mut out, openai::batch_output_line(&t.task_id, cid, body))
            }
            TaskOutcome::Failed {
                state,
                class,
                message,
                attempts,
            } => {
                let msg = match state.as_str() {
                    "dead" => format!("{message} (gave up after {attempts} attempts)"),
                    _ => message.clone(),
                };
                err_ids.push(t.task_id.clone());
                let line = match class {
                    Some(c) => openai::batch_error_line(&t.task_id, cid, *c, &msg),
                    None => json!({
                        "id": t.task_id, "custom_id": cid, "response": null,
                        "error": { "code": state, "message": msg },
                    }),
                };
                (&mut err, line)
            }
        };
        let (buf, value) = line;
        // serde_json never fails on a Value; an empty line would still be valid JSONL.
        buf.extend_from_slice(serde_json::to_string(&value).unwrap_or_default().as_bytes());
        buf.push(b'\n');
    }
    let mut files = Vec::new();
    if !out_ids.is_empty() {
        files.push(OutputFile {
            ext: ".output.jsonl",
            bytes: out,
            task_ids: out_ids,
        });
    }
    if !err_ids.is_empty() {
        files.push(OutputFile {
            ext: ".errors.jsonl",
            bytes: err,
            task_ids: err_ids,
        });
    }
    files
}

/// A file name stem for an input path (relative to `inputs/`): its file stem, made one safe
/// path component. Spaces and non-ASCII letters are kept; path separators, control characters
/// and leading dots are replaced; at most 200 bytes.
pub fn safe_stem(input: &str) -> String {
    let name = input.rsplit(['/', '\\']).next().unwrap_or(input);
    let stem = match name.rfind('.') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    };
    let mut s: String = stem
        .chars()
        .map(|c| {
            if c.is_control() || matches!(c, '/' | '\\' | ':') {
                '_'
            } else {
                c
            }
        })
        .collect();
    while s.starts_with('.') {
        s.replace_range(..1, "_");
    }
    let s = s.trim().to_string();
    let mut s = if s.is_empty() { "input".to_string() } else { s };
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::{FinishReason, Timings, Usage};
    use std::path::{Component, Path};
    use std::time::Duration;

    pub(super) fn result(text: &str) -> StoredResult {
        StoredResult {
            model: "smol".into(),
            created: 1_700_000_000,
            completion: Completion {
                text: text.into(),
                token_ids: vec![1, 2],
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: 7,
                    completion_tokens: 2,
                    cached_prompt_tokens: 0,
                },
                timings: Timings {
                    queue: Duration::from_millis(1),
                    ttft: Duration::from_millis(20),
                    total: Duration::from_millis(50),
                    decode_tokens_per_s: 33.0,
                },
                logprobs: None,
            },
        }
    }

    pub(super) fn ok(id: &str, line: Option<u32>, cid: Option<&str>, text: &str) -> FinishedTask {
        FinishedTask {
            task_id: id.into(),
            line,
            custom_id: cid.map(Into::into),
            outcome: TaskOutcome::Succeeded(result(text)),
        }
    }

    pub(super) fn failed(
        id: &str,
        line: Option<u32>,
        cid: Option<&str>,
        state: &str,
        class: ErrorClass,
    ) -> FinishedTask {
        FinishedTask {
            task_id: id.into(),
            line,
            custom_id: cid.map(Into::into),
            outcome: TaskOutcome::Failed {
                state: state.into(),
                class: Some(class),
                message: "boom".into(),
                attempts: 3,
            },
        }
    }

    #[test]
    fn stems_are_one_safe_component() {
        assert_eq!(safe_stem("my prompt ü.txt"), "my prompt ü");
        assert_eq!(safe_stem("sub/dir/a.b.jsonl"), "a.b");
        assert_eq!(safe_stem("../../etc/passwd"), "passwd");
        assert_eq!(safe_stem(".."), "_");
        assert_eq!(safe_stem(".hidden.txt"), "_hidden");
        assert_eq!(safe_stem("a\u{7}b\nc.md"), "a_b_c");
        assert_eq!(safe_stem(".txt"), "_txt");
        assert_eq!(safe_stem(""), "input");
        assert!(safe_stem(&"é".repeat(300)).len() <= 200);
        for s in ["../x.txt", "..", "/", "a/../../b.md", "C:\\x\\..\\y.txt"] {
            let stem = safe_stem(s);
            let comps: Vec<_> = Path::new(&stem).components().collect();
            assert_eq!(comps.len(), 1, "{s} → {stem}");
            assert!(matches!(comps[0], Component::Normal(_)), "{s} → {stem}");
        }
    }

    #[test]
    fn text_success_is_markdown_plus_metadata() {
        let files = render(InputKind::Txt, "q.txt", &[ok("t1", None, None, "Paris.")]);
        assert_eq!(
            files.iter().map(|f| f.ext).collect::<Vec<_>>(),
            vec![".md", ".json"]
        );
        assert_eq!(files[0].bytes, b"Paris.\n");
        let meta: Value = serde_json::from_slice(&files[1].bytes).expect("json");
        assert_eq!(meta["task_id"], "t1");
        assert_eq!(meta["model"], "smol");
        assert_eq!(meta["finish_reason"], "stop");
        assert_eq!(meta["usage"]["total_tokens"], 9);
        assert_eq!(meta["timings"]["ttft_ms"], 20.0);
        assert_eq!(meta["input"], "q.txt");
    }

    #[test]
    fn json_success_is_a_chat_completion_and_failures_an_error_file() {
        let files = render(InputKind::Json, "r.json", &[ok("t1", None, None, "hi")]);
        assert_eq!(files.len(), 1);
        let v: Value = serde_json::from_slice(&files[0].bytes).expect("json");
        assert_eq!(v["object"], "chat.completion");
        let files = render(
            InputKind::Md,
            "r.md",
            &[failed("t2", None, None, "dead", ErrorClass::Timeout)],
        );
        assert_eq!(files[0].ext, ".error.json");
        let v: Value = serde_json::from_slice(&files[0].bytes).expect("json");
        assert_eq!(
            (
                v["state"].as_str(),
                v["error_class"].as_str(),
                v["attempts"].as_u64()
            ),
            (Some("dead"), Some("timeout"), Some(3))
        );
    }

    #[test]
    fn jsonl_splits_successes_and_failures_in_line_order() {
        let tasks = vec![
            failed("t3", Some(3), None, "failed", ErrorClass::InvalidInput),
            ok("t2", Some(2), Some("b"), "two"),
            ok("t1", Some(1), Some("a"), "one"),
            failed("t4", Some(4), Some("d"), "dead", ErrorClass::Oom),
        ];
        let files = render(InputKind::Jsonl, "batch.jsonl", &tasks);
        assert_eq!(
            files.iter().map(|f| f.ext).collect::<Vec<_>>(),
            vec![".output.jsonl", ".errors.jsonl"]
        );
        let lines = |b: &[u8]| -> Vec<Value> {
            std::str::from_utf8(b)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let out = lines(&files[0].bytes);
        assert_eq!(
            out.iter()
                .map(|l| l["custom_id"].as_str().unwrap())
                .collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        assert_eq!(out[0]["id"], "t1");
        assert_eq!(
            out[0]["response"]["body"]["choices"][0]["message"]["content"],
            "one"
        );
        let err = lines(&files[1].bytes);
        assert_eq!(err.len(), 2);
        assert_eq!(err[0]["response"]["status_code"], 400);
        assert!(err[0]["custom_id"].is_null());
        assert_eq!(err[1]["error"]["code"], "oom");
        assert!(err[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("after 3 attempts"));
        assert_eq!(files[1].task_ids, vec!["t3".to_string(), "t4".to_string()]);
        // Only failures: no empty output file.
        let only_bad = render(InputKind::Jsonl, "b.jsonl", &tasks[..1]);
        assert_eq!(
            only_bad.iter().map(|f| f.ext).collect::<Vec<_>>(),
            vec![".errors.jsonl"]
        );
    }
}
