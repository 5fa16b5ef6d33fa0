//! The phone app's static files (`www/` and `pkg/` of the app directory),
//! served by the relay under [`PREFIX`] so the app gets an https origin from a
//! relay its owner already runs.
//!
//! Everything served is read once, at start, into memory: the set of URLs is
//! exactly the set of files found then (iroh-relay routes exact paths only), so
//! a request can never name a path that was not vetted here. `..`, `%2e%2e`,
//! absolute or odd paths simply match no entry and get a 404; a symlink is
//! followed only when it resolves inside the app directory.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use hyper::body::Bytes;

/// Where the app lives on the relay's origin (the relay protocol owns `/relay`,
/// `/ping` and the root; the app keeps to its own path).
pub const PREFIX: &str = "/app/";

/// The page itself: where a bare `/app/`, `/app/www` and the pairing paths send the browser.
pub const PAGE: &str = "/app/www/";

/// Tells a page loaded from here that its origin is a thunderbolt relay (so it homes there).
pub const RELAY_JSON_PATH: &str = "/app/relay.json";
pub const RELAY_JSON: &str = "{\"thunderbolt_relay\":true}\n";

/// The app directory's subdirectories that are served; anything else in it
/// (sources, tests, node_modules of a checkout) never is.
const SERVED_DIRS: [&str; 2] = ["www", "pkg"];

/// The largest single file: the wasm module is about 2.2 MB; 16 MiB leaves
/// room to grow while keeping one stray file from filling the relay's memory.
const MAX_FILE_BYTES: u64 = 16 << 20;
/// All files together, held in memory for the relay's lifetime (the app is ~2.5 MB).
const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// Each file is one route (and one path string kept for the process's life);
/// the app has about twenty.
const MAX_FILES: usize = 512;
/// How deep below `www/` or `pkg/` files are looked for (also stops symlink loops).
const MAX_DEPTH: usize = 8;

/// The app's pairing paths (`thunderbolt iroh pair --app-url <origin>/app`), as
/// `client-wasm/serve.mjs` answers them: the page stands in, the #fragment is
/// kept by the browser across the redirect.
const PAIRING_PATHS: [&str; 2] = ["/app/settings/agents", "/app/settings/mcp-servers"];

/// One served file.
#[derive(Debug, Clone)]
pub struct AppFile {
    pub content_type: &'static str,
    pub body: Bytes,
}

/// The files found in the app directory, by URL path (`/app/www/app.js`).
#[derive(Debug, Default)]
pub struct AppFiles {
    files: BTreeMap<String, AppFile>,
    /// What was left out, and why (logged at start; tests look at it).
    pub skipped: Vec<(PathBuf, &'static str)>,
}

/// An app directory that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum AppDirError {
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{0} has no www/index.html (give the directory that holds the app's www/ and pkg/)")]
    NotAnApp(PathBuf),
    #[error("{path} is {size} bytes, above the {MAX_FILE_BYTES}-byte limit for one file")]
    FileTooBig { path: PathBuf, size: u64 },
    #[error("the app's files are above the {MAX_TOTAL_BYTES}-byte limit for all of them")]
    TooBig,
    #[error("the app has more than {MAX_FILES} files")]
    TooMany,
}

impl AppFiles {
    /// Reads `dir/www` and `dir/pkg`.
    pub fn load(dir: &Path) -> Result<Self, AppDirError> {
        let read = |path: &Path, cause| AppDirError::Read { path: path.into(), cause };
        let root = dir.canonicalize().map_err(|e| read(dir, e))?;
        if !root.join("www/index.html").is_file() {
            return Err(AppDirError::NotAnApp(dir.into()));
        }
        let mut app = AppFiles::default();
        let mut total = 0;
        for sub in SERVED_DIRS {
            let path = root.join(sub);
            if path.symlink_metadata().is_ok() {
                app.walk(&root, &path, &format!("{PREFIX}{sub}"), 0, &mut total)?;
            }
        }
        if let Some(index) = app.files.get("/app/www/index.html").cloned() {
            app.files.insert(PAGE.into(), index);
        }
        Ok(app)
    }

