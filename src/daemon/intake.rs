//! Task files → task specs: reads an input file once, hashes it, and splits it into tasks.
//!
//! Formats (the extension decides, case-insensitively):
//! - `.txt` / `.md`: the whole file (UTF-8, a leading BOM and surrounding whitespace dropped) is
//!   one user message. An optional front matter sets request fields: a first line `---`, then
//!   `key: value` lines (the value is JSON when it parses as JSON, else the text as a string), then
//!   a line `---`. Keys are chat-completions fields (`max_tokens`, `temperature`, `seed`,
//!   `response_format`, ...) plus `system` (a system message); they are validated like a `.json`
//!   request, so an unknown key fails the task. Without the closing `---` the file is plain text;
//! - `.json`: one OpenAI chat-completions request body;
//! - `.jsonl`: an OpenAI Batch input file, one `{custom_id, method, url, body}` per line; blank
//!   lines are skipped; a bad line becomes a task that fails alone with a per-line error.
//!
//! Every task spec carries either the request body to store in the ledger (`request_json`, so a
//! retry never re-reads the input) or the reason it can never run ([`IntakeError`], class
//! `invalid_input`, or `parse` for a file that stayed truncated). A whole-file problem (empty,
//! binary, invalid UTF-8 in a single-request file, over `max_input_bytes`, malformed JSON) is one
//! task without a line number.
//!
//! A file that ends in the middle of a JSON value (a `.json` with an unexpected end, or a
//! `.jsonl` whose last line has no newline and is cut short) looks like it is still being
//! written: with `allow_incomplete` the result is [`IntakeOutcome::Incomplete`] and the caller
//! looks again later (the `parse` class's backoff and attempt limit); on the last look it is
//! taken as is and the truncated part fails with class `parse`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::daemon::openai;
use crate::error::ErrorClass;

pub use crate::ledger::InputKind;

/// Why a task cannot run, decided at intake.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct IntakeError {
    /// `invalid_input`, or `parse` for a file that stayed truncated.
    pub class: ErrorClass,
    /// What is wrong, for the user (names the line for `.jsonl`).
    pub message: String,
}

impl IntakeError {
    fn invalid(message: impl Into<String>) -> Self {
        IntakeError {
            class: ErrorClass::InvalidInput,
            message: message.into(),
        }
    }
}

/// One task found in an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// 1-based line number (`.jsonl` only).
    pub line: Option<u32>,
    /// The batch line's `custom_id`, when it could be read.
    pub custom_id: Option<String>,
    /// The chat-completions request body, or why this task fails without running.
    pub body: Result<Value, IntakeError>,
    /// Unknown request fields that will be ignored (for the task log).
    pub warnings: Vec<String>,
}

/// What reading an input file gave.
#[derive(Debug, Clone, PartialEq)]
pub enum IntakeOutcome {
    /// The file's tasks (at least one; bad ones carry their error).
    Tasks(Vec<TaskSpec>),
    /// The file looks cut short (still being written): look again later.
    Incomplete(String),
}

/// An input file as read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadInput {
    /// Hex sha256 of the bytes read.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Its format.
    pub kind: InputKind,
    /// Its tasks, or `Incomplete`.
    pub outcome: IntakeOutcome,
}

/// An input file's bytes and hash, before parsing.
#[derive(Debug, Clone, PartialEq)]
pub struct RawInput {
    /// Hex sha256 of the content.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// The content; `None` when it is over the size limit (hashed without being kept).
    pub bytes: Option<Vec<u8>>,
    /// The limit that applied.
    pub max_bytes: u64,
}

impl RawInput {
    /// Split into task specs (see the module docs).
    pub fn parse(&self, kind: InputKind, allow_incomplete: bool) -> IntakeOutcome {
        match &self.bytes {
            Some(bytes) => parse_bytes(kind, bytes, allow_incomplete),
            None => IntakeOutcome::Tasks(vec![file_error(IntakeError::invalid(format!(
                "the file is {} bytes, over the limit of {} bytes (`daemon.max_input_bytes`)",
                self.size, self.max_bytes
            )))]),
        }
    }
}

