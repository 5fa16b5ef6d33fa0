//! Spawning and ending agent processes.
//!
//! Sessions start their agent through a [`Launcher`]: the real one is an
//! [`AgentCommand`] (a process per session); tests give the session core an
//! in-memory agent instead, so its lifecycle can run on paused time.
//!
//! An agent runs in its own process group so that ending it also ends whatever
//! it started (language servers, shells): when a session ends the whole group
//! is killed, also when the agent itself had already exited and left children
//! behind. Every group is known to the [`crate::serve::reaper`], so even a bridge
//! killed with SIGKILL leaves no process of the group behind (should the
//! watcher not run, the agent gets `PR_SET_PDEATHSIG` instead, which covers the
//! agent itself but not its children).
//!
//! What escapes: a process that leaves the group on purpose (`setsid`,
//! `setpgid`), as daemons do. Nothing short of a cgroup per agent follows
//! those; the bridge does not create cgroups (it would need privileges or a
//! delegated cgroup tree that most desktops do not give to user programs).

use std::{ffi::OsString, future::Future, pin::Pin, process::Stdio, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    process::{Child, Command},
};
use tracing::debug;

use thunderbolt_shared::close::AgentEnd;

use crate::redact;

/// The command to run for each admitted connection.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    argv: Vec<OsString>,
    /// Added to the bridge's own environment.
    env: Vec<(String, String)>,
    /// Where it runs (else where the bridge runs).
    cwd: Option<std::path::PathBuf>,
    /// Where devices' files for it land (a manifest's `files`), else the home's.
    files: Option<std::path::PathBuf>,
}

impl AgentCommand {
    /// `None` for an empty argv.
    pub fn new(argv: Vec<OsString>) -> Option<Self> {
        (!argv.is_empty()).then_some(Self { argv, env: Vec::new(), cwd: None, files: None })
    }

    /// The same command with variables added to its environment and a working directory.
    pub fn with(mut self, env: Vec<(String, String)>, cwd: Option<std::path::PathBuf>) -> Self {
        self.env = env;
        self.cwd = cwd;
        self
    }

    /// The same command with devices' files landing in `dir` (inside its workspace).
    pub fn files_in(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.files = dir;
        self
    }

    /// Its argv, for showing what runs.
    pub fn argv(&self) -> &[OsString] {
        &self.argv
    }

    /// The program as the user wrote it (for `failed to spawn '<argv0>'`).
    pub fn argv0(&self) -> String {
        self.argv[0].to_string_lossy().into_owned()
    }

    /// The command line with secrets masked, for the banner and logs.
    pub fn redacted(&self) -> String {
        let words: Vec<String> = self.argv.iter().map(|w| w.to_string_lossy().into_owned()).collect();
        redact::redact_command(&words)
    }

    /// Checks that the program exists and is executable (searching `PATH` for a
    /// bare name), so a typo is reported at startup rather than per connection.
    pub fn check_program(&self) -> Result<std::path::PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        let prog = std::path::Path::new(&self.argv[0]);
        let is_exec = |p: &std::path::Path| {
            std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
        };
        if prog.components().count() > 1 {
            return if is_exec(prog) {
                Ok(prog.to_path_buf())
            } else if prog.exists() {
                Err(format!("agent command '{}' is not an executable file", prog.display()))
            } else {
                Err(format!("agent command '{}' not found", prog.display()))
            };
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join(prog))
            .find(|p| is_exec(p))
            .ok_or_else(|| format!("agent command '{}' not found in PATH", prog.display()))
    }

    /// Starts the agent with piped stdio.
    pub fn spawn(&self) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.argv[0]);
        for (name, _) in std::env::vars_os() {
            if withheld(&name) {
                cmd.env_remove(&name);
            }
        }
        // A manifest's own `env` is the agent's to have, a THUNDERBOLT_ one included.
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        // With the watcher running, the spawn needs no code in the child, so
        // std uses posix_spawn (no copy of the bridge's page tables: the cost
        // does not grow with the bridge's memory). Without it, fall back to the
        // parent-death signal, which needs a fork.
        #[cfg(target_os = "linux")]
        if !crate::serve::reaper::is_running() {
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.spawn()
    }
}

/// Variables of the bridge's own environment an agent never inherits
/// (unless a manifest sets them): the bridge's configuration, which holds its
/// secrets (`THUNDERBOLT_TOKEN`, a `--notify-url` with credentials in it), and
/// the service manager's handles, which are the bridge's and not the agent's
/// to use (an agent writing `STOPPING=1` to the notify socket, or taking the
/// watchdog over). A peer can ask an agent to print its environment.
fn withheld(name: &std::ffi::OsStr) -> bool {
    const SERVICE: [&str; 6] =
        ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];
    let name = name.as_encoded_bytes();
    name.starts_with(b"THUNDERBOLT_") || SERVICE.iter().any(|s| s.as_bytes() == name)
}

