//! Response builders: the `chat.completion` object and the OpenAI batch output / error lines.

use serde_json::{json, Value};

use crate::engine::request::Completion;
use crate::error::ErrorClass;

/// The OpenAI `chat.completion` object for a finished task. `id` is `chatcmpl-<task_id>`;
/// `created` is unix seconds; `usage.prompt_tokens_details.cached_tokens` reports prefix-cache hits.
pub fn chat_completion(task_id: &str, model: &str, created: i64, c: &Completion) -> Value {
    let logprobs = c.logprobs.as_ref().map(|lps| {
        let content: Vec<Value> = lps
            .iter()
            .map(|lp| {
                json!({
                    "token": lp.token,
                    "logprob": lp.logprob,
                    "bytes": lp.token.as_bytes(),
                    "top_logprobs": lp.top.iter().map(|t| json!({
                        "token": t.token,
                        "logprob": t.logprob,
                        "bytes": t.token.as_bytes(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({ "content": content })
    });
    json!({
        "id": format!("chatcmpl-{task_id}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": c.text, "refusal": null },
            "logprobs": logprobs,
            "finish_reason": c.finish_reason.as_str(),
        }],
        "usage": {
            "prompt_tokens": c.usage.prompt_tokens,
            "completion_tokens": c.usage.completion_tokens,
            "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": c.usage.cached_prompt_tokens },
        },
        "system_fingerprint": format!("kiln-{}", env!("CARGO_PKG_VERSION")),
    })
}

/// One line of `<stem>.output.jsonl` (OpenAI `BatchRequestOutput` for a success).
pub fn batch_output_line(task_id: &str, custom_id: Option<&str>, body: Value) -> Value {
    json!({
        "id": task_id,
        "custom_id": custom_id,
        "response": { "status_code": 200, "request_id": task_id, "body": body },
        "error": null,
    })
}

/// One line of `<stem>.errors.jsonl`. A request that can never succeed (`invalid_input`) is an
/// HTTP-style 400 with an `invalid_request_error` body, as OpenAI writes it; every other failure
/// (`oom`, `timeout`, `parse`, `internal`, after its retries) is a line-level `error` with the
/// class as `code`.
pub fn batch_error_line(
    task_id: &str,
    custom_id: Option<&str>,
    class: ErrorClass,
    message: &str,
) -> Value {
    if class == ErrorClass::InvalidInput {
        json!({
            "id": task_id,
            "custom_id": custom_id,
            "response": {
                "status_code": 400,
                "request_id": task_id,
                "body": { "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": null,
                    "code": class.as_str(),
                }},
            },
            "error": null,
        })
    } else {
        json!({
            "id": task_id,
            "custom_id": custom_id,
            "response": null,
            "error": { "code": class.as_str(), "message": message },
        })
    }
}
