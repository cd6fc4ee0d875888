//! OpenAI chat-completions on the wire: request bodies → [`ChatRequest`] (→ [`GenerateRequest`]),
//! and the `chat.completion` / batch output and error line builders.
//!
//! Parsing is an explicit allow-list over the body's keys (no `deny_unknown_fields`):
//! - supported fields are validated with OpenAI's ranges and mapped onto [`SamplingParams`];
//! - known-but-unsupported fields (`tools`, `audio`, `stream: true`, ...) are a [`RequestError`]
//!   naming the parameter, so a batch line fails alone with a clear message;
//! - fields that mean nothing offline ([`IGNORED`]: `user`, `metadata`, ...; the README lists them)
//!   are accepted silently;
//! - any other field is a [`RequestError`] naming it: a typo such as `max_token` must not run the
//!   request uncapped. [`ChatRequest::warnings`] stays for notes that do not fail the request.
//!
//! A [`RequestError`] is always `invalid_input` (the same body can never succeed).
//! `response_format` is compiled here (a bad JSON schema is a request error) and checked on the
//! output by [`ResponseFormat::check`]; an output that fails it is a `parse` failure.
//! The response side (`chat.completion`, batch output and error lines) is in `openai/response.rs`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::engine::request::{ChatMessage, Prompt, SamplingParams};
use crate::engine::GenerateRequest;

mod response;
mod sampling;
pub use response::{batch_error_line, batch_output_line, chat_completion};

/// Fields we accept and act on.
const SUPPORTED: &[&str] = &[
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "response_format",
    "chat_template_kwargs",
    "stream",
];

/// Fields that carry no meaning for an offline engine; accepted silently. Listed in the README
/// ("Request fields"); every other unknown field fails the request.
pub const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
];

/// Known OpenAI / vLLM parameters kiln does not implement: a request using them fails clearly
/// instead of silently producing something else.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("tools", "tool calling is not supported"),
    ("tool_choice", "tool calling is not supported"),
    ("functions", "function calling is not supported"),
    ("function_call", "function calling is not supported"),
    ("audio", "audio output is not supported"),
    ("modalities", "only text output is supported"),
    ("prediction", "predicted outputs are not supported"),
    ("logit_bias", "logit_bias is not supported"),
    ("web_search_options", "web search is not supported"),
    (
        "stream_options",
        "streaming is not supported in batch files",
    ),
    (
        "guided_json",
        "guided decoding is not supported; use response_format",
    ),
    ("guided_regex", "guided decoding is not supported"),
    ("guided_choice", "guided decoding is not supported"),
    ("guided_grammar", "guided decoding is not supported"),
    (
        "structured_outputs",
        "structured outputs are not supported; use response_format",
    ),
];

/// A request that can never succeed as given (`invalid_input`), naming the parameter at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    /// The offending parameter (`messages[2].content`, `temperature`, ...), when there is one.
    pub param: Option<String>,
    /// What is wrong, phrased for the user.
    pub message: String,
}

impl RequestError {
    fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        RequestError {
            param: Some(param.into()),
            message: message.into(),
        }
    }
}

/// What the output must look like (`response_format`).
#[derive(Debug, Clone)]
pub enum ResponseFormat {
    /// Anything (the default).
    Text,
    /// A JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid under a schema (`{"type": "json_schema", "json_schema": {...}}`).
    JsonSchema {
        /// `json_schema.name`.
        name: String,
        /// The compiled `json_schema.schema`.
        validator: Arc<jsonschema::Validator>,
    },
}

impl ResponseFormat {
    /// Whether `text` satisfies the format; the error explains why not. Only whitespace around
    /// the JSON is tolerated (a Markdown code fence is a failure, as in OpenAI's JSON mode).
    pub fn check(&self, text: &str) -> Result<(), String> {
        let parse = || -> Result<Value, String> {
            serde_json::from_str::<Value>(text.trim())
                .map_err(|e| format!("output is not valid JSON ({e})"))
        };
        match self {
            ResponseFormat::Text => Ok(()),
            ResponseFormat::JsonObject => match parse()? {
                Value::Object(_) => Ok(()),
                other => Err(format!(
                    "output is JSON but not an object (found {})",
                    kind_of(&other)
                )),
            },
            ResponseFormat::JsonSchema { name, validator } => {
                let value = parse()?;
                let errors: Vec<String> = validator
                    .iter_errors(&value)
                    .take(3)
                    .map(|e| {
                        let at = e.instance_path().to_string();
                        if at.is_empty() {
                            e.to_string()
                        } else {
                            format!("{at}: {e}")
                        }
                    })
                    .collect();
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "output does not match JSON schema `{name}`: {}",
                        errors.join("; ")
                    ))
                }
            }
        }
    }

    /// Whether any constraint applies.
    pub fn is_constrained(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }
}

