//! Stdout as a stream of JSON-RPC lines, written by one task in the order
//! they are queued: the MCP server `thunderbolt reach` and the adapter
//! `thunderbolt adapt` answer from several tasks at once, and a line must
//! never interleave with another.

use serde_json::Value;
use tokio::{io::AsyncWriteExt, sync::mpsc, task::JoinHandle};

/// A queue of `depth` lines, and the task that writes them (it ends when
/// every sender is gone, or when stdout is closed).
pub fn stdout_lines(depth: usize) -> (mpsc::Sender<Value>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Value>(depth);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(v) = rx.recv().await {
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    (tx, writer)
}
