//! A fake agent for in-process tests of the serving core: in-memory pipes, its
//! behaviour scripted per test, every lifecycle step recorded with its time.
#![allow(dead_code)]

use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use thunderbolt::serve::agent::{AgentFuture, AgentProcess, Launcher, Started};
use thunderbolt_shared::close::AgentEnd;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream},
    sync::{watch, Notify, Semaphore},
    task::JoinHandle,
    time::Instant,
};

/// Pipe capacity of the fake agent and peer: a few lines, like a pipe's.
pub const PIPE: usize = 64 * 1024;

/// What happened, in order, with when (from the test's start).
#[derive(Clone, Default)]
pub struct Events(Arc<Log>);

#[derive(Default)]
/// What happened, and a wake-up for whoever waits on it.
pub struct Log {
    seen: Mutex<Vec<(Duration, String)>>,
    changed: Notify,
}

impl Events {
    pub fn push(&self, start: Instant, what: impl Into<String>) {
        self.0.seen.lock().unwrap().push((start.elapsed(), what.into()));
        self.0.changed.notify_waiters();
    }
    pub fn names(&self) -> Vec<String> {
        self.0.seen.lock().unwrap().iter().map(|(_, w)| w.clone()).collect()
    }
    pub fn at(&self, what: &str) -> Duration {
        self.0
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, w)| w == what)
            .unwrap_or_else(|| panic!("no event {what}"))
            .0
    }
    /// Waits until `what` has happened `n` times.
    pub async fn wait_for_count(&self, what: &str, n: usize) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.names().iter().filter(|e| *e == what).count() >= n {
                return;
            }
            changed.await;
        }
    }
}

/// The agent's side of its pipes, handed to a test's script.
pub struct AgentIo {
    pub stdin: BufReader<DuplexStream>,
    pub stdout: DuplexStream,
    /// Call to "exit" with a code; the pipes stay open as long as the script
    /// holds them (as when a process the agent started inherited them).
    pub exit: Box<dyn Fn(i32) + Send>,
}

pub type Script = Arc<dyn Fn(AgentIo) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// How the fake agent takes SIGTERM.
#[derive(Clone, Copy, PartialEq)]
pub enum OnTerm {
    Exits,
    Ignores,
}

/// Starts scripted in-memory agents (or fails to, with no script).
#[derive(Clone)]
pub struct FakeLauncher {
    script: Option<Script>,
    on_term: OnTerm,
    events: Events,
    start: Instant,
    /// The slot the session holds, to record whether it is still held.
    slots: Option<Arc<Semaphore>>,
    /// Agents started so far.
    pub starts: Arc<AtomicUsize>,
}

impl FakeLauncher {
    /// `slots`: the agent slot a session holds, to record at SIGTERM whether it
    /// is still held.
    pub fn new(
        script: Option<Script>,
        on_term: OnTerm,
        events: Events,
        start: Instant,
        slots: Option<Arc<Semaphore>>,
    ) -> Self {
        Self { script, on_term, events, start, slots, starts: Arc::default() }
    }
}

impl std::fmt::Debug for FakeLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeLauncher")
    }
}

impl Launcher for FakeLauncher {
    fn start(&self) -> std::io::Result<Started> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let Some(script) = self.script.clone() else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no such program"));
        };
        let (stdin_ours, stdin_agent) = tokio::io::duplex(PIPE);
        let (stdout_agent, stdout_ours) = tokio::io::duplex(PIPE);
        let (stderr_agent, stderr_ours) = tokio::io::duplex(PIPE);
        let (ended_tx, ended) = watch::channel(None::<AgentEnd>);
        let ended_tx = Arc::new(ended_tx);
        let exit_tx = ended_tx.clone();
        let (events, start) = (self.events.clone(), self.start);
        let io = AgentIo {
            stdin: BufReader::new(stdin_agent),
            stdout: stdout_agent,
            exit: Box::new(move |code| {
                events.push(start, format!("agent exited {code}"));
                exit_tx.send_if_modified(|e| e.is_none() && e.replace(AgentEnd::exited(code)).is_none());
            }),
        };
        let task = tokio::spawn(async move {
            let _stderr = stderr_agent;
            script(io).await;
        });
        Ok(Started {
            stdin: Box::new(stdin_ours),
            stdout: Box::new(stdout_ours),
            stderr: Some(Box::new(stderr_ours)),
            process: Box::new(FakeProcess { task, ended, ended_tx, launcher: self.clone() }),
        })
    }
    fn argv0(&self) -> String {
        "fake-agent".into()
    }
    fn redacted(&self) -> String {
        "fake-agent".into()
    }
}

struct FakeProcess {
    /// The script: the agent and whatever it started (aborting it closes every pipe it holds).
    task: JoinHandle<()>,
    ended: watch::Receiver<Option<AgentEnd>>,
    ended_tx: Arc<watch::Sender<Option<AgentEnd>>>,
    launcher: FakeLauncher,
}

impl FakeProcess {
    fn event(&self, what: &str) {
        self.launcher.events.push(self.launcher.start, what);
    }
    fn kill(&mut self, signal: i32) {
        self.task.abort();
        self.ended_tx.send_if_modified(|e| e.is_none() && e.replace(AgentEnd::signaled(signal)).is_none());
    }
}

impl AgentProcess for FakeProcess {
    fn id(&self) -> Option<u32> {
        Some(4242)
    }
    fn wait(&mut self) -> AgentFuture<'_, Option<AgentEnd>> {
        Box::pin(async move { self.ended.wait_for(Option::is_some).await.ok().and_then(|e| *e) })
    }
    fn try_wait(&mut self) -> Option<Option<AgentEnd>> {
        self.ended.borrow().map(Some)
    }
    fn terminate(&mut self, grace: Duration) -> AgentFuture<'_, ()> {
        Box::pin(async move {
            if self.ended.borrow().is_some() {
                return;
            }
            self.event(match &self.launcher.slots {
                Some(s) if s.available_permits() == 0 => "SIGTERM (slot held)",
                Some(_) => "SIGTERM (slot free)",
                None => "SIGTERM",
            });
            match self.launcher.on_term {
                OnTerm::Exits => self.kill(libc_sigterm()),
                OnTerm::Ignores => {
                    // As a real agent might, it can still exit on its own meanwhile.
                    let exited =
                        tokio::time::timeout(grace, self.ended.wait_for(Option::is_some)).await.is_ok();
                    if !exited {
                        self.event("SIGKILL");
                        self.kill(9);
                    }
                }
            }
        })
    }
    fn clean_up(&mut self) {
        self.event("group cleaned up");
        self.task.abort();
    }
}

fn libc_sigterm() -> i32 {
    15
}

pub fn script<F, Fut>(f: F) -> Option<Script>
where
    F: Fn(AgentIo) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Some(Arc::new(move |io| Box::pin(f(io))))
}

/// Echoes lines until its stdin ends, then exits 0 (its pipes close with it).
pub fn echo() -> Option<Script> {
    script(|mut io: AgentIo| async move {
        let mut line = String::new();
        while io.stdin.read_line(&mut line).await.unwrap_or(0) > 0 {
            io.stdout.write_all(line.as_bytes()).await.unwrap();
            line.clear();
        }
        (io.exit)(0);
    })
}

/// Holds its pipes open forever (a process it started inherited them).
pub async fn hold_forever<T>(_held: T) {
    std::future::pending::<()>().await
}