    fn walk(
        &mut self,
        root: &Path,
        path: &Path,
        url: &str,
        depth: usize,
        total: &mut u64,
    ) -> Result<(), AppDirError> {
        let read = |cause| AppDirError::Read { path: path.into(), cause };
        // Resolved, so that a symlink (or a symlinked www/) counts by where it leads.
        let real = match path.canonicalize() {
            Ok(r) => r,
            Err(_) => return self.skip(path, "a dangling symlink"),
        };
        if !real.starts_with(root) {
            return self.skip(path, "leads outside the app directory");
        }
        let meta = std::fs::metadata(&real).map_err(read)?;
        if meta.is_dir() {
            if depth >= MAX_DEPTH {
                return self.skip(path, "too deep");
            }
            let mut entries: Vec<_> =
                std::fs::read_dir(path).map_err(read)?.collect::<Result<_, _>>().map_err(read)?;
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let name = entry.file_name();
                match name.to_str().filter(|n| safe_name(n)) {
                    Some(n) => self.walk(root, &entry.path(), &format!("{url}/{n}"), depth + 1, total)?,
                    None => self.skip(&entry.path(), "a hidden file or a name not served")?,
                }
            }
            return Ok(());
        }
        if !meta.is_file() {
            return self.skip(path, "not a regular file");
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(AppDirError::FileTooBig { path: path.into(), size: meta.len() });
        }
        if self.files.len() >= MAX_FILES {
            return Err(AppDirError::TooMany);
        }
        let body = std::fs::read(&real).map_err(read)?;
        *total += body.len() as u64;
        if *total > MAX_TOTAL_BYTES {
            return Err(AppDirError::TooBig);
        }
        self.files
            .insert(url.to_string(), AppFile { content_type: content_type(url), body: Bytes::from(body) });
        Ok(())
    }

    fn skip(&mut self, path: &Path, why: &'static str) -> Result<(), AppDirError> {
        self.skipped.push((path.into(), why));
        Ok(())
    }

    /// The file for a request's path, exactly as sent (never decoded or
    /// normalised): what a route lookup does, for the tests.
    #[cfg(test)]
    pub fn get(&self, url_path: &str) -> Option<&AppFile> {
        self.files.get(url_path)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &AppFile)> {
        self.files.iter()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn total_bytes(&self) -> usize {
        self.files.values().map(|f| f.body.len()).sum()
    }
}

/// The paths answered with a redirect to the page ([`PAGE`]).
pub fn redirects() -> impl Iterator<Item = &'static str> {
    ["/app", PREFIX, "/app/www"].into_iter().chain(PAIRING_PATHS)
}

