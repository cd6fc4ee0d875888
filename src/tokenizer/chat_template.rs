//! Chat templates: Jinja source → prompt text, byte-identical to transformers' `apply_chat_template`.
//!
//! transformers compiles a template in `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[loopcontrols])` (default `keep_trailing_newline=False`) and
//! renders it with
//! `messages`, `tools=None`, `documents=None`, `add_generation_prompt`, the tokenizer's special
//! tokens (`bos_token`, `eos_token`, …) and then the caller's `chat_template_kwargs`, which may
//! override the special tokens but not the four named arguments (Python would raise "got multiple
//! values for keyword argument"). We do the same with minijinja 3.1 plus
//! [`jinja_compat`](super::jinja_compat) for the Python-side helpers and value printing.
//!
//! Compiled templates are cached process-wide by source text (a handful of models per process),
//! like transformers' `lru_cache` on `_compile_jinja_template`.
//!
//! Every error here is about the request or the template, never transient: callers should treat
//! it as `invalid_input`.

use std::sync::{Arc, Mutex, OnceLock};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::Environment;
use serde::{Deserialize, Serialize};

use super::jinja_compat;
use crate::error::ModelError;

/// One chat message; `content` is plain text (the daemon flattens OpenAI text-part arrays).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or `tool`).
    pub role: String,
    /// The message text.
    pub content: String,
}

/// Render variables that callers' kwargs may not replace (they are named arguments in transformers).
const RESERVED_VARIABLES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// How many compiled templates the process keeps.
const CACHE_CAPACITY: usize = 8;

/// The name the template is registered under (no extension: autoescape stays off).
const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// The special-token strings a template sees as variables.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokenVars {
    /// `bos_token`, when the tokenizer has one.
    pub bos_token: Option<String>,
    /// `eos_token`, when the tokenizer has one.
    pub eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compile `source` with transformers' environment settings.
    pub fn compile(source: &str) -> Result<ChatTemplate, ModelError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("chat template syntax config: {e}")))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(jinja_compat::unknown_method_callback);
        env.set_formatter(jinja_compat::format_value);
        env.add_filter("tojson", jinja_compat::tojson);
        env.add_function("raise_exception", jinja_compat::raise_exception);
        env.add_function("strftime_now", jinja_compat::strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ModelError::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate { env })
    }

    /// The compiled template for `source`, from the process-wide cache when possible.
    pub fn cached(source: &str) -> Result<Arc<ChatTemplate>, ModelError> {
        type Cache = Mutex<Vec<(String, Arc<ChatTemplate>)>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
        if let Some(hit) = lock(cache)
            .iter()
            .find(|(s, _)| s == source)
            .map(|(_, t)| t.clone())
        {
            return Ok(hit);
        }
        // Compile outside the lock; two racing threads at worst compile twice.
        let compiled = Arc::new(ChatTemplate::compile(source)?);
        let mut entries = lock(cache);
        if entries.len() >= CACHE_CAPACITY {
            entries.remove(0);
        }
        entries.push((source.to_owned(), compiled.clone()));
        Ok(compiled)
    }

    /// Render `messages`. `kwargs` are extra template variables (OpenAI `chat_template_kwargs`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        special: &SpecialTokenVars,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        if let Some(key) = kwargs
            .keys()
            .find(|k| RESERVED_VARIABLES.contains(&k.as_str()))
        {
            return Err(ModelError::Tokenizer(format!(
                "chat_template_kwargs may not set `{key}` (it is a fixed template argument)"
            )));
        }
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(|e| {
                ModelError::Tokenizer(format!("chat messages are not serializable: {e}"))
            })?,
        );
        ctx.insert("tools".into(), serde_json::Value::Null);
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        for (name, token) in [
            ("bos_token", &special.bos_token),
            ("eos_token", &special.eos_token),
        ] {
            if let Some(token) = token {
                ctx.insert(name.into(), token.clone().into());
            }
        }
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ModelError::Tokenizer(format!("chat template: {e}")))?;
        template
            .render(Serde(&ctx))
            .map_err(|e| ModelError::Tokenizer(format!("chat template failed to render: {e}")))
    }
}

