//! A contract program's turn: started for one capture in a process group of
//! its own, the capture written to its stdin (its images as 0600 files in a
//! private folder, named by `path`), its stdout read line by line until
//! `done` for that cid. Whatever ends the turn (done, a timeout, a cancel,
//! the adapter's own end) ends the whole group: no process is left behind.

use std::{ffi::OsString, os::unix::fs::OpenOptionsExt, process::Stdio};

use tokio::{
    io::{AsyncWriteExt, BufReader},
    process::Command,
    sync::mpsc,
};

use super::{
    contract::{self, Part, Said},
    TurnEnd,
};

/// Kills the program's process group when the turn is over, however it ends.
struct Group(Option<i32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // SAFETY: a signal to a process group this turn made.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// A private folder (0700) for a turn's files, removed with the turn.
struct Folder(std::path::PathBuf);

impl Folder {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("thunderbolt-capture-{}", crate::ids::random_hex(8)));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `argv` for capture `cid`; each reply goes to `replies`.
pub async fn run(
    argv: &[OsString],
    cid: &str,
    agent: &str,
    text: &str,
    mut parts: Vec<Part>,
    replies: mpsc::Sender<super::Update>,
) -> TurnEnd {
    let Some((program, args)) = argv.split_first() else {
        return TurnEnd::Failed("no program to run".into());
    };
    // The images, as files only this user reads, gone with the turn.
    let dir = match Folder::new() {
        Ok(d) => d,
        Err(e) => return TurnEnd::Failed(format!("cannot keep the prompt's files: {e}")),
    };
    for (i, p) in parts.iter_mut().enumerate() {
        let ext = p
            .mime
            .rsplit('/')
            .next()
            .filter(|e| e.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or("bin");
        let path = dir.0.join(format!("part-{i}.{ext}"));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &p.bytes));
        if let Err(e) = written {
            return TurnEnd::Failed(format!("cannot keep the prompt's files: {e}"));
        }
        p.path = Some(path.display().to_string());
    }
    let mut child = match Command::new(program)
        .args(args)
        .env("THUNDERBOLT_AGENT", agent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return TurnEnd::Failed(format!("{agent}: cannot start {}: {e}", program.to_string_lossy()))
        }
    };
    let _group = Group(child.id().map(|p| p as i32));
    let mut line =
        serde_json::to_vec(&contract::capture(cid, agent, text, &parts, false)).unwrap_or_default();
    line.push(b'\n');
    if let Some(mut stdin) = child.stdin.take() {
        // A program that does not read its capture still gets its turn's bound.
        let _ = stdin.write_all(&line).await;
        drop(stdin);
    }
    let Some(stdout) = child.stdout.take() else { return TurnEnd::Failed("no stdout".into()) };
    let mut out = BufReader::new(stdout);
    let mut buf = Vec::new();
    let mut replied = false;
    loop {
        buf.clear();
        match crate::reach::socket::read_line(&mut out, &mut buf, contract::MAX_LINE).await {
            Ok(crate::reach::socket::Line::Whole) => match contract::said_line(&buf, cid) {
                Said::Reply(t) => {
                    replied = true;
                    let _ = replies.send(super::Update::Text(t)).await;
                }
                Said::Done => return TurnEnd::Done,
                Said::Ignored => {}
            },
            // A line too long is not the contract's: skipped, as a bad line is.
            Ok(crate::reach::socket::Line::TooLong) => {
                return TurnEnd::Failed(format!("{agent} wrote a line over {} bytes", contract::MAX_LINE))
            }
            Ok(crate::reach::socket::Line::End) | Err(_) => break,
        }
    }
    let status = child.wait().await;
    TurnEnd::Failed(match status {
        // Its replies, then its end without `done`: the turn is over all the same.
        Ok(s) if s.success() && replied => return TurnEnd::Done,
        Ok(s) if s.success() => format!("{agent} finished without a reply"),
        Ok(s) => format!("{agent} could not answer: it exited ({s}) before its turn was done"),
        Err(e) => format!("{agent} could not answer: {e}"),
    })
}