/// Read and hash one input file. I/O errors (the file vanished, permissions) are returned as
/// is: the caller looks again later. Files over `max_bytes` are hashed in a stream.
pub fn read_raw(path: &Path, max_bytes: u64) -> std::io::Result<RawInput> {
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    if size > max_bytes {
        let (sha256, size) = hash_stream(&mut file)?;
        return Ok(RawInput {
            sha256,
            size,
            bytes: None,
            max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // Read at most one byte past the limit: the file may have grown since `metadata`.
    (&mut file).take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        let mut h = Sha256::new();
        h.update(&bytes);
        let size = bytes.len() as u64 + hash_into(&mut h, &mut file)?;
        return Ok(RawInput {
            sha256: hex::encode(h.finalize()),
            size,
            bytes: None,
            max_bytes,
        });
    }
    let sha256 = hex::encode(Sha256::digest(&bytes));
    Ok(RawInput {
        sha256,
        size: bytes.len() as u64,
        bytes: Some(bytes),
        max_bytes,
    })
}

/// [`read_raw`] then [`RawInput::parse`].
pub fn read_input(
    path: &Path,
    kind: InputKind,
    max_bytes: u64,
    allow_incomplete: bool,
) -> std::io::Result<ReadInput> {
    let raw = read_raw(path, max_bytes)?;
    let outcome = raw.parse(kind, allow_incomplete);
    Ok(ReadInput {
        sha256: raw.sha256,
        size: raw.size,
        kind,
        outcome,
    })
}

fn hash_stream(r: &mut impl Read) -> std::io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let total = hash_into(&mut h, r)?;
    Ok((hex::encode(h.finalize()), total))
}

/// Feed the rest of `r` into `h`; returns the number of bytes read.
fn hash_into(h: &mut Sha256, r: &mut impl Read) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
        h.update(&buf[..n]);
    }
}

fn file_error(err: IntakeError) -> TaskSpec {
    TaskSpec {
        line: None,
        custom_id: None,
        body: Err(err),
        warnings: Vec::new(),
    }
}

/// Split a file's bytes into task specs (see the module docs).
pub fn parse_bytes(kind: InputKind, bytes: &[u8], allow_incomplete: bool) -> IntakeOutcome {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        let what = if bytes.is_empty() {
            "the file is empty"
        } else {
            "the file holds only whitespace"
        };
        return IntakeOutcome::Tasks(vec![file_error(IntakeError::invalid(format!(
            "{what}: nothing to run"
        )))]);
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return IntakeOutcome::Tasks(vec![file_error(IntakeError::invalid(format!(
            "binary file (a NUL byte at offset {at}): task files are UTF-8 text"
        )))]);
    }
    match kind {
        InputKind::Txt | InputKind::Md => {
            IntakeOutcome::Tasks(vec![match utf8(bytes).and_then(text_body) {
                Ok(body) => TaskSpec {
                    line: None,
                    custom_id: None,
                    body: Ok(body),
                    warnings: Vec::new(),
                },
                Err(e) => file_error(e),
            }])
        }
        InputKind::Json => parse_json_file(bytes, allow_incomplete),
        InputKind::Jsonl => parse_jsonl(bytes, allow_incomplete),
    }
}

