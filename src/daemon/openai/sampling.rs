//! The sampling fields of a chat-completions body (`temperature`, `top_p`, `top_k`, `min_p`,
//! the penalties, `seed`, `stop`, `max_tokens` / `max_completion_tokens`, `ignore_eos`,
//! `logprobs` / `top_logprobs`, ...) validated with OpenAI's ranges and mapped onto
//! [`SamplingParams`]; a value out of range or of the wrong type is a [`RequestError`] naming the
//! field.

use serde_json::{Map, Value};

use super::{kind_of, opt_u64, RequestError};
use crate::engine::request::SamplingParams;

/// Most `top_logprobs` OpenAI allows.
const MAX_TOP_LOGPROBS: u64 = 20;

pub(super) fn parse_sampling(obj: &Map<String, Value>) -> Result<SamplingParams, RequestError> {
    let mut s = SamplingParams::default();
    if let Some(t) = opt_f32(obj, "temperature", 0.0, 2.0)? {
        s.temperature = t;
    }
    if let Some(p) = opt_f32(obj, "top_p", 0.0, 1.0)? {
        if p == 0.0 {
            return Err(RequestError::new(
                "top_p",
                "`top_p` must be in (0, 1], got 0",
            ));
        }
        s.top_p = p;
    }
    match obj.get("top_k") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            // vLLM uses -1 for "disabled".
            Some(-1) | Some(0) => s.top_k = 0,
            Some(k) if k > 0 && k <= u32::MAX as i64 => s.top_k = k as u32,
            _ => {
                return Err(RequestError::new(
                    "top_k",
                    format!("`top_k` must be -1, 0 or a positive integer, got {v}"),
                ))
            }
        },
    }
    if let Some(p) = opt_f32(obj, "min_p", 0.0, 1.0)? {
        s.min_p = p;
    }
    if let Some(p) = opt_f32(obj, "presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p;
    }
    if let Some(p) = opt_f32(obj, "frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p;
    }
    if let Some(p) = opt_f32(obj, "repetition_penalty", f32::MIN_POSITIVE, 100.0)? {
        s.repetition_penalty = p;
    }
    match obj.get("seed") {
        None | Some(Value::Null) => {}
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => s.seed = Some(u),
            // OpenAI allows negative seeds; keep their bits.
            (None, Some(i)) => s.seed = Some(i as u64),
            _ => {
                return Err(RequestError::new(
                    "seed",
                    format!("`seed` must be an integer, got {v}"),
                ))
            }
        },
    }

    let max_tokens = opt_u64(obj, "max_tokens")?;
    let max_completion = opt_u64(obj, "max_completion_tokens")?;
    let max = match (max_tokens, max_completion) {
        (Some(a), Some(b)) if a != b => {
            return Err(RequestError::new(
                "max_tokens",
                format!(
                "`max_tokens` ({a}) and `max_completion_tokens` ({b}) disagree; send one of them"
            ),
            ))
        }
        (a, b) => a.or(b),
    };
    if let Some(m) = max {
        if m == 0 || m > u32::MAX as u64 {
            return Err(RequestError::new(
                "max_tokens",
                format!("the token limit must be at least 1, got {m}"),
            ));
        }
        s.max_tokens = Some(m as u32);
    }

    s.stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, it) in items.iter().enumerate() {
                match it {
                    Value::String(t) => out.push(t.clone()),
                    other => {
                        return Err(RequestError::new(
                            "stop",
                            format!("`stop[{i}]` must be a string, found {}", kind_of(other)),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(RequestError::new(
                "stop",
                format!(
                    "`stop` must be a string or an array, found {}",
                    kind_of(other)
                ),
            ))
        }
    };
    if s.stop.iter().any(String::is_empty) {
        return Err(RequestError::new(
            "stop",
            "`stop` strings must not be empty",
        ));
    }
    match obj.get("stop_token_ids") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for it in items {
                match it.as_u64().and_then(|u| u32::try_from(u).ok()) {
                    Some(id) => s.stop_token_ids.push(id),
                    None => {
                        return Err(RequestError::new(
                            "stop_token_ids",
                            format!("`stop_token_ids` must hold token ids, found {it}"),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(RequestError::new(
                "stop_token_ids",
                format!(
                    "`stop_token_ids` must be an array, found {}",
                    kind_of(other)
                ),
            ))
        }
    }
    s.ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);

    let logprobs = opt_bool(obj, "logprobs")?.unwrap_or(false);
    let top = opt_u64(obj, "top_logprobs")?;
    match (logprobs, top) {
        (_, Some(t)) if t > MAX_TOP_LOGPROBS => {
            return Err(RequestError::new(
                "top_logprobs",
                format!("`top_logprobs` must be in 0..={MAX_TOP_LOGPROBS}, got {t}"),
            ))
        }
        (false, Some(t)) if t > 0 => {
            return Err(RequestError::new(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            ));
        }
        (true, t) => s.logprobs = Some(t.unwrap_or(0) as u32),
        (false, _) => {}
    }
    Ok(s)
}

fn opt_f32(
    obj: &Map<String, Value>,
    key: &str,
    lo: f32,
    hi: f32,
) -> Result<Option<f32>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && (lo as f64..=hi as f64).contains(&x) => Ok(Some(x as f32)),
            Some(x) => Err(RequestError::new(
                key,
                format!("`{key}` must be in [{lo}, {hi}], got {x}"),
            )),
            None => Err(RequestError::new(
                key,
                format!("`{key}` must be a number, found {}", kind_of(v)),
            )),
        },
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(RequestError::new(
            key,
            format!("`{key}` must be true or false, found {}", kind_of(v)),
        )),
    }
}
