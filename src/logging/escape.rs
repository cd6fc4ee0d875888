//! Escaping untrusted text (file names, `custom_id`s, model text, error messages) before it reaches
//! a log line or a terminal.
//!
//! Two hazards: a newline inside a value forges a whole log line (`fake\n2026-… ERROR …`), and
//! terminal control sequences (ESC, BEL, CSI, OSC, carriage return, bidi overrides) clear the
//! screen, set the window title or make text read differently from what it is.
//!
//! Every escape is `\uXXXX` (or `\n`, `\r`, `\t`), which is also a valid JSON string escape of the
//! same character, so escaping JSON text keeps it valid JSON meaning the same thing. Backslashes are
//! left as they are: the aim is that no control character reaches the reader, not a reversible
//! encoding (the ledger keeps the exact bytes).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a log line or a terminal raw: C0 controls, DEL, C1 controls, and the
/// invisible formatting characters that reorder text (bidi embeddings, overrides and isolates).
fn is_hazard(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape_with(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let keep = |c: char| keep_newlines && (c == '\n' || c == '\t');
    if !s.chars().any(|c| is_hazard(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_hazard(c) || keep(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// `s` on one line: every control and bidi character escaped, newlines and tabs included. For
/// log lines, table cells and single-line terminal output.
pub fn escape_line(s: &str) -> Cow<'_, str> {
    escape_with(s, false)
}

/// `s` for a terminal: newlines and tabs kept, every other control and bidi character escaped.
/// For multi-line output (`kiln show`, `kiln logs`).
pub fn escape_terminal(s: &str) -> Cow<'_, str> {
    escape_with(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_lines_and_terminal_sequences_are_escaped() {
        let name = "fake\n2026-12-01T00:00:00Z ERROR kiln: FORGED.txt";
        assert_eq!(
            escape_line(name),
            "fake\\n2026-12-01T00:00:00Z ERROR kiln: FORGED.txt"
        );
        let cid = "\x1b[2J\x1b]0;pwned\x07";
        assert_eq!(escape_line(cid), "\\u001b[2J\\u001b]0;pwned\\u0007");
        assert_eq!(escape_terminal(cid), escape_line(cid));
        assert_eq!(escape_line("a\rb\u{9b}c\u{202e}d"), "a\\rb\\u009bc\\u202ed");
        assert_eq!(escape_terminal("line 1\n\tline 2\r"), "line 1\n\tline 2\\r");
        assert!(matches!(escape_line("plain ü 🙂 \\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_json_stays_json_with_the_same_value() {
        let v = serde_json::json!({ "custom_id": "x\u{202e}y" });
        let text = serde_json::to_string(&v).unwrap();
        let escaped = escape_terminal(&text);
        assert_ne!(escaped, text);
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, v);
    }
}