/// The request body of a `.txt` / `.md` file: its text as the user message, with the fields of
/// an optional front matter (see the module docs).
fn text_body(text: &str) -> Result<Value, IntakeError> {
    let Some((front, rest)) = split_front_matter(text) else {
        // Editors end files with a newline; it is not part of the question.
        return Ok(openai::body_for_text(text.trim()));
    };
    let question = rest.trim();
    if question.is_empty() {
        return Err(IntakeError::invalid(
            "the file has a front matter but no text after it: nothing to run",
        ));
    }
    let mut body = serde_json::Map::new();
    let mut system = None;
    for (i, line) in front.lines().enumerate() {
        let n = i + 2; // the opening `---` is line 1
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(IntakeError::invalid(format!(
                "front matter line {n}: expected `key: value`, found `{line}`"
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        let value = serde_json::from_str::<Value>(value)
            .unwrap_or_else(|_| Value::String(value.to_owned()));
        match key {
            "messages" => {
                return Err(IntakeError::invalid(format!(
                    "front matter line {n}: `messages` cannot be set in a front matter (the text is the user message; use `system` for a system message)"
                )))
            }
            "system" => match value {
                Value::String(s) => system = Some(s),
                other => {
                    return Err(IntakeError::invalid(format!(
                        "front matter line {n}: `system` must be text, found {}",
                        openai::kind_of(&other)
                    )))
                }
            },
            _ => {
                if body.insert(key.to_owned(), value).is_some() {
                    return Err(IntakeError::invalid(format!(
                        "front matter line {n}: `{key}` is set twice"
                    )));
                }
            }
        }
    }
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(serde_json::json!({ "role": "system", "content": s }));
    }
    messages.push(serde_json::json!({ "role": "user", "content": question }));
    body.insert("messages".into(), Value::Array(messages));
    let body = Value::Object(body);
    openai::parse_chat_request(&body)
        .map_err(|e| IntakeError::invalid(format!("front matter: invalid request: {e}")))?;
    Ok(body)
}

/// `Some((front matter, rest))` when `text` opens with a `---` line and has a closing `---` line.
fn split_front_matter(text: &str) -> Option<(&str, &str)> {
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..at], &rest[at + line.len()..]));
        }
        at += line.len();
    }
    None
}

fn utf8(bytes: &[u8]) -> Result<&str, IntakeError> {
    std::str::from_utf8(bytes).map_err(|e| {
        IntakeError::invalid(format!(
            "invalid UTF-8 at byte offset {}: task files are UTF-8 text",
            e.valid_up_to()
        ))
    })
}

fn parse_json_file(bytes: &[u8], allow_incomplete: bool) -> IntakeOutcome {
    let text = match utf8(bytes) {
        Ok(t) => t,
        Err(e) => return IntakeOutcome::Tasks(vec![file_error(e)]),
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) if e.is_eof() => {
            let msg = format!("the JSON ends early ({e}): the file may still be being written");
            if allow_incomplete {
                return IntakeOutcome::Incomplete(msg);
            }
            return IntakeOutcome::Tasks(vec![file_error(IntakeError {
                class: ErrorClass::Parse,
                message: msg,
            })]);
        }
        Err(e) => {
            return IntakeOutcome::Tasks(vec![file_error(IntakeError::invalid(format!(
                "malformed JSON: {e}"
            )))]);
        }
    };
    // A batch line saved as .json is a common mistake; say so instead of "messages is required".
    if value.get("body").is_some() && value.get("messages").is_none() {
        return IntakeOutcome::Tasks(vec![file_error(IntakeError::invalid(
            "this looks like an OpenAI batch line (it has `body`): a .json file holds one chat-completions request body; put batch lines in a .jsonl file",
        ))]);
    }
    let spec = match openai::parse_chat_request(&value) {
        Ok(req) => TaskSpec {
            line: None,
            custom_id: None,
            body: Ok(value),
            warnings: req.warnings,
        },
        Err(e) => file_error(IntakeError::invalid(format!("invalid request: {e}"))),
    };
    IntakeOutcome::Tasks(vec![spec])
}

