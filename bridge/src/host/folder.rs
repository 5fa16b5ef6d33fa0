//! `$THUNDERBOLT_HOME/agents.d/`: every manifest in it, and what changed.
//!
//! The folder is read whole each time something in it changed (a file added,
//! removed, or rewritten, found by polling each file's size, time and inode:
//! no file-watch API is needed, and an editor's save-by-rename is seen as
//! well). Files that are not `*.json`, or start with `.`, are not manifests
//! (editor backups, swap files).

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::host::manifest::{self, AgentSpec, Machine, NotLoaded};

/// How often the folder is looked at: a new file serves within about this
/// (the issue's promise is 2 s), and a look costs one `stat` per file.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Most agents one host serves. Each has an endpoint of its own: its UDP
/// sockets (one to three descriptors), tasks, and a relay connection; 64 of
/// them stay a small share of the 1024 descriptors a process gets by default,
/// which its sessions need too (each session's agent holds three pipes and
/// its connection). Past it, the agents served already stay served and new
/// manifests are refused (in file-name order).
pub const MAX_HOSTED_AGENTS: usize = 64;

/// The folder's manifests as last read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// Valid manifests by agent name.
    pub agents: BTreeMap<String, AgentSpec>,
    /// Refused files and why.
    pub refused: Vec<(PathBuf, String)>,
    /// A problem with the folder itself (then every file is refused).
    pub folder: Option<String>,
}

/// What identifies a file's content without reading it.
type Stamp = (u64, i64, i64, u64);

/// The folder and what was seen in it.
#[derive(Debug)]
pub struct Folder {
    dir: PathBuf,
    machine: Machine,
    stamps: BTreeMap<PathBuf, Stamp>,
    dir_stamp: Option<Stamp>,
    /// What the last good read gave: kept while the folder cannot be read.
    last: Loaded,
    /// Why the folder cannot be read now (said once, not every poll).
    unreadable: Option<String>,
}