/// A file name that is served under the same name in a URL: no encoding
/// needed, no hidden files (`.git`, editor droppings), nothing a browser or a
/// proxy would rewrite.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// As `client-wasm/serve.mjs` types them (.wasm must be application/wasm for streaming compilation).
fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "webmanifest" => "application/manifest+json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ts" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `<tmp>/app/{www,pkg}` and a secret beside the app.
    fn app() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let app = t.path().join("app");
        std::fs::create_dir_all(app.join("www/sub")).unwrap();
        std::fs::create_dir_all(app.join("pkg")).unwrap();
        std::fs::create_dir_all(app.join("src")).unwrap();
        std::fs::write(app.join("www/index.html"), "<html>").unwrap();
        std::fs::write(app.join("www/app.js"), "x").unwrap();
        std::fs::write(app.join("www/sub/a.svg"), "<svg/>").unwrap();
        std::fs::write(app.join("www/.secret"), "no").unwrap();
        std::fs::write(app.join("pkg/m_bg.wasm"), b"\0asm").unwrap();
        std::fs::write(app.join("src/main.rs"), "fn main() {}").unwrap();
        std::fs::write(t.path().join("Cargo.toml"), "[package]").unwrap();
        t
    }

    #[test]
    fn serves_www_and_pkg_with_their_types() {
        let t = app();
        let a = AppFiles::load(&t.path().join("app")).unwrap();
        assert_eq!(a.get("/app/www/").unwrap().body, "<html>");
        assert_eq!(a.get("/app/www/index.html").unwrap().content_type, "text/html; charset=utf-8");
        assert_eq!(a.get("/app/www/app.js").unwrap().content_type, "text/javascript; charset=utf-8");
        assert_eq!(a.get("/app/www/sub/a.svg").unwrap().content_type, "image/svg+xml");
        assert_eq!(a.get("/app/pkg/m_bg.wasm").unwrap().content_type, "application/wasm");
        assert_eq!(a.len(), 5);
        // Only www/ and pkg/: the rest of the directory is never served.
        assert!(a.get("/app/src/main.rs").is_none());
        assert!(a.get("/app/www/.secret").is_none());
        assert!(a.skipped.iter().any(|(p, _)| p.ends_with(".secret")));
    }

    #[test]
    fn traversal_absolute_and_encoded_paths_match_nothing() {
        let t = app();
        let a = AppFiles::load(&t.path().join("app")).unwrap();
        for p in [
            "/app/../Cargo.toml",
            "/app/www/../../Cargo.toml",
            "/app/www/../src/main.rs",
            "/app/%2e%2e/Cargo.toml",
            "/app/www/%2e%2e/%2e%2e/Cargo.toml",
            "/app/www/..%2f..%2fCargo.toml",
            "/app/www%2fapp.js",
            "/app/www/app.js/",
            "/app//www/app.js",
            "/app/www/./app.js",
            "/app/src/main.rs",
            "//etc/passwd",
            "/etc/passwd",
            "/app/www/.secret",
            "/app/www/app.js%00",
            "app/www/app.js",
        ] {
            assert!(a.get(p).is_none(), "{p} must not be served");
        }
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_directory_are_left_out() {
        let t = app();
        let app = t.path().join("app");
        std::os::unix::fs::symlink(t.path().join("Cargo.toml"), app.join("www/cargo.toml")).unwrap();
        std::os::unix::fs::symlink(t.path(), app.join("www/up")).unwrap();
        std::os::unix::fs::symlink("/etc", app.join("pkg/etc")).unwrap();
        std::os::unix::fs::symlink(app.join("www/app.js"), app.join("www/same.js")).unwrap();
        std::os::unix::fs::symlink(app.join("nowhere"), app.join("www/dangling.js")).unwrap();
        let a = AppFiles::load(&app).unwrap();
        assert!(a.get("/app/www/cargo.toml").is_none());
        assert!(a.get("/app/www/up/Cargo.toml").is_none());
        assert!(a.iter().all(|(p, _)| !p.starts_with("/app/pkg/etc")));
        assert!(a.iter().all(|(_, f)| f.body != "[package]"));
        // A symlink within the app directory is fine.
        assert_eq!(a.get("/app/www/same.js").unwrap().body, "x");
        let outside = a.skipped.iter().filter(|(_, why)| *why == "leads outside the app directory").count();
        assert_eq!(outside, 3, "{:?}", a.skipped);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_www_leading_out_is_refused() {
        let t = app();
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("index.html"), "elsewhere").unwrap();
        let app = t.path().join("app2");
        std::fs::create_dir(&app).unwrap();
        std::os::unix::fs::symlink(other.path(), app.join("www")).unwrap();
        // www/index.html exists through the link, but www leads out: nothing is served.
        let a = AppFiles::load(&app).unwrap();
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn limits_and_a_directory_that_is_not_the_app() {
        let t = app();
        assert!(matches!(AppFiles::load(&t.path().join("app/src")), Err(AppDirError::NotAnApp(_))));
        assert!(matches!(AppFiles::load(&t.path().join("missing")), Err(AppDirError::Read { .. })));
        let big = t.path().join("app/pkg/big.wasm");
        std::fs::File::create(&big).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(matches!(AppFiles::load(&t.path().join("app")), Err(AppDirError::FileTooBig { .. })));
    }

    #[test]
    fn names_and_redirects() {
        assert!(safe_name("thunderbolt_client_wasm_bg.wasm"));
        for bad in ["", ".", "..", ".git", "a b", "a%2e", "é.js", "a\\b"] {
            assert!(!safe_name(bad), "{bad}");
        }
        let r: Vec<_> = redirects().collect();
        assert!(r.contains(&"/app/settings/agents") && r.contains(&"/app/settings/mcp-servers"));
        assert!(r.iter().all(|p| p.starts_with("/app")));
    }
}
