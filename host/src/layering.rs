//! The rooms of the host import each other in one direction only. Read from the sources: every
//! `crate::` and `super::` path (`use` trees included; comments and the test module that
//! closes a file left out) is resolved to the file that defines it, and
//! - no top-level module reaches, through any chain of imports, back to itself;
//! - no file does either, a file's use of the folder it sits in (`mod.rs`) and a folder's use of
//!   its own files aside.
//!
//! A new import that closes a loop fails here with the files that tie it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// One source file: its path under `src/`, its module path and its code.
struct Source {
    file: String,
    module: Vec<String>,
    code: String,
}

/// `from -> to -> files that tie them`.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The module path of a file under `src/` (`["auth", "jwt"]` for `auth/jwt.rs`, `["auth"]` for
/// `auth/mod.rs`).
fn module_of(relative: &Path) -> Vec<String> {
    let mut module: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if module.last().is_some_and(|last| last == "mod") {
        module.pop();
    }
    module
}

/// The code of a file: comments and the `#[cfg(test)] mod tests` that closes it left out. The
/// number says how many inline modules deep the part is (a `mod native { … }` inside a file):
/// its `super::` starts one level lower.
fn code_of(source: &str) -> Vec<(String, usize)> {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => &source[..at],
        None => source,
    };
    let mut parts = vec![(String::new(), 0)];
    for line in source.lines() {
        // A `//` inside a string (a URL) cuts a line short; no path of the crate hides there.
        let line = line.find("//").map_or(line, |at| &line[..at]);
        let trimmed = line.trim_start();
        let inline_module = ["mod ", "pub mod ", "pub(crate) mod "]
            .iter()
            .any(|p| trimmed.starts_with(p))
            && trimmed.trim_end().ends_with('{');
        if inline_module && parts.len() == 1 {
            parts.push((String::new(), 1));
        }
        let part = parts.last_mut().expect("a part");
        part.0.push_str(line);
        part.0.push('\n');
    }
    parts
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths of a `use` tree or path starting at `s` (after `crate::` or `super::`), each as
/// its segments; `{a, b::{c, d}}` gives `a`, `b::c` and `b::d`.
fn tree(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(inner) = s.strip_prefix('{') {
        let mut paths = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.extend(tree(&inner[start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(tree(&inner[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    let head = ident(s);
    if head.is_empty() {
        return Vec::new();
    }
    let rest = &s[head.len()..];
    match rest.strip_prefix("::") {
        Some(rest) => tree(rest)
            .into_iter()
            .map(|mut path| {
                path.insert(0, head.to_owned());
                path
            })
            .chain(std::iter::once(vec![head.to_owned()]))
            .collect(),
        None => vec![vec![head.to_owned()]],
    }
}

/// Every path of the crate that `code` (a part of the file of `module`, `depth` inline modules
/// deep) names, made absolute.
fn paths_in(code: &str, module: &[String], depth: usize) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let starts = before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b"_$:".contains(&b)));
        if starts && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let (base, tail) = if let Some(tail) = rest.strip_prefix("crate::") {
                (Vec::new(), tail)
            } else {
                let mut tail = rest;
                let mut up = 0usize;
                while let Some(t) = tail.strip_prefix("super::") {
                    tail = t;
                    up += 1;
                }
                let up = up.saturating_sub(depth);
                (module[..module.len().saturating_sub(up)].to_vec(), tail)
            };
            for path in tree(tail) {
                let mut absolute = base.clone();
                absolute.extend(path);
                paths.push(absolute);
            }
            at += rest.len() - tail.len();
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    paths
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(src).expect("under src").to_path_buf();
            Source {
                file: relative.display().to_string(),
                module: module_of(&relative),
                code: std::fs::read_to_string(&file).expect("read a source file"),
            }
        })
        .collect()
}

/// The file graph: an edge from each file to each file whose module its paths name (the
/// longest module prefix of the path), a file's edges to its own folders' `mod.rs` and a
/// folder's to its own files left out. The crate root and the binary only name the rooms.
fn file_graph(sources: &[Source]) -> Graph {
    let files: BTreeMap<&[String], &str> = sources
        .iter()
        .map(|s| (s.module.as_slice(), s.file.as_str()))
        .collect();
    let mut graph = Graph::new();
    for source in sources {
        if source.module.is_empty() || source.module == ["main"] || source.module == ["layering"] {
            continue;
        }
        for (code, depth) in code_of(&source.code) {
            for path in paths_in(&code, &source.module, depth) {
                let Some(target) = (1..=path.len())
                    .rev()
                    .find_map(|n| files.get(&path[..n]).map(|file| (&path[..n], *file)))
                else {
                    continue;
                };
                let (module, file) = target;
                let nested = |outer: &[String], inner: &[String]| inner.starts_with(outer);
                if file == source.file
                    || nested(module, &source.module)
                    || nested(&source.module, module)
                {
                    continue;
                }
                graph
                    .entry(source.file.clone())
                    .or_default()
                    .entry(file.to_owned())
                    .or_default()
                    .insert(source.file.clone());
            }
        }
    }
    graph
}

/// The graph between the rooms of `folder` (`""`: `src/` itself): each file under it stands for
/// the file or sub-folder of `folder` it is in (`auth/jwt.rs -> dns.rs` is `auth -> dns` in
/// `src/`); the folder's own `mod.rs`, its face, is left out.
fn folder_graph(files: &Graph, folder: &str) -> Graph {
    let room = |file: &str| -> Option<String> {
        let inside = if folder.is_empty() {
            file
        } else {
            file.strip_prefix(folder)?.strip_prefix('/')?
        };
        let first = inside.split('/').next()?;
        let first = first.strip_suffix(".rs").unwrap_or(first);
        (first != "mod").then(|| first.to_owned())
    };
    let mut graph = Graph::new();
    for (from, targets) in files {
        for to in targets.keys() {
            if let (Some(a), Some(b)) = (room(from), room(to))
                && a != b
            {
                graph
                    .entry(a)
                    .or_default()
                    .entry(b)
                    .or_default()
                    .insert(from.clone());
            }
        }
    }
    graph
}

/// Every loop of `graph` (one per set of nodes), each as its nodes along the shortest way
/// round, its first node repeated at the end.
fn loops(graph: &Graph) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        let mut closed_by = None;
        'search: while let Some(at) = queue.pop_front() {
            for next in graph.get(at).into_iter().flat_map(BTreeMap::keys) {
                if next == start {
                    closed_by = Some(at);
                    break 'search;
                }
                if !previous.contains_key(next.as_str()) {
                    previous.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        let Some(mut at) = closed_by else { continue };
        let mut path = vec![start.clone()];
        while at != start {
            path.push(at.to_owned());
            at = previous[at];
        }
        path.push(start.clone());
        path.reverse();
        if seen.insert(path.iter().cloned().collect::<BTreeSet<_>>()) {
            found.push(path);
        }
    }
    found
}

fn described(graph: &Graph, loops: &[Vec<String>]) -> String {
    loops
        .iter()
        .map(|path| {
            path.windows(2)
                .map(|pair| {
                    let by: Vec<&str> = graph[&pair[0]][&pair[1]]
                        .iter()
                        .map(String::as_str)
                        .collect();
                    format!("{} -> {} ({})", pair[0], pair[1], by.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn host_sources() -> Vec<Source> {
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_top_level_module_imports_its_way_back_to_itself() {
    let graph = folder_graph(&file_graph(&host_sources()), "");
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    assert!(
        graph.len() > 20 && edges > 100,
        "the sources were read: {} modules, {edges} imports",
        graph.len()
    );
    let loops = loops(&graph);
    assert!(
        loops.is_empty(),
        "import loops between top-level modules:\n{}",
        described(&graph, &loops)
    );
}

#[test]
fn no_file_or_folder_inside_a_folder_imports_its_way_back_to_itself() {
    let sources = host_sources();
    let files = file_graph(&sources);
    let folders: BTreeSet<String> = sources
        .iter()
        .filter_map(|s| Some(s.file.rsplit_once('/')?.0.to_owned()))
        .collect();
    assert!(folders.contains("policy/runtime"), "{folders:?}");
    let mut found = Vec::new();
    for folder in &folders {
        let graph = folder_graph(&files, folder);
        let loops = loops(&graph);
        if !loops.is_empty() {
            found.push(format!("in {folder}/:\n{}", described(&graph, &loops)));
        }
    }
    assert!(found.is_empty(), "import loops:\n{}", found.join("\n"));
}

#[test]
fn the_reader_resolves_paths_trees_and_finds_loops() {
    let module = ["policy".to_owned(), "tenants".to_owned()];
    let parts = code_of(
        "use crate::a::B;\nuse super::{c, d::{e, f}};\nlet x = crate::g::h();\n\
         // crate::comment\nfn m() { $crate::macro_path }\npub mod native {\n    use super::super::i;\n}\n\
         #[cfg(test)]\nmod tests { use crate::t; }",
    );
    let mut paths: Vec<String> = parts
        .iter()
        .flat_map(|(code, depth)| paths_in(code, &module, *depth))
        .map(|path| path.join("::"))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "a",
            "a::B",
            "g",
            "g::h",
            "policy::c",
            "policy::d",
            "policy::d::e",
            "policy::d::f",
            "policy::i"
        ]
    );

    let sources: Vec<Source> = [
        ("x.rs", "use crate::y::Y;"),
        ("y/mod.rs", "mod z; use z::Z; use crate::w;"),
        ("y/z.rs", "use super::Y; use crate::x::X;"),
        ("w.rs", ""),
    ]
    .into_iter()
    .map(|(file, code)| Source {
        file: file.to_owned(),
        module: module_of(Path::new(file)),
        code: code.to_owned(),
    })
    .collect();
    let files = file_graph(&sources);
    // `y/z.rs -> y/mod.rs` is a file's use of its folder: no edge, so no loop between files…
    assert!(loops(&files).is_empty(), "{:?}", loops(&files));
    // …but `y`, a room of `src/`, and `x` import each other.
    assert_eq!(
        loops(&folder_graph(&files, "")),
        [["x", "y", "x"]].map(|l| l.map(str::to_owned).to_vec())
    );
    assert!(loops(&folder_graph(&files, "y")).is_empty());
}

/// The match arms on a backend service in `code`: each `Service::<name>` followed by `=>` or
/// `|`, as (line, name).
fn service_arms(code: &str) -> Vec<(usize, String)> {
    let names: Vec<String> = crate::routes::SERVICES
        .iter()
        .map(|row| format!("{:?}", row.service))
        .collect();
    let mut arms = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for name in &names {
            let path = format!("Service::{name}");
            let mut rest = line;
            while let Some(at) = rest.find(&path) {
                let after = rest[at + path.len()..].trim_start();
                let whole = !after.starts_with(|c: char| c.is_alphanumeric() || c == '_');
                if whole && (after.starts_with("=>") || after.starts_with('|')) {
                    arms.push((n + 1, name.clone()));
                }
                rest = &rest[at + path.len()..];
            }
        }
    }
    arms
}

/// Adding a backend service is a row of `routes::SERVICES` (docs/architecture.md): no file
/// but `routes.rs` matches on a service, so no other place waits for an arm of a new one.
#[test]
fn only_the_route_table_matches_on_a_backend_service() {
    let found: Vec<String> = host_sources()
        .iter()
        .filter(|s| s.file != "routes.rs" && s.file != "layering.rs")
        .flat_map(|s| {
            service_arms(&s.code)
                .into_iter()
                .map(move |(line, name)| format!("{}:{line} ({name})", s.file))
        })
        .collect();
    assert!(
        found.is_empty(),
        "a match on a backend service outside routes.rs: {}",
        found.join(", ")
    );
    // What the check reads as an arm, and what it does not.
    let arms = service_arms(
        "match s {\n    Service::Db | Service::Auth => 1,\n    Service::Storage => 2,\n}\n\
         forward(Service::Db, x); Service::Dbx => 3",
    );
    assert_eq!(
        arms,
        [(2, "Auth"), (2, "Db"), (3, "Storage")].map(|(l, n)| (l, n.to_owned()))
    );
}