impl Folder {
    pub fn new(dir: PathBuf, machine: Machine) -> Self {
        Self {
            dir,
            machine,
            stamps: BTreeMap::new(),
            dir_stamp: None,
            last: Loaded::default(),
            unreadable: None,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads every manifest now.
    pub fn load(&mut self) -> Loaded {
        let (stamps, dir_stamp) = self.scan();
        self.stamps = stamps;
        self.dir_stamp = dir_stamp;
        self.last = load_dir(&self.dir, &self.machine);
        self.last.clone()
    }

    /// The folder again, if anything in it changed since the last look. A
    /// folder that cannot be read (out of descriptors, renamed away for a
    /// moment) is not a folder with no manifests: nothing changes, it is said
    /// once, and the next look tries again.
    pub fn changed(&mut self) -> Option<Loaded> {
        let (stamps, dir_stamp) = self.scan();
        if stamps == self.stamps && dir_stamp == self.dir_stamp && self.unreadable.is_none() {
            return None;
        }
        match load_dir_after(&self.dir, &self.machine, &self.last) {
            Ok(next) => {
                if self.unreadable.take().is_some() {
                    tracing::info!("{} can be read again", self.dir.display());
                }
                self.stamps = stamps;
                self.dir_stamp = dir_stamp;
                self.last = next.clone();
                Some(next)
            }
            Err(why) => {
                if self.unreadable.as_deref() != Some(why.as_str()) {
                    tracing::warn!(
                        "{} cannot be read ({why}): still serving the {} agent(s) it last had; looking again every {:?}",
                        self.dir.display(),
                        self.last.agents.len(),
                        POLL_INTERVAL
                    );
                    self.unreadable = Some(why);
                }
                None
            }
        }
    }

    fn scan(&self) -> (BTreeMap<PathBuf, Stamp>, Option<Stamp>) {
        let stamp =
            |m: &std::fs::Metadata| (m.len(), m.mtime(), m.mtime_nsec(), m.ino() ^ u64::from(m.mode()));
        let dir_stamp = std::fs::metadata(&self.dir).ok().map(|m| stamp(&m));
        let mut out = BTreeMap::new();
        for path in manifest_files(&self.dir).unwrap_or_default() {
            if let Ok(m) = std::fs::symlink_metadata(&path) {
                out.insert(path, stamp(&m));
            }
        }
        (out, dir_stamp)
    }
}

/// The `*.json` files of `dir`, sorted (load order decides which of two
/// files naming the same agent wins: the first; [`load_dir_after`] puts the
/// files already served first).
fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && name.ends_with(".json")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Reads every manifest in `dir` (none when it cannot be read).
pub fn load_dir(dir: &Path, machine: &Machine) -> Loaded {
    load_dir_after(dir, machine, &Loaded::default()).unwrap_or_default()
}

/// Reads every manifest in `dir`, after `last` was read from it: a file
/// that cannot be read for a moment (an I/O error, not its content) keeps
/// its last good manifest, and at the cap the agents `last` has come first.
/// `Err`: the folder itself cannot be read.
pub fn load_dir_after(dir: &Path, machine: &Machine, last: &Loaded) -> Result<Loaded, String> {
    let mut out = Loaded::default();
    let meta = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && last.agents.is_empty() => return Ok(out),
        Err(e) => return Err(e.to_string()),
        Ok(meta) => meta,
    };
    let files = manifest_files(dir).map_err(|e| e.to_string())?;
    if let Err(why) = manifest::check_owner(&meta, machine, "the folder") {
        out.folder = Some(format!("{}: {why}", dir.display()));
        out.refused = files.into_iter().map(|f| (f, format!("its folder is refused: {why}"))).collect();
        return Ok(out);
    }
    // At the cap, what is served now stays served: the files `last` loaded first.
    let served: std::collections::HashSet<&Path> = last.agents.values().map(|a| a.source.as_path()).collect();
    let (mut first, rest): (Vec<PathBuf>, Vec<PathBuf>) =
        files.into_iter().partition(|f| served.contains(f.as_path()));
    first.extend(rest);
    for file in first {
        match manifest::load_file(&file, machine) {
            Ok(spec) => {
                let identity = spec.identity.file_name(&spec.name);
                let same_identity = out.agents.values().find(|a| a.identity.file_name(&a.name) == identity);
                if let Some(first) = out.agents.get(&spec.name) {
                    let why =
                        format!("agent name '{}' is already used by {}", spec.name, first.source.display());
                    out.refused.push((file, why));
                } else if let Some(first) = same_identity {
                    // One NodeId is one agent: two would share a ticket and an
                    // endpoint's worth of pairings, and only one could be reached.
                    let why = format!(
                        "its identity (iroh/{identity}) is already used by {} (agent '{}'): one identity \
                         per manifest",
                        first.source.display(),
                        first.name
                    );
                    out.refused.push((file, why));
                } else if out.agents.len() >= MAX_HOSTED_AGENTS {
                    let why = format!(
                        "over the {MAX_HOSTED_AGENTS} agents one host serves (each holds an endpoint and its \
                         sockets); those served already stay, then the first by file name"
                    );
                    out.refused.push((file, why));
                } else {
                    out.agents.insert(spec.name.clone(), spec);
                }
            }
            Err(NotLoaded::Refused(why)) => out.refused.push((file, why.0)),
            // Out of descriptors (or any other trouble reading it) is not a
            // refusal of its content: a served file keeps its last good manifest.
            // (Told by the one open `load_file` made, which never waits: a
            // second, plain open here hung the host on a FIFO.)
            Err(NotLoaded::Unreadable(e)) => match last.agents.values().find(|a| a.source == file) {
                Some(kept) => {
                    tracing::warn!(
                        "{}: cannot read it now ({e}); its last good manifest stays",
                        file.display()
                    );
                    out.agents.insert(kept.name.clone(), kept.clone());
                }
                None => out.refused.push((file, format!("cannot read it: {e}"))),
            },
        }
    }
    out.refused.sort();
    Ok(out)
}

/// How the agents changed between two reads of the folder.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub added: Vec<AgentSpec>,
    pub removed: Vec<String>,
    /// Same name, new content.
    pub changed: Vec<AgentSpec>,
}

