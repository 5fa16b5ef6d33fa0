//! Waiting for Ctrl-C or SIGTERM.
//!
//! Handlers are installed when [`Terminate::new`] runs, so callers create it
//! before announcing they are ready: a SIGTERM right after the banner must
//! trigger a clean shutdown, not the default kill.

use tokio::signal::unix::{signal, Signal, SignalKind};

pub struct Terminate {
    term: Option<Signal>,
    int: Option<Signal>,
}

// No `Default`: installing the handlers needs a running runtime, which a
// default value would hide.
#[allow(clippy::new_without_default)]
impl Terminate {
    pub fn new() -> Self {
        Self { term: signal(SignalKind::terminate()).ok(), int: signal(SignalKind::interrupt()).ok() }
    }

    /// Resolves on the next Ctrl-C (SIGINT) or SIGTERM, naming which.
    pub async fn recv(&mut self) -> &'static str {
        async fn next(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.term) => "SIGTERM",
            _ = next(&mut self.int) => "Ctrl-C",
        }
    }
}
