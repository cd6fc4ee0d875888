//! The crate's modules form one-way layers: a module may name (`crate::x`, `kiln::x`, or
//! `super::` chains reaching the crate root) only modules of a lower layer. This test reads
//! every `.rs` file under `src/` and fails, naming the file, the line and both modules, when a
//! module reaches up or sideways. Comments that are not doc comments are ignored; doc links
//! count (a doc link upward is a dependency upward).
//!
//! The layers, lowest first (see `src/lib.rs`):
//! 0 `error`; 1 `tensor`, `sampling`; 2 `quant`; 3 `backend`; 4 `model` (owns the step
//! contract); 5 `tokenizer`; 6 `engine`; 7 `config`, `ledger`; 8 `logging`; 9 `daemon`,
//! `tools`; 10 `cli` (in the binary).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of each top-level module; a module may only name modules of a strictly lower layer.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("tensor", 1),
    ("sampling", 1),
    ("quant", 2),
    ("backend", 3),
    ("model", 4),
    ("tokenizer", 5),
    ("engine", 6),
    ("config", 7),
    ("ledger", 7),
    ("logging", 8),
    ("daemon", 9),
    ("tools", 9),
    ("cli", 10),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b/c.rs` → (`a`, module depth 3); `src/a/mod.rs` → (`a`, 1); `src/a.rs` → (`a`, 1).
fn module_of(src: &Path, file: &Path) -> Option<(String, usize)> {
    let rel = file.strip_prefix(src).ok()?;
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 {
        let stem = parts[0].strip_suffix(".rs")?;
        return (!matches!(stem, "lib" | "main")).then(|| (stem.to_string(), 1));
    }
    let last = parts.last()?;
    let depth = if last == "mod.rs" {
        parts.len() - 1
    } else {
        parts.len()
    };
    Some((parts[0].clone(), depth))
}

/// Top-level modules a line names: `crate::x`, `kiln::x`, `crate::{x::.., y}`, and `super::`
/// chains of at least `depth` steps (they reach the crate root).
fn named_modules(line: &str, depth: usize) -> Vec<String> {
    let mut found = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for prefix in ["crate::", "kiln::"] {
        let mut rest = line;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                found.extend(inner.split(',').map(|p| ident(p.trim())));
            } else {
                found.push(ident(rest));
            }
        }
    }
    let supers = "super::".repeat(depth);
    let mut rest = line;
    while let Some(i) = rest.find(&supers) {
        rest = &rest[i + supers.len()..];
        let tail = rest.trim_start_matches("super::");
        found.push(ident(tail));
    }
    found.retain(|m| !m.is_empty());
    found
}

#[test]
fn modules_only_name_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for file in &files {
        let Some((module, depth)) = module_of(&src, file) else {
            continue;
        };
        let Some(own) = layer(&module) else {
            violations.push(format!(
                "{}: module `{module}` has no layer in tests/layering.rs",
                file.display()
            ));
            continue;
        };
        *seen.entry(module.clone()).or_default() += 1;
        let text = std::fs::read_to_string(file).unwrap();
        for (n, raw) in text.lines().enumerate() {
            let trimmed = raw.trim_start();
            let code = if trimmed.starts_with("///") || trimmed.starts_with("//!") {
                raw
            } else {
                raw.split("//").next().unwrap_or("")
            };
            for named in named_modules(code, depth) {
                if named == module {
                    continue;
                }
                match layer(&named) {
                    Some(l) if l < own => {}
                    Some(l) => violations.push(format!(
                        "{}:{}: `{module}` (layer {own}) names `{named}` (layer {l}): {}",
                        file.display(),
                        n + 1,
                        raw.trim()
                    )),
                    // `crate::foo` where foo is an item of lib.rs/main.rs, not a module.
                    None => {}
                }
            }
        }
    }
    // The scan must have seen the layers it guards (a moved `src/` would pass vacuously).
    for (m, _) in LAYERS {
        assert!(seen.contains_key(*m), "no file of module `{m}` was read");
    }
    assert!(
        violations.is_empty(),
        "{} upward or sideways references:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn the_scanner_finds_every_form_of_reference() {
    assert_eq!(named_modules("use crate::engine::X;", 1), vec!["engine"]);
    assert_eq!(
        named_modules("use crate::{model::step::A, engine};", 2),
        vec!["model", "engine"]
    );
    assert_eq!(named_modules("x: kiln::daemon::Y", 1), vec!["daemon"]);
    assert_eq!(
        named_modules("use super::super::engine::Z;", 2),
        vec!["engine"]
    );
    // One `super::` from a depth-2 file stays inside its own top module.
    assert!(named_modules("use super::thing;", 2).is_empty());
    assert!(named_modules("use mycrate::engine;", 1).is_empty());
}