pub fn diff(old: &Loaded, new: &Loaded) -> Changes {
    let mut c = Changes::default();
    for (name, spec) in &new.agents {
        match old.agents.get(name) {
            None => c.added.push(spec.clone()),
            Some(prev) if prev != spec => c.changed.push(spec.clone()),
            Some(_) => {}
        }
    }
    for name in old.agents.keys() {
        if !new.agents.contains_key(name) {
            c.removed.push(name.clone());
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf, Machine) {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("agent");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let agents = dir.path().join("agents.d");
        std::fs::create_dir(&agents).unwrap();
        std::fs::set_permissions(&agents, std::fs::Permissions::from_mode(0o700)).unwrap();
        let m = Machine {
            uid: unsafe { libc::getuid() },
            path: Some(dir.path().as_os_str().to_owned()),
            home_dir: Some(dir.path().to_path_buf()),
        };
        (dir, agents, m)
    }

    fn write(dir: &Path, name: &str, text: &str, mode: u32) {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn bad_files_are_skipped_and_the_rest_load() {
        let (_d, agents, m) = setup();
        write(&agents, "a.json", r#"{"name":"a","command":["agent"]}"#, 0o600);
        write(&agents, "b.json", r#"{"name":"b","command":"agent --x"}"#, 0o600);
        write(&agents, "c.json", r#"{"name":"c","command":["agent"]}"#, 0o666);
        write(&agents, "d.json", r#"{"name":"a","command":["agent"]}"#, 0o600);
        write(&agents, "e.json", r#"{"name":"e","command":["agent"],"env":{"T":"s"}}"#, 0o644);
        write(&agents, "notes.txt", "not a manifest", 0o600);
        write(&agents, ".a.json.swp", "junk", 0o600);
        let l = load_dir(&agents, &m);
        assert_eq!(l.agents.keys().collect::<Vec<_>>(), ["a", "e"]);
        let reasons: Vec<String> = l.refused.iter().map(|(p, w)| format!("{}: {w}", p.display())).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("b.json") && reasons[0].contains("is a string"), "{reasons:?}");
        assert!(reasons[1].contains("c.json") && reasons[1].contains("writable by others"), "{reasons:?}");
        assert!(reasons[2].contains("d.json") && reasons[2].contains("already used"), "{reasons:?}");
        assert!(l.agents["e"].warnings[0].contains("readable by others"), "{:?}", l.agents["e"].warnings);
    }

    /// Plants a FIFO at `dir/name`.
    fn mkfifo(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path of ours.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
        p
    }

    /// `load` on another thread: a read that blocks fails the test instead of hanging it.
    fn load_within(mut f: Folder) -> (Folder, Loaded) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let l = f.load();
            let _ = tx.send((f, l));
        });
        rx.recv_timeout(Duration::from_secs(30)).expect("the folder was read (not blocked on a file in it)")
    }

    #[test]
    fn a_fifo_among_the_manifests_is_refused_without_blocking_and_the_rest_load() {
        let (_d, agents, m) = setup();
        write(&agents, "good.json", r#"{"name":"good","command":["agent"]}"#, 0o600);
        let fifo = mkfifo(&agents, "planted.json");
        let (mut f, l) = load_within(Folder::new(agents.clone(), m));
        assert_eq!(l.agents.keys().collect::<Vec<_>>(), ["good"]);
        assert_eq!(l.refused.len(), 1, "{:?}", l.refused);
        let (file, why) = &l.refused[0];
        assert_eq!(file, &fifo);
        assert!(why.contains("not a regular file but a FIFO"), "{why}");
        // A served manifest swapped for a FIFO is refused too, on the next look.
        std::fs::remove_file(agents.join("good.json")).unwrap();
        mkfifo(&agents, "good.json");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f.changed());
        });
        let next = rx.recv_timeout(Duration::from_secs(30)).expect("not blocked").expect("a change");
        assert!(next.agents.is_empty(), "{:?}", next.agents);
        assert_eq!(next.refused.len(), 2, "{:?}", next.refused);
    }

    #[test]
    fn a_second_manifest_on_an_identity_already_used_is_refused() {
        let (_d, agents, m) = setup();
        write(&agents, "a.json", r#"{"name":"a","command":["agent"],"identity":"acp"}"#, 0o600);
        write(&agents, "b.json", r#"{"name":"b","command":["agent"],"identity":"acp"}"#, 0o600);
        write(&agents, "c.json", r#"{"name":"c","command":["agent"],"identity":"mcp"}"#, 0o600);
        let l = load_dir(&agents, &m);
        assert_eq!(l.agents.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(l.refused.len(), 1, "{:?}", l.refused);
        let (file, why) = &l.refused[0];
        assert!(file.ends_with("b.json"), "{file:?}");
        assert!(why.contains("iroh/identity) is already used by") && why.contains("a.json"), "{why}");
    }

    #[test]
    fn manifests_over_the_cap_are_refused_with_why() {
        let (_d, agents, m) = setup();
        for i in 0..MAX_HOSTED_AGENTS + 2 {
            write(
                &agents,
                &format!("a{i:03}.json"),
                &format!(r#"{{"name":"a{i}","command":["agent"]}}"#),
                0o600,
            );
        }
        let l = load_dir(&agents, &m);
        assert_eq!(l.agents.len(), MAX_HOSTED_AGENTS);
        assert_eq!(l.refused.len(), 2, "{:?}", l.refused);
        for (file, why) in &l.refused {
            assert!(why.contains(&format!("over the {MAX_HOSTED_AGENTS} agents one host serves")), "{why}");
            let n: usize = file.file_stem().unwrap().to_str().unwrap()[1..].parse().unwrap();
            assert!(n >= MAX_HOSTED_AGENTS, "{file:?}");
        }
    }

    #[test]
    fn a_loose_folder_refuses_every_file() {
        let (_d, agents, m) = setup();
        write(&agents, "a.json", r#"{"name":"a","command":["agent"]}"#, 0o600);
        std::fs::set_permissions(&agents, std::fs::Permissions::from_mode(0o777)).unwrap();
        let l = load_dir(&agents, &m);
        assert!(l.agents.is_empty());
        assert!(l.folder.as_deref().unwrap().contains("writable by others"), "{:?}", l.folder);
        assert_eq!(l.refused.len(), 1);
    }

    #[test]
    fn a_folder_that_cannot_be_read_for_a_moment_changes_nothing() {
        let (d, agents, m) = setup();
        write(&agents, "a.json", r#"{"name":"a","command":["agent"]}"#, 0o600);
        let mut f = Folder::new(agents.clone(), m);
        let first = f.load();
        assert_eq!(first.agents.len(), 1);
        let away = d.path().join("away");
        std::fs::rename(&agents, &away).unwrap();
        assert!(f.changed().is_none(), "gone for a moment is not 'every manifest removed'");
        assert!(f.changed().is_none(), "and is looked at again");
        std::fs::rename(&away, &agents).unwrap();
        match f.changed() {
            Some(again) => assert!(diff(&first, &again) == Changes::default(), "nothing changed"),
            None => panic!("back: read again"),
        }
    }

    #[test]
    fn at_the_cap_the_agents_served_stay_served() {
        let (_d, agents, m) = setup();
        for i in 0..MAX_HOSTED_AGENTS {
            write(
                &agents,
                &format!("m{i:03}.json"),
                &format!(r#"{{"name":"m{i}","command":["agent"]}}"#),
                0o600,
            );
        }
        let mut f = Folder::new(agents.clone(), m);
        let first = f.load();
        assert_eq!(first.agents.len(), MAX_HOSTED_AGENTS);
        // A file sorting first, past the cap: it is refused, nobody served is dropped.
        write(&agents, "a.json", r#"{"name":"early","command":["agent"]}"#, 0o600);
        let next = f.changed().expect("a new file");
        assert!(diff(&first, &next).removed.is_empty(), "{:?}", diff(&first, &next));
        assert!(!next.agents.contains_key("early"));
        assert!(
            next.refused.iter().any(|(p, why)| p.ends_with("a.json") && why.contains("over the")),
            "{:?}",
            next.refused
        );
    }

    #[test]
    fn changes_are_seen_and_told_apart() {
        let (_d, agents, m) = setup();
        let mut f = Folder::new(agents.clone(), m);
        let first = f.load();
        assert!(first.agents.is_empty());
        assert!(f.changed().is_none());
        write(&agents, "a.json", r#"{"name":"a","command":["agent"]}"#, 0o600);
        let second = f.changed().expect("a new file is a change");
        assert_eq!(diff(&first, &second).added.len(), 1);
        write(&agents, "a.json", r#"{"name":"a","command":["agent"],"label":"A"}"#, 0o600);
        let third = f.changed().expect("a rewrite is a change");
        assert_eq!(diff(&second, &third).changed[0].label, "A");
        std::fs::remove_file(agents.join("a.json")).unwrap();
        let fourth = f.changed().expect("a removal is a change");
        assert_eq!(diff(&third, &fourth).removed, ["a"]);
    }
}
