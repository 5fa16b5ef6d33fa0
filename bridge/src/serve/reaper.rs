//! No agent process group outlives the bridge, even a bridge killed with SIGKILL.
//!
//! `PR_SET_PDEATHSIG` reaches only the agent itself, not the processes it
//! started. So at start-up the bridge runs a small watcher: its own executable
//! in a hidden mode (`thunderbolt reap-agents`), detached (it forks once more
//! and its first process exits, so it is no child of the bridge and outlives
//! it by design), in a session of its own (a Ctrl-C in the terminal does not
//! reach it) and ignoring the usual termination signals. The bridge tells it, over the watcher's stdin, each
//! agent group it starts (`+PGID`) and ends (`-PGID`). When that pipe closes —
//! the bridge exited or was killed, however — the watcher sends SIGKILL to every
//! group still listed, and exits. The bridge itself ends groups at each
//! session's end; the watcher is only the safety net.
//!
//! One watcher per bridge, one line per session start and end: nothing on the
//! data path.

use std::{
    collections::HashSet,
    io::{BufRead, Write},
    os::unix::process::CommandExt,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Mutex, OnceLock},
};

use tracing::{debug, warn};

/// The hidden subcommand that runs the watcher.
pub const SUBCOMMAND: &str = "reap-agents";

struct Watcher {
    stdin: Mutex<Option<ChildStdin>>,
}

static WATCHER: OnceLock<Watcher> = OnceLock::new();

/// Starts the watcher (once per process). Without it the bridge still runs:
/// agents keep their parent-death signal, and the log says what is lost.
pub fn start() {
    if WATCHER.get().is_some() {
        return;
    }
    let spawn = || -> std::io::Result<Watcher> {
        let exe = std::env::current_exe()?;
        let mut child: Child = Command::new(exe)
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        // The first process exits as soon as the watcher is forked off.
        let status = child.wait()?;
        if !status.success() {
            return Err(std::io::Error::other(format!("the watcher did not start ({status})")));
        }
        Ok(Watcher { stdin: Mutex::new(stdin) })
    };
    match spawn() {
        Ok(w) => {
            let _ = WATCHER.set(w);
        }
        Err(e) => warn!(
            "cannot start the agent watcher ({e}); if the bridge is killed with SIGKILL, processes \
             started by an agent may survive it"
        ),
    }
}

/// Whether the watcher was started and still takes our messages.
pub fn is_running() -> bool {
    WATCHER.get().is_some_and(|w| w.stdin.lock().unwrap_or_else(|p| p.into_inner()).is_some())
}

fn tell(line: String) {
    let Some(w) = WATCHER.get() else { return };
    let mut guard = w.stdin.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(stdin) = guard.as_mut() {
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            warn!("the agent watcher is gone ({e}); agents' own children are no longer guarded");
            *guard = None;
        }
    }
}

/// An agent group started: the watcher kills it if the bridge dies.
pub fn track(pgid: u32) {
    debug!(pgid, "watching agent group");
    tell(format!("+{pgid}\n"));
}

/// An agent group ended (killed and reaped by the bridge).
pub fn untrack(pgid: u32) {
    tell(format!("-{pgid}\n"));
}

/// The watcher's body: reads `+PGID`/`-PGID` lines until EOF, then kills every
/// group still listed. Runs before any runtime or logging is set up.
pub fn run_watcher() -> std::process::ExitCode {
    // SAFETY: fork, setsid and signal dispositions in a process that has one
    // thread and holds no locks (nothing else ran yet).
    unsafe {
        match libc::fork() {
            -1 => return std::process::ExitCode::FAILURE,
            0 => {}
            _ => libc::_exit(0),
        }
        libc::setsid();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let mut groups = HashSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (op, num) = line.split_at(line.len().min(1));
        match (op, num.parse::<u32>()) {
            ("+", Ok(pgid)) if pgid > 1 => {
                groups.insert(pgid);
            }
            ("-", Ok(pgid)) => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in groups {
        crate::serve::agent::kill_group(pgid, libc::SIGKILL);
    }
    std::process::ExitCode::SUCCESS
}