/// A boxed future borrowing the agent.
pub type AgentFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How sessions start their agent.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// Starts one agent with its three pipes.
    fn start(&self) -> std::io::Result<Started>;
    /// The program as the user wrote it (for `failed to spawn '<argv0>'`).
    fn argv0(&self) -> String;
    /// The command line with secrets masked, for logs.
    fn redacted(&self) -> String;
    /// The folder it works in, which devices may get files from: where it
    /// runs (by default, where the bridge runs).
    fn workspace(&self) -> Option<std::path::PathBuf> {
        std::env::current_dir().ok()
    }
    /// Where devices' files land instead of the home's `files/<agent>/`: a
    /// folder its manifest names inside its workspace.
    fn files_folder(&self) -> Option<std::path::PathBuf> {
        None
    }
}

/// A started agent: the pipes the session pumps, and its lifetime.
pub struct Started {
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Goes to the bridge's log, never to the peer.
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub process: Box<dyn AgentProcess>,
}

/// A running agent's lifetime, as the session core drives it.
pub trait AgentProcess: Send {
    /// Its process id, for the log.
    fn id(&self) -> Option<u32>;
    /// Resolves when it has ended: how, or `None` when that cannot be told.
    /// Cancel-safe.
    fn wait(&mut self) -> AgentFuture<'_, Option<AgentEnd>>;
    /// How it ended, if it has; `None` while it runs.
    fn try_wait(&mut self) -> Option<Option<AgentEnd>>;
    /// Ends it: asked first, forced after `grace`; it is reaped when this returns.
    fn terminate(&mut self, grace: Duration) -> AgentFuture<'_, ()>;
    /// The session is over: end whatever it left running.
    fn clean_up(&mut self);
}

impl Launcher for AgentCommand {
    fn start(&self) -> std::io::Result<Started> {
        let mut child = self.spawn()?;
        let stdin = Box::new(child.stdin.take().expect("stdin piped"));
        let stdout = Box::new(child.stdout.take().expect("stdout piped"));
        let stderr = child.stderr.take().map(|e| Box::new(e) as Box<dyn AsyncRead + Send + Unpin>);
        // The agent leads its own group: its pid is the group id, kept after
        // the agent is reaped so the group can still be ended.
        let pgid = child.id();
        if let Some(pgid) = pgid {
            crate::serve::reaper::track(pgid);
        }
        Ok(Started { stdin, stdout, stderr, process: Box::new(AgentChild { child, pgid }) })
    }

    fn argv0(&self) -> String {
        AgentCommand::argv0(self)
    }

    fn redacted(&self) -> String {
        AgentCommand::redacted(self)
    }

    fn workspace(&self) -> Option<std::path::PathBuf> {
        self.cwd.clone().or_else(|| std::env::current_dir().ok())
    }

    fn files_folder(&self) -> Option<std::path::PathBuf> {
        self.files.clone()
    }
}

/// An agent process and the group it leads.
struct AgentChild {
    child: Child,
    pgid: Option<u32>,
}

impl AgentProcess for AgentChild {
    fn id(&self) -> Option<u32> {
        self.pgid
    }

    fn wait(&mut self) -> AgentFuture<'_, Option<AgentEnd>> {
        Box::pin(async move { self.child.wait().await.ok().and_then(end_of) })
    }

    fn try_wait(&mut self) -> Option<Option<AgentEnd>> {
        match self.child.try_wait() {
            Ok(Some(s)) => Some(end_of(s)),
            Ok(None) => None,
            Err(_) => Some(None),
        }
    }

    fn terminate(&mut self, grace: Duration) -> AgentFuture<'_, ()> {
        Box::pin(terminate(&mut self.child, grace))
    }

    fn clean_up(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid, libc::SIGKILL);
            crate::serve::reaper::untrack(pgid);
        }
    }
}

impl Drop for AgentChild {
    fn drop(&mut self) {
        // A session task aborted mid-way still leaves no group behind.
        self.clean_up();
    }
}

/// How a reaped agent ended.
pub fn end_of(status: std::process::ExitStatus) -> Option<AgentEnd> {
    use std::os::unix::process::ExitStatusExt;
    status.code().map(AgentEnd::exited).or_else(|| status.signal().map(AgentEnd::signaled))
}

/// Ends the agent and its process group: SIGTERM, then SIGKILL after `grace`,
/// and reaps it so its pid is really gone when this returns.
pub async fn terminate(child: &mut Child, grace: Duration) {
    let Some(pid) = child.id() else {
        // Already reaped.
        return;
    };
    if let Ok(Some(_)) = child.try_wait() {
        kill_group(pid, libc::SIGKILL);
        return;
    }
    kill_group(pid, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(_) => kill_group(pid, libc::SIGKILL),
        Err(_) => {
            debug!(pid, "agent ignored SIGTERM for {grace:?}; sending SIGKILL");
            kill_group(pid, libc::SIGKILL);
            let _ = child.wait().await;
        }
    }
}

/// Signals the whole group led by `pid` (the agent is its group leader). Any
/// children it left behind go too.
pub fn kill_group(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall; a stale group id only yields ESRCH.
    unsafe {
        libc::killpg(pid as libc::pid_t, sig);
    }
}