/// A validated chat-completions request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation (roles normalized: `developer` → `system`) and template kwargs.
    pub prompt: Prompt,
    /// Sampling parameters (`logprobs` = `Some(top_logprobs)` when `logprobs: true`).
    pub sampling: SamplingParams,
    /// What the output must look like.
    pub response_format: ResponseFormat,
    /// The `model` the request names, if any (outputs always name the model that ran).
    pub model: Option<String>,
    /// Notes for the task log that do not fail the request, one sentence each.
    pub warnings: Vec<String>,
}

impl ChatRequest {
    /// The engine request (no deadline: the dispatcher sets it per attempt).
    pub fn to_generate_request(&self) -> GenerateRequest {
        GenerateRequest {
            prompt: self.prompt.clone(),
            sampling: self.sampling.clone(),
            deadline: None,
        }
    }
}

/// The request body for a `.txt` / `.md` file: the whole text as one user message.
pub fn body_for_text(text: &str) -> Value {
    json!({ "messages": [{ "role": "user", "content": text }] })
}

/// Parse and validate a chat-completions request body.
pub fn parse_chat_request(body: &Value) -> Result<ChatRequest, RequestError> {
    let Value::Object(obj) = body else {
        return Err(RequestError {
            param: None,
            message: format!(
                "the request body must be a JSON object, found {}",
                kind_of(body)
            ),
        });
    };
    let warnings = Vec::new();
    for key in obj.keys() {
        let k = key.as_str();
        if let Some((_, why)) = UNSUPPORTED.iter().find(|(name, _)| *name == k) {
            // `null` / empty values of unsupported fields are harmless (many clients send them).
            if !is_empty_value(&obj[k]) {
                return Err(RequestError::new(
                    k,
                    format!("unsupported parameter `{k}`: {why}"),
                ));
            }
        } else if !SUPPORTED.contains(&k) && !IGNORED.contains(&k) {
            let close = SUPPORTED
                .iter()
                .find(|s| s.starts_with(k) || k.starts_with(*s))
                .map_or_else(String::new, |s| format!(" (did you mean `{s}`?)"));
            return Err(RequestError::new(
                k,
                format!("unknown parameter `{k}`{close}; the README lists the supported and the ignored request fields"),
            ));
        }
    }

    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(RequestError::new(
            "stream",
            "`stream: true` is not supported: batch files produce complete responses",
        ));
    }
    if let Some(n) = opt_u64(obj, "n")? {
        if n != 1 {
            return Err(RequestError::new(
                "n",
                format!("`n` = {n} is not supported (only 1 choice per request); send {n} separate requests instead"),
            ));
        }
    }

    let messages = parse_messages(obj.get("messages"))?;
    let template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(RequestError::new(
                "chat_template_kwargs",
                format!(
                    "`chat_template_kwargs` must be an object, found {}",
                    kind_of(other)
                ),
            ))
        }
    };

    let sampling = sampling::parse_sampling(obj)?;
    let response_format = parse_response_format(obj.get("response_format"))?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(RequestError::new(
                "model",
                format!("`model` must be a string, found {}", kind_of(other)),
            ))
        }
    };

    Ok(ChatRequest {
        prompt: Prompt::Chat {
            messages,
            template_kwargs,
        },
        sampling,
        response_format,
        model,
        warnings,
    })
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, RequestError> {
    let Some(v) = v else {
        return Err(RequestError::new("messages", "`messages` is required"));
    };
    let Value::Array(items) = v else {
        return Err(RequestError::new(
            "messages",
            format!("`messages` must be an array, found {}", kind_of(v)),
        ));
    };
    if items.is_empty() {
        return Err(RequestError::new(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(RequestError::new(
                &at,
                format!("`{at}` must be an object, found {}", kind_of(m)),
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            Some(other) => {
                return Err(RequestError::new(
                    format!("{at}.role"),
                    format!("`{at}.role` must be a string, found {}", kind_of(other)),
                ))
            }
            None => {
                return Err(RequestError::new(
                    format!("{at}.role"),
                    format!("`{at}.role` is required"),
                ))
            }
        };
        let role = match role {
            "system" | "user" | "assistant" => role.to_string(),
            // OpenAI's newer name for system instructions; chat templates know `system`.
            "developer" => "system".to_string(),
            "tool" | "function" => {
                return Err(RequestError::new(
                    format!("{at}.role"),
                    format!("`{at}.role` = `{role}`: tool messages are not supported"),
                ))
            }
            other => {
                return Err(RequestError::new(
                    format!("{at}.role"),
                    format!("`{at}.role` = `{other}` is not a known role (system, developer, user, assistant)"),
                ))
            }
        };
        for key in ["tool_calls", "function_call", "audio"] {
            if m.get(key).is_some_and(|v| !is_empty_value(v)) {
                return Err(RequestError::new(
                    format!("{at}.{key}"),
                    format!(
                        "`{at}.{key}` is not supported (tool calling and audio are not supported)"
                    ),
                ));
            }
        }
        let content = parse_content(m.get("content"), &at, &role)?;
        out.push(ChatMessage { role, content });
    }
    Ok(out)
}

fn parse_content(v: Option<&Value>, at: &str, role: &str) -> Result<String, RequestError> {
    let param = format!("{at}.content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        // An assistant turn may have null content (it then carried tool calls, rejected above).
        None | Some(Value::Null) if role == "assistant" => Ok(String::new()),
        None | Some(Value::Null) => {
            Err(RequestError::new(&param, format!("`{param}` is required")))
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let pat = format!("{param}[{j}]");
                let ty = part.get("type").and_then(Value::as_str);
                match ty {
                    Some("text") => match part.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => {
                            return Err(RequestError::new(
                                &pat,
                                format!("`{pat}.text` must be a string"),
                            ));
                        }
                    },
                    Some(other) => {
                        return Err(RequestError::new(
                            &pat,
                            format!(
                                "`{pat}`: content part type `{other}` is not supported (text only)"
                            ),
                        ))
                    }
                    None => {
                        return Err(RequestError::new(
                            &pat,
                            format!("`{pat}` must be an object with a `type`"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(RequestError::new(
            &param,
            format!(
                "`{param}` must be a string or an array of text parts, found {}",
                kind_of(other)
            ),
        )),
    }
}

fn parse_response_format(v: Option<&Value>) -> Result<ResponseFormat, RequestError> {
    const P: &str = "response_format";
    let obj = match v {
        None | Some(Value::Null) => return Ok(ResponseFormat::Text),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(RequestError::new(
                P,
                format!("`{P}` must be an object, found {}", kind_of(other)),
            ));
        }
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let Some(Value::Object(js)) = obj.get("json_schema") else {
                return Err(RequestError::new(
                    "response_format.json_schema",
                    "`response_format.json_schema` (an object with `name` and `schema`) is required",
                ));
            };
            let name = match js.get("name") {
                Some(Value::String(n))
                    if !n.is_empty()
                        && n.len() <= 64
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
                {
                    n.clone()
                }
                _ => {
                    return Err(RequestError::new(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` is required: 1-64 characters of a-z, A-Z, 0-9, _ and -",
                    ))
                }
            };
            let schema = js.get("schema").cloned().unwrap_or_else(|| json!({}));
            let validator = jsonschema::validator_for(&schema).map_err(|e| {
                RequestError::new(
                    "response_format.json_schema.schema",
                    format!("`response_format.json_schema.schema` is not a valid JSON schema: {e}"),
                )
            })?;
            Ok(ResponseFormat::JsonSchema { name, validator: Arc::new(validator) })
        }
        Some(other) => Err(RequestError::new(
            "response_format.type",
            format!("`response_format.type` = `{other}` is not supported (text, json_object, json_schema)"),
        )),
        None => Err(RequestError::new("response_format.type", "`response_format.type` is required")),
    }
}

fn opt_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            RequestError::new(
                key,
                format!("`{key}` must be a non-negative integer, got {v}"),
            )
        }),
    }
}

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// A JSON value's type name, for error messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
