//! The agent's modules, and the service shell's (`gateway/src`, checked
//! here too so that one reader serves both), use each other without a
//! circle: module A uses B
//! when A's code (its tests excluded) names B through `crate::B`,
//! `super::B`, `self::B`, or a child module `B::` it declares. A circle
//! would mean two modules that can only be understood, and changed,
//! together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of `src` (`a::b` for `src/a/b.rs`) and its code, without
/// its `#[cfg(test)] mod tests` and without comment lines.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(rel) = path
                .strip_prefix(src)
                .ok()
                .and_then(|r| r.to_str())
                .and_then(|r| r.strip_suffix(".rs"))
            else {
                continue;
            };
            if rel == "lib" || rel == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read module");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let code: Vec<&str> = code
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect();
            found.insert(rel.replace('/', "::"), code.join("\n"));
        }
    }
    found
}

/// The paths (`a::b::c`, lower-case segments) that follow `prefix` in
/// `code`, each of a group too (`prefix{a, b::c}`).
fn paths_after<'c>(code: &'c str, prefix: &str) -> Vec<&'c str> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + prefix.len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            match after.strip_prefix('{') {
                Some(group) => found.extend(group_items(group).map(leading_path)),
                None => found.push(leading_path(after)),
            }
        }
        rest = after;
    }
    found
}

/// The path a text starts with.
fn leading_path(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    text[..end].trim_end_matches(':')
}

/// The items of a `{...}` group whose opening brace is just before
/// `group`, split at its own commas.
fn group_items(group: &str) -> impl Iterator<Item = &str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.into_iter().map(str::trim_start)
}

/// Whether `code` names its child module `child` by a path of its own
/// (`child::x`, not `crate::child::x` or `other::child::x`).
fn names_child(code: &str, child: &str) -> bool {
    let prefix = format!("{child}::");
    code.match_indices(&prefix).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

/// The deepest module among `known` that `path` names.
fn resolve(path: &str, known: &BTreeMap<String, String>) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| known.contains_key(m))
}

fn uses(known: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (module, code) in known {
        let parent = module.rsplit_once("::").map(|(p, _)| p.to_owned());
        let mut deps = BTreeSet::new();
        for path in paths_after(code, "crate::") {
            deps.extend(resolve(path, known));
        }
        for path in paths_after(code, "super::") {
            let dep = match &parent {
                Some(parent) => {
                    resolve(&format!("{parent}::{path}"), known).or(Some(parent.clone()))
                }
                None => resolve(path, known),
            };
            deps.extend(dep);
        }
        for line in code.lines() {
            let line = line.trim_start();
            let line = line.strip_prefix("pub ").unwrap_or(line);
            if let Some(child) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';'))
                && names_child(code, child)
            {
                deps.insert(format!("{module}::{child}"));
            }
        }
        deps.remove(module);
        graph.insert(module.clone(), deps);
    }
    graph
}

/// A circle of `graph`, if it has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_agent_s_modules_use_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let graph = uses(&known);
    // The reader finds the uses it must (so that an empty graph cannot
    // pass for an acyclic one).
    assert!(graph["supervisor"].contains("launcher"), "{graph:?}");
    assert!(
        graph["launcher::process"].contains("launcher::child"),
        "{graph:?}"
    );
    assert!(graph["session"].contains("session::codec"), "{graph:?}");
    if let Some(found) = circle(&graph) {
        panic!("an import circle: {}", found.join(" -> "));
    }
}

#[test]
fn the_shell_s_modules_use_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../gateway/src");
    let known = modules(&src);
    let graph = uses(&known);
    assert!(graph["scheduler"].contains("command"), "{graph:?}");
    assert!(
        graph["scheduler::handlers"].contains("scheduler"),
        "{graph:?}"
    );
    assert!(graph["agents"].contains("agent_hub"), "{graph:?}");
    if let Some(found) = circle(&graph) {
        panic!("an import circle: {}", found.join(" -> "));
    }
}

#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(n, deps)| (n.to_owned(), deps.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&graph).map(|c| c.join(" -> ")).as_deref(),
        Some("a -> b -> c -> a")
    );
    let known: BTreeMap<String, String> = [
        ("health", "use crate::record::{self, X};"),
        ("record", "use crate::health::Plan;"),
    ]
    .into_iter()
    .map(|(m, code)| (m.to_owned(), code.to_owned()))
    .collect();
    assert!(
        circle(&uses(&known)).is_some(),
        "the circle this issue removed"
    );
    // Grouped imports are uses too.
    let known: BTreeMap<String, String> = [
        ("a", "use crate::{b, c::{X, Y}};"),
        ("b", ""),
        ("c", "use crate::{b::Z, a};"),
    ]
    .into_iter()
    .map(|(m, code)| (m.to_owned(), code.to_owned()))
    .collect();
    let graph = uses(&known);
    assert_eq!(graph["a"].iter().collect::<Vec<_>>(), ["b", "c"]);
    assert!(circle(&graph).is_some(), "a -> c -> a through groups");
    // A parent that names a crate module of the same name as its child
    // does not use the child; one that names the child does.
    let known: BTreeMap<String, String> = [
        ("loop", "mod access;\nuse crate::access::Table;"),
        ("loop::access", "use super::Loop;"),
        ("access", ""),
    ]
    .into_iter()
    .map(|(m, code)| (m.to_owned(), code.to_owned()))
    .collect();
    assert!(circle(&uses(&known)).is_none());
    let mut known = known;
    known.insert("loop".into(), "mod access;\nuse access::Grant;".into());
    assert!(circle(&uses(&known)).is_some());
}
