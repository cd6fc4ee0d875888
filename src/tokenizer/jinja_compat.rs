//! The Python-side behaviour of transformers' chat-template environment, rebuilt for minijinja.
//!
//! transformers renders templates with Jinja2 and registers a few helpers of its own
//! (`transformers/utils/chat_template_utils.py`, `_compile_jinja_template`). Matching its output
//! byte for byte needs the same helpers and Python's way of printing values:
//!
//! - [`py_str`]: what `{{ value }}` prints in Jinja2, i.e. Python's `str()`: `True`, `None`,
//!   `1e+20`, `['a', 1]`, `{'k': 'v'}` (minijinja would print `true`, `none`, `["a", 1]`);
//! - [`tojson`]: transformers' override, `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)`: `", "` / `": "` separators, raw Unicode and no HTML
//!   escaping (minijinja's built-in escapes `<`, `>`, `&`, `'`);
//! - [`raise_exception`] and [`strftime_now`] globals;
//! - [`unknown_method_callback`]: minijinja-contrib's `pycompat` string/dict/list methods, plus
//!   `str.removeprefix` / `str.removesuffix`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// Python's `repr()` of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16).
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // `{:e}` gives the shortest round-trip digits, e.g. `-1.5e-5`, `1e20`, `0e0`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let split = exp as usize + 1;
            let int_part = if digits.len() >= split {
                digits[..split].to_owned()
            } else {
                format!("{digits}{}", "0".repeat(split - digits.len()))
            };
            let frac = if digits.len() > split {
                &digits[split..]
            } else {
                "0"
            };
            format!("{int_part}.{frac}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let mantissa = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// Python's `repr()` of a string: single quotes unless the text holds `'` and no `"`.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let code = c as u32;
                if code <= 0xFF {
                    let _ = write!(out, "\\x{code:02x}");
                } else {
                    let _ = write!(out, "\\u{code:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `repr()` of a template value, appended to `out`.
fn py_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => py_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let (open, close) = if value.is_tuple() {
                ('(', ')')
            } else {
                ('[', ']')
            };
            out.push(open);
            let mut n = 0;
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out);
                    n += 1;
                }
            }
            if value.is_tuple() && n == 1 {
                out.push(',');
            }
            out.push(close);
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out);
                    out.push_str(": ");
                    py_repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&py_str(value)),
    }
}

/// What Jinja2 prints for `{{ value }}`: Python's `str()`; undefined prints nothing.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => py_float_repr(f),
            Err(_) => value.to_string(),
        },
        ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            py_repr(value, &mut out);
            out
        }
        _ => value.to_string(),
    }
}

/// The formatter for `{{ … }}` output (autoescape is off for chat templates).
pub fn format_value(
    out: &mut minijinja::Output,
    _state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    out.write_str(&py_str(value))
        .map_err(|_| Error::new(ErrorKind::WriteFailure, "could not write template output"))
}

/// Options of `json.dumps` that transformers' `tojson` filter exposes.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// Append a JSON string literal as Python's `json.dumps` writes it.
fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Serialize `value` like `json.dumps`, at nesting `depth`.
fn json_value(
    value: &Value,
    style: &JsonStyle,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(value.clone())?;
            if f.is_nan() {
                out.push_str("NaN");
            } else if f.is_infinite() {
                out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
            } else {
                out.push_str(&py_float_repr(f));
            }
        }
        ValueKind::String => {
            json_string(value.as_str().unwrap_or_default(), style.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                json_value(item, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
                    // json.dumps turns int / float / bool / None keys into strings.
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
                    ValueKind::Number => py_str(&key),
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!(
                                "tojson: keys must be str, int, float, bool or None, not {other}"
                            ),
                        ))
                    }
                };
                entries.push((key, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                json_string(key, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                json_value(item, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, keyword arguments only.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => Some(" ".repeat(v.as_usize().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be a non-negative int or a string",
            )
        })?)),
    };
    // Python's defaults: (", ", ": ") without indent, (",", ": ") with it.
    let (mut item_sep, mut key_sep) = if indent.is_some() {
        (",".to_owned(), ": ".to_owned())
    } else {
        (", ".to_owned(), ": ".to_owned())
    };
    if let Some(seps) = kwargs
        .get::<Option<Value>>("separators")?
        .filter(|v| !v.is_none())
    {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                item_sep = a.as_str().unwrap_or_default().to_owned();
                key_sep = b.as_str().unwrap_or_default().to_owned();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        }
    }
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    json_value(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// The `raise_exception(message)` global: fails the render with the template's message.
pub fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The `strftime_now(format)` global: local time now, formatted like Python's `strftime`.
pub fn strftime_now(format: String) -> Result<Value, Error> {
    let now = time::OffsetDateTime::now_local().unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    Ok(Value::from(strftime(now, &format)))
}

/// Python / glibc `strftime` for the directives chat templates use (`%d %b %Y`, `%-d`, …).
/// Unknown directives are copied through, as glibc does. Naive times: `%Z` and `%z` are empty.
pub fn strftime(t: time::OffsetDateTime, format: &str) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let weekday = DAYS[t.weekday().number_days_from_monday() as usize];
    let month = MONTHS[u8::from(t.month()) as usize - 1];
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `-` flag drops the zero padding.
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |n: u32, width: usize| {
            if no_pad {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('d') => out.push_str(&num(t.day().into(), 2)),
            Some('e') => out.push_str(&if no_pad {
                t.day().to_string()
            } else {
                format!("{:2}", t.day())
            }),
            Some('m') => out.push_str(&num(u8::from(t.month()).into(), 2)),
            Some('y') => out.push_str(&num((t.year().rem_euclid(100)) as u32, 2)),
            Some('Y') => out.push_str(&t.year().to_string()),
            Some('H') => out.push_str(&num(t.hour().into(), 2)),
            Some('I') => out.push_str(&num(hour12.into(), 2)),
            Some('M') => out.push_str(&num(t.minute().into(), 2)),
            Some('S') => out.push_str(&num(t.second().into(), 2)),
            Some('p') => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&num(t.ordinal().into(), 3)),
            Some('w') => out.push_str(&t.weekday().number_days_from_sunday().to_string()),
            Some('u') => out.push_str(&t.weekday().number_from_monday().to_string()),
            Some('F') => out.push_str(&format!(
                "{}-{:02}-{:02}",
                t.year(),
                u8::from(t.month()),
                t.day()
            )),
            Some('T') => out.push_str(&format!(
                "{:02}:{:02}:{:02}",
                t.hour(),
                t.minute(),
                t.second()
            )),
            Some('Z') | Some('z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python methods on values: minijinja-contrib's `pycompat`, then `str.removeprefix/removesuffix`.
pub fn unknown_method_callback(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    match minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args) {
        Err(e) if e.kind() == ErrorKind::UnknownMethod => {}
        other => return other,
    }
    if let (Some(s), [arg]) = (value.as_str(), args) {
        let affix = arg.as_str().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("str.{method}() argument must be a string"),
            )
        })?;
        match method {
            "removeprefix" => return Ok(Value::from(s.strip_prefix(affix).unwrap_or(s))),
            "removesuffix" => return Ok(Value::from(s.strip_suffix(affix).unwrap_or(s))),
            _ => {}
        }
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        // Expected strings are what CPython 3.11 prints for repr(x).
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn values_print_like_python_str() {
        let v = Value::from(minijinja::value::Serde(
            serde_json::json!({"a": [1, "it's", true, null], "b": 2.0}),
        ));
        assert_eq!(py_str(&v), r#"{'a': [1, "it's", True, None], 'b': 2.0}"#);
        assert_eq!(py_str(&Value::from(false)), "False");
        assert_eq!(py_str(&Value::UNDEFINED), "");
    }

    #[test]
    fn strftime_matches_glibc_for_common_directives() {
        let t = time::macros::datetime!(2026-03-05 14:07:09 UTC);
        assert_eq!(strftime(t, "%d %b %Y"), "05 Mar 2026");
        assert_eq!(
            strftime(t, "%-d %B %Y, %A %I:%M %p"),
            "5 March 2026, Thursday 02:07 PM"
        );
        assert_eq!(
            strftime(t, "%Y-%m-%d %H:%M:%S %j 100%% %Q"),
            "2026-03-05 14:07:09 064 100% %Q"
        );
    }
}