fn parse_jsonl(bytes: &[u8], allow_incomplete: bool) -> IntakeOutcome {
    let mut specs = Vec::new();
    let mut seen: HashMap<String, u32> = HashMap::new();
    let ends_with_newline = bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    let last_index = lines.len() - 1;
    for (i, raw) in lines.iter().enumerate() {
        let n = (i + 1) as u32;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let fail = |class: ErrorClass, custom_id: Option<String>, msg: String| TaskSpec {
            line: Some(n),
            custom_id,
            body: Err(IntakeError {
                class,
                message: format!("line {n}: {msg}"),
            }),
            warnings: Vec::new(),
        };
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t,
            Err(e) => {
                specs.push(fail(
                    ErrorClass::InvalidInput,
                    None,
                    format!("invalid UTF-8 at byte {} of the line", e.valid_up_to()),
                ));
                continue;
            }
        };
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) if e.is_eof() && i == last_index && !ends_with_newline => {
                let msg =
                    format!("the last line ends early ({e}): the file may still be being written");
                if allow_incomplete {
                    return IntakeOutcome::Incomplete(msg);
                }
                specs.push(fail(ErrorClass::Parse, None, msg));
                continue;
            }
            Err(e) => {
                specs.push(fail(
                    ErrorClass::InvalidInput,
                    None,
                    format!("malformed JSON: {e}"),
                ));
                continue;
            }
        };
        let spec = match batch_line(&value) {
            Ok((custom_id, body)) => {
                if let Some(first) = seen.get(&custom_id) {
                    fail(
                        ErrorClass::InvalidInput,
                        Some(custom_id.clone()),
                        format!("duplicate custom_id `{custom_id}` (first used on line {first})"),
                    )
                } else {
                    seen.insert(custom_id.clone(), n);
                    match openai::parse_chat_request(&body) {
                        Ok(req) => TaskSpec {
                            line: Some(n),
                            custom_id: Some(custom_id),
                            body: Ok(body),
                            warnings: req.warnings,
                        },
                        Err(e) => fail(
                            ErrorClass::InvalidInput,
                            Some(custom_id),
                            format!("invalid request: {e}"),
                        ),
                    }
                }
            }
            Err((custom_id, msg)) => fail(ErrorClass::InvalidInput, custom_id, msg),
        };
        specs.push(spec);
    }
    if specs.is_empty() {
        // Only blank lines (the all-whitespace case is caught earlier; this keeps the invariant).
        specs.push(file_error(IntakeError::invalid(
            "no requests: every line is blank",
        )));
    }
    IntakeOutcome::Tasks(specs)
}

/// Split a batch line into `(custom_id, body)`. `method` must be `POST` and `url` the
/// chat-completions endpoint when present (both are optional for convenience).
fn batch_line(v: &Value) -> Result<(String, Value), (Option<String>, String)> {
    let Value::Object(obj) = v else {
        return Err((
            None,
            format!(
                "a batch line must be a JSON object, found {}",
                openai::kind_of(v)
            ),
        ));
    };
    let custom_id = match obj.get("custom_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => return Err((None, "`custom_id` must not be empty".into())),
        Some(other) => {
            return Err((
                None,
                format!(
                    "`custom_id` must be a string, found {}",
                    openai::kind_of(other)
                ),
            ))
        }
        None => return Err((None, "`custom_id` is required".into())),
    };
    let cid = Some(custom_id.clone());
    match obj.get("method") {
        None => {}
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => return Err((cid, format!("`method` must be \"POST\", found {other}"))),
    }
    match obj.get("url") {
        None => {}
        Some(Value::String(u)) if u.trim_end_matches('/').ends_with("/chat/completions") => {}
        Some(other) => {
            return Err((
                cid,
                format!("`url` {other} is not supported: only /v1/chat/completions is served"),
            ));
        }
    }
    match obj.get("body") {
        Some(b @ Value::Object(_)) => Ok((custom_id, b.clone())),
        Some(other) => Err((
            cid,
            format!("`body` must be an object, found {}", openai::kind_of(other)),
        )),
        None => Err((cid, "`body` is required".into())),
    }
}

#[cfg(test)]
mod tests;
