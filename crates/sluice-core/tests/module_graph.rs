//! The modules of `sluice-core` form layers: no module uses one that uses
//! it back, directly or through others. A lower layer that calls up into
//! the one that owns it (a queue reaching into its vhost) is what this
//! keeps out; such calls go through an interface the lower layer defines
//! and the upper one implements (`QueueHost`, `PagerWork`, `TimedWork`).
//!
//! A module is a file under `src/` or a directory with its `mod.rs`; the
//! files of a directory module are one node. Edges are `crate::name` paths
//! in code, comments aside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn source_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            source_files(&path, into);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            into.push(path);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("a file under src");
    let first = relative
        .components()
        .next()
        .expect("a non-empty path")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// The modules a file's code names as `crate::name`.
fn used_modules(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(start) = rest.find("crate::") {
            let after = &rest[start + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                used.insert(name);
            }
            rest = after;
        }
        // `use crate::{a, b::c}` names several at once.
        if let Some(start) = code.find("crate::{") {
            let group = &code[start + "crate::{".len()..];
            for part in group.split([',', '}']) {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    used.insert(name);
                }
            }
        }
    }
    used
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|file| module_of(&src, file))
        .filter(|module| module != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let edges = graph.entry(module.clone()).or_default();
        for used in used_modules(&text) {
            if used != module && modules.contains(&used) {
                edges.insert(used);
            }
        }
    }
    graph
}

/// A cycle through `start`, if there is one: the path back to it.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((module, path)) = stack.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start.to_owned());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn module_graph_has_no_cycles() {
    let graph = module_graph();
    assert!(
        graph.contains_key("vhost") && graph["vhost"].contains("queue"),
        "the graph is read from the sources: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|module| cycle_through(&graph, module))
        .map(|cycle| cycle.join(" -> "))
        .collect();
    assert!(
        cycles.is_empty(),
        "modules of sluice-core that use each other:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn module_graph_reader_sees_grouped_and_nested_uses() {
    let used = used_modules(
        "use crate::{queue::Queue, message};\n// crate::vhost in a comment\nlet x = crate::expiry::now_us();",
    );
    let expected: BTreeSet<String> = ["expiry", "message", "queue"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(used, expected);
}
