//! Imports point down: every module of `relay/src` uses only modules of
//! lower layers. The layers are the ones docs/ARCHITECTURE.md lists (its
//! `layers` block, highest first), so the map and this check cannot drift
//! apart; a module missing from the list fails too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The layer of each module, from the block of ARCHITECTURE.md named
/// `name` (0 = the lowest).
fn layers(name: &str) -> HashMap<String, usize> {
    let doc = std::fs::read_to_string(root().join("../docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let block = doc
        .split(&format!("```{name}\n"))
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("a ```{name} block in ARCHITECTURE.md"));
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = HashMap::new();
    for (i, line) in lines.iter().enumerate() {
        for module in line.split_whitespace() {
            let previous = out.insert(module.to_string(), lines.len() - 1 - i);
            assert!(previous.is_none(), "{module} is listed twice");
        }
    }
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `<prefix><name>` names a source file uses (comments left out),
/// `crate::` for the crate's modules, `super::` for a sibling's.
fn uses(path: &Path, prefixes: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("source");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for prefix in prefixes {
            names_after(line, prefix, &mut out);
        }
    }
    out
}

/// Pushes the names that follow `prefix` in `line` (one, or each of a
/// `{…}` group).
fn names_after(line: &str, prefix: &str, out: &mut Vec<String>) {
    {
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for n in names {
                let name: String = n
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
}

/// Every module of `relay/src` (a directory module counts as one) with
/// its files.
fn modules() -> Vec<(String, Vec<PathBuf>)> {
    let src = root().join("src");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if path.is_dir() {
            let files = std::fs::read_dir(&path)
                .expect("dir")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == "rs"))
                .collect();
            out.push((name, files));
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            out.push((name, vec![path]));
        }
    }
    out
}

#[test]
fn imports_point_down() {
    let layers = layers("layers");
    let mut wrong = Vec::new();
    for (module, files) in modules() {
        let Some(&mine) = layers.get(&module) else {
            wrong.push(format!("{module} is not in the layers of ARCHITECTURE.md"));
            continue;
        };
        for file in files {
            for used in uses(&file, &["crate::"]) {
                if used == module {
                    continue;
                }
                match layers.get(&used) {
                    Some(&theirs) if theirs < mine => {}
                    Some(_) => wrong.push(format!(
                        "{} uses crate::{used}, which is not below {module}",
                        file.strip_prefix(root()).unwrap_or(&file).display()
                    )),
                    None => wrong.push(format!("crate::{used} (used by {module}) is not in the layers")),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not point down:\n{}",
        wrong.join("\n")
    );
}

/// The same inside each folder of `relay/src`: each file uses only the
/// folder's files of lower layers, from the folder's own block of
/// ARCHITECTURE.md (`<folder>-layers`; `mod.rs`, the folder's root, is
/// open to all). Every file must be listed, and every name listed must be
/// a file. A name after `super::` that is not a file of the folder is an
/// item of its `mod.rs`.
#[test]
fn folder_imports_point_down() {
    let mut wrong = Vec::new();
    for (folder, files) in modules() {
        if files.len() == 1 {
            continue;
        }
        let layers = layers(&format!("{folder}-layers"));
        let module_of = |p: &Path| p.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        let modules: Vec<String> = files
            .iter()
            .map(|p| module_of(p))
            .filter(|m| m != "mod")
            .collect();
        for listed in layers.keys() {
            if !modules.contains(listed) {
                wrong.push(format!(
                    "{folder}-layers lists {listed}, which is not a file of {folder}/"
                ));
            }
        }
        let inside = format!("crate::{folder}::");
        for file in &files {
            let module = module_of(file);
            if module == "mod" {
                continue;
            }
            let Some(&mine) = layers.get(&module) else {
                wrong.push(format!(
                    "{folder}/{module} is not in the {folder}-layers of ARCHITECTURE.md"
                ));
                continue;
            };
            for used in uses(file, &["super::", &inside]) {
                if used == module || !modules.contains(&used) {
                    continue;
                }
                match layers.get(&used) {
                    Some(&theirs) if theirs < mine => {}
                    _ => wrong.push(format!("{folder}/{module}.rs uses {used}, which is not below it")),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "folder imports that do not point down:\n{}",
        wrong.join("\n")
    );
}