/// Lock the cache, recovering from a poisoned lock (the cache holds no invariant a panic can break).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn render(
        source: &str,
        messages: &[ChatMessage],
        gen: bool,
        kwargs: serde_json::Value,
    ) -> Result<String, ModelError> {
        let special = SpecialTokenVars {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
        };
        let kwargs = kwargs.as_object().cloned().unwrap_or_default();
        ChatTemplate::compile(source)?.render(messages, gen, &special, &kwargs)
    }

    #[test]
    fn trim_and_lstrip_blocks_match_jinja2_settings() {
        // Rendered with Jinja2(trim_blocks=True, lstrip_blocks=True): "A\nhi\nB" (the newline after
        // each block tag and the indentation before it are removed; the final newline is dropped).
        let source = "A\n  {% for m in messages %}\n{{ m.content }}\n  {% endfor %}\nB\n";
        assert_eq!(
            render(source, &[msg("user", "hi")], false, serde_json::json!({})).unwrap(),
            "A\nhi\nB"
        );
    }

    #[test]
    fn tojson_is_python_json_dumps_without_html_escaping() {
        let source = "{{ x | tojson }}|{{ x | tojson(indent=2) }}";
        let out = render(
            source,
            &[],
            false,
            serde_json::json!({"x": {"d": "Wx <city> & ü", "n": [1, 2.5]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"d\": \"Wx <city> & ü\", \"n\": [1, 2.5]}|{\n  \"d\": \"Wx <city> & ü\",\n  \"n\": [\n    1,\n    2.5\n  ]\n}"
        );
    }

    #[test]
    fn python_values_and_methods() {
        let source = "{{ flag }} {{ nothing }} {{ 'ab'.upper() }} {{ 'xyz'.removeprefix('x') }} \
                      {{ messages[0].content.split(' ')[-1] }} {{ bos_token }}{{ eos_token }}";
        let out = render(
            source,
            &[msg("user", "hello big world")],
            false,
            serde_json::json!({"flag": true, "nothing": null}),
        )
        .unwrap();
        assert_eq!(out, "True None AB yz world <s></s>");
    }

    #[test]
    fn kwargs_override_special_tokens_but_not_named_arguments() {
        let out = render(
            "{{ bos_token }}",
            &[],
            false,
            serde_json::json!({"bos_token": "B"}),
        )
        .unwrap();
        assert_eq!(out, "B");
        let err = render("x", &[], false, serde_json::json!({"messages": []})).unwrap_err();
        assert!(err.to_string().contains("messages"), "{err}");
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let source = "{% if messages|length == 0 %}{{ raise_exception('No messages provided.') }}{% endif %}";
        let err = render(source, &[], false, serde_json::json!({})).unwrap_err();
        assert!(err.to_string().contains("No messages provided."), "{err}");
    }

    #[test]
    fn tools_and_documents_are_defined_as_none() {
        let source = "{{ tools is none }} {{ documents is defined }} {{ add_generation_prompt }}";
        assert_eq!(
            render(source, &[], true, serde_json::json!({})).unwrap(),
            "True True True"
        );
    }

    #[test]
    fn python_slicing_and_loop_controls_work() {
        let source = "{% for m in messages[::-1] %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }};{% endfor %}";
        let msgs = [msg("system", "s"), msg("user", "u"), msg("assistant", "a")];
        assert_eq!(
            render(source, &msgs, false, serde_json::json!({})).unwrap(),
            "assistant;user;"
        );
    }

    #[test]
    fn syntax_errors_are_reported_at_compile_time() {
        assert!(ChatTemplate::compile("{% for %}").is_err());
    }

    #[test]
    fn cache_returns_the_same_compiled_template() {
        let a = ChatTemplate::cached("cache-test {{ 1 }}").unwrap();
        let b = ChatTemplate::cached("cache-test {{ 1 }}").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
