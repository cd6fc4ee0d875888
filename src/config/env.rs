//! `KILN_<SECTION>_<KEY>` environment overrides, applied to the parsed TOML table before it is
//! deserialized. Values are typed like the same key of the defaults (a string stays a string even
//! when it looks like a number); nested tables are reached by `<key>_<subkey>`.

use super::{ConfigError, ENV_PREFIX};

/// The known section named by `KILN_<SECTION>_…`, if any.
pub(super) fn section_of(var: &str) -> Option<&'static str> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    ["model", "engine", "daemon", "retry", "logging", "metrics"]
        .into_iter()
        .find(|s| {
            rest.len() > s.len() + 1
                && rest.as_bytes()[..s.len()].eq_ignore_ascii_case(s.as_bytes())
                && rest.as_bytes()[s.len()] == b'_'
        })
}

/// Set the key named by `var` in `table`, typed like the same key in `defaults`.
///
/// The key part is matched against the section's keys in lower case; a nested table is reached by
/// its key plus `_` (`KILN_RETRY_MAX_ATTEMPTS_OOM` → `retry.max_attempts.oom`). A whole table can be
/// given as an inline TOML table (`KILN_RETRY_MAX_ATTEMPTS='{ oom = 6 }'`), merged key by key.
pub(super) fn apply_env_override(
    table: &mut toml::Table,
    defaults: &toml::Table,
    var: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let env_err = |message: String| ConfigError::Env {
        var: var.to_owned(),
        message,
    };
    let section = section_of(var).ok_or_else(|| env_err("not a config override".into()))?;
    let mut key = var[ENV_PREFIX.len() + section.len() + 1..].to_ascii_lowercase();
    let mut dst = table
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| env_err(format!("`{section}` in the config file is not a table")))?;
    let mut def = defaults[section]
        .as_table()
        .ok_or_else(|| env_err(format!("`{section}` has no keys")))?;
    let mut path = section.to_owned();
    loop {
        if let Some(default) = def.get(&key) {
            path = format!("{path}.{key}");
            let parsed =
                parse_like(default, value).map_err(|m| env_err(format!("`{path}`: {m}")))?;
            match (parsed, dst.get_mut(&key)) {
                (toml::Value::Table(new), Some(toml::Value::Table(old))) => old.extend(new),
                (parsed, _) => {
                    dst.insert(key, parsed);
                }
            }
            return Ok(());
        }
        // Descend into a nested table whose key is a prefix (`max_attempts` + `_oom`).
        let nested = def.iter().find_map(|(k, v)| {
            let rest = key.strip_prefix(k.as_str())?.strip_prefix('_')?;
            Some((k.clone(), rest.to_owned(), v.as_table()?))
        });
        let Some((k, rest, sub)) = nested else {
            let known: Vec<&str> = def.keys().map(String::as_str).collect();
            return Err(env_err(format!(
                "`{path}` has no key `{key}` (known: {})",
                known.join(", ")
            )));
        };
        dst = dst
            .entry(k.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| env_err(format!("`{path}.{k}` in the config file is not a table")))?;
        def = sub;
        path = format!("{path}.{k}");
        key = rest;
    }
}

/// Parse an environment string as a value of the same TOML type as `like`.
fn parse_like(like: &toml::Value, s: &str) -> Result<toml::Value, String> {
    let s_trim = s.trim();
    match like {
        toml::Value::String(_) => Ok(toml::Value::String(s.to_owned())),
        toml::Value::Integer(_) => s_trim
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| format!("expected an integer, got `{s}`")),
        toml::Value::Float(_) => s_trim
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| format!("expected a number, got `{s}`")),
        toml::Value::Boolean(_) => match s_trim.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(toml::Value::Boolean(false)),
            _ => Err(format!("expected true or false, got `{s}`")),
        },
        toml::Value::Table(_) => {
            let doc: toml::Table = toml::from_str(&format!("v = {s_trim}"))
                .map_err(|e| format!("expected an inline table: {e}"))?;
            match doc.get("v") {
                Some(toml::Value::Table(t)) => Ok(toml::Value::Table(t.clone())),
                _ => Err(format!(
                    "expected an inline table like `{{ key = value }}`, got `{s}`"
                )),
            }
        }
        other => Err(format!(
            "cannot override a {} from the environment",
            other.type_str()
        )),
    }
}
