//! `docs/code-layout.md` names every source file of the project, each with its
//! one job, so that a newcomer can find where a thing lives. A list like that
//! goes stale quietly: a file is added and never described, or renamed and
//! the old line stays. This test keeps it true both ways: every source file
//! must appear (its path in backticks) under its crate's heading, and every
//! file path written under a crate's heading must exist.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// A folder whose files a crate's section must name.
struct Folder {
    /// The folder, from the repository root.
    path: &'static str,
    /// What a file's path in the document starts with (its path from `path` follows).
    prefix: &'static str,
    /// The extension of the files that count.
    ext: &'static str,
}

const fn rust(path: &'static str) -> Folder {
    Folder { path, prefix: "", ext: "rs" }
}

/// Each crate's heading in the document (`## <heading>`) and the folders its section lists.
const CRATES: &[(&str, &[Folder])] = &[
    ("bridge/src", &[rust("bridge/src")]),
    ("shared/src", &[rust("shared/src")]),
    (
        "client-wasm",
        &[rust("client-wasm/src"), Folder { path: "client-wasm/www", prefix: "www/", ext: "js" }],
    ),
    ("relay-selfhost/src", &[rust("relay-selfhost/src")]),
    ("tests/src", &[rust("tests/src")]),
];

#[test]
fn code_layout_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let doc = fs::read_to_string(root.join("docs/code-layout.md")).unwrap();

    let mut missing = Vec::new();
    let mut stale = Vec::new();
    for &(heading, folders) in CRATES {
        let section = section(&doc, heading).unwrap_or_else(|| {
            panic!("docs/code-layout.md has no line `## {heading}`: each crate's files are listed under it")
        });
        let mut files = BTreeSet::new();
        for folder in folders {
            for rel in files_under(&root.join(folder.path), folder.ext) {
                files.insert(format!("{}{rel}", folder.prefix));
            }
        }
        for file in &files {
            if !section.contains(&format!("`{file}`")) {
                missing.push(format!("{heading}: `{file}`"));
            }
        }
        // Split at the backticks, every second piece is the text inside a pair.
        for named in section.split('`').skip(1).step_by(2) {
            let is_file = named.ends_with(".rs") || named.ends_with(".js");
            if is_file && !files.contains(named) {
                stale.push(format!("{heading}: `{named}`"));
            }
        }
    }

    let mut problems = String::new();
    if !missing.is_empty() {
        problems += "source files not named in docs/code-layout.md \
                     (for each, add a line for it to docs/code-layout.md, under its crate's \
                     heading, saying what the file does):\n";
        for m in &missing {
            problems += &format!("  {m}\n");
        }
    }
    if !stale.is_empty() {
        problems += "files named in docs/code-layout.md that do not exist \
                     (rename or remove the line):\n";
        for s in &stale {
            problems += &format!("  {s}\n");
        }
    }
    assert!(problems.is_empty(), "\n{problems}");
}

/// The text from the line `## <heading>` to the next line that starts with `## `.
fn section<'a>(doc: &'a str, heading: &str) -> Option<&'a str> {
    let title = format!("\n## {heading}\n");
    let start = doc.find(&title)? + title.len();
    let rest = &doc[start..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Every file with extension `ext` under `dir`, by its path from `dir`
/// with `/` between the parts.
fn files_under(dir: &Path, ext: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let entries = fs::read_dir(&folder).unwrap_or_else(|e| panic!("reading {}: {e}", folder.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                let rel = path.strip_prefix(dir).unwrap();
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                found.push(parts.join("/"));
            }
        }
    }
    found
}
