//! Waiting for Ctrl-C or SIGTERM.

/// Resolves on the first Ctrl-C (SIGINT) or SIGTERM, naming which.
pub async fn terminated() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    tokio::select! {
        _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => "SIGTERM",
        _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => "Ctrl-C",
    }
}
