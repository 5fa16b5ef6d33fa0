//! No import circle between files of different rooms. A room is a top-level
//! folder of a crate's `src/` (`serve/`, `cli/`, `host/`, …) or a top-level
//! file (`config.rs`); a circle of `crate::` imports that crosses rooms means
//! neither can be read, tested or moved without the other, and it grows
//! quietly (issue 60 found fourteen `serve` modules in one). This reads every
//! source file's `crate::` paths (doc comments and unit tests aside), resolves
//! each to the file that defines it (the longest path that is a file), and
//! fails on any strongly connected set of files in more than one room, naming
//! the imports that close it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// The crates whose rooms are checked.
const CRATES: &[&str] = &["bridge/src", "shared/src", "client-wasm/src", "relay-selfhost/src"];

#[test]
fn no_import_circle_crosses_rooms() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root.join(krate);
        let files = rust_files(&src);
        assert!(files.len() > 3, "{krate}: no sources found");
        let graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> =
            files.iter().map(|f| (f.clone(), imports(&src, f))).collect();
        for set in strongly_connected(&graph) {
            let rooms: BTreeSet<String> = set.iter().map(|f| room(&src, f)).collect();
            if rooms.len() < 2 {
                continue;
            }
            let mut edges = Vec::new();
            for a in &set {
                for b in &graph[a] {
                    if set.contains(b) && room(&src, a) != room(&src, b) {
                        edges.push(format!("  {} -> {}", rel(&src, a), rel(&src, b)));
                    }
                }
            }
            found.push(format!("{krate}: rooms {rooms:?} import each other:\n{}", edges.join("\n")));
        }
    }
    assert!(found.is_empty(), "import circles between rooms:\n{}", found.join("\n"));
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn rel(src: &Path, f: &Path) -> String {
    f.strip_prefix(src).unwrap().display().to_string()
}

/// A file's room: its first folder under `src/`, or its own name.
fn room(src: &Path, f: &Path) -> String {
    let r = rel(src, f);
    match r.split_once('/') {
        Some((dir, _)) => dir.to_string(),
        None => r.trim_end_matches(".rs").to_string(),
    }
}

/// The files `f` imports from (by `crate::` paths outside comments and tests).
fn imports(src: &Path, f: &Path) -> BTreeSet<PathBuf> {
    let text = fs::read_to_string(f).unwrap();
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    let code: String =
        code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut paths = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if rest.starts_with('{') {
            let end = matching_brace(rest);
            expand(&[], &rest[1..end], &mut paths);
            rest = &rest[end..];
        } else {
            let end =
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let p: Vec<String> =
                rest[..end].split("::").filter(|s| !s.is_empty()).map(String::from).collect();
            // `crate::a::{b, c}`: the braces continue the path.
            if rest[end..].starts_with('{') {
                let close = end + matching_brace(&rest[end..]);
                expand(&p, &rest[end + 1..close], &mut paths);
            } else {
                paths.push(p);
            }
            rest = &rest[end..];
        }
    }
    paths.iter().filter_map(|p| resolve(src, p)).filter(|t| t != f).collect()
}

/// The index of the `}` that closes the `{` that `s` starts with.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// `a::{b, c::{d}}` under `prefix`, as whole paths.
fn expand(prefix: &[String], list: &str, out: &mut Vec<Vec<String>>) {
    let (mut depth, mut start) = (0, 0);
    let mut items = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
        let item = item.split(" as ").next().unwrap();
        match item.find('{') {
            Some(b) => {
                let mut p = prefix.to_vec();
                p.extend(item[..b].split("::").filter(|s| !s.is_empty()).map(String::from));
                let close = b + matching_brace(&item[b..]);
                expand(&p, &item[b + 1..close], out);
            }
            None => {
                let mut p = prefix.to_vec();
                p.extend(item.split("::").filter(|s| !s.is_empty() && *s != "self").map(String::from));
                out.push(p);
            }
        }
    }
}

/// The file that defines the longest prefix of `path` that is a module.
fn resolve(src: &Path, path: &[String]) -> Option<PathBuf> {
    let mut best = None;
    for k in 1..=path.len() {
        let base = src.join(path[..k].join("/"));
        for c in [base.with_extension("rs"), base.join("mod.rs")] {
            if c.is_file() {
                best = Some(c);
            }
        }
    }
    best
}

/// Tarjan's strongly connected components (sets of more than one file).
fn strongly_connected(g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<BTreeSet<PathBuf>> {
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<BTreeSet<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let Some((w, _)) = t.g.get_key_value(w) else { continue };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut set = BTreeSet::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                set.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                t.out.push(set);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}
