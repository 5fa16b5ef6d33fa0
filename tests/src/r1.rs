//! A raw client of the resumable protocol (`thunderbolt/<p>/r1`, specified in
//! `thunderbolt_shared::resume`), written by hand over an iroh connection: it
//! sends exactly the bytes a test asks for, so tests can play a well-behaved
//! client, a stale one, a silent one or a hostile one.

use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use thunderbolt_shared::resume::Control;

use crate::WAIT;

pub use crate::setup::{agent, Setup};

/// Opens a resumable stream: sends the hello, returns the stream and the
/// bridge's welcome (or how it closed the connection).
pub async fn hello(
    conn: &Connection,
    session: Option<&str>,
    received: u64,
) -> (SendStream, RecvStream, Result<(String, u64), (u64, String)>) {
    let h = Control::Hello { session: session.map(str::to_string), received };
    hello_raw(conn, &h.encode()).await
}

/// Like [`hello`], with `first` written as the client's first bytes (a
/// malformed hello, say), in one write.
pub async fn hello_raw(
    conn: &Connection,
    first: &[u8],
) -> (SendStream, RecvStream, Result<(String, u64), (u64, String)>) {
    let (mut send, recv) = conn.open_bi().await.unwrap();
    send.write_all(first).await.unwrap();
    welcome(conn, send, recv).await
}

/// Reads the bridge's first line: its welcome, or how it closed.
pub async fn welcome(
    conn: &Connection,
    send: SendStream,
    mut recv: RecvStream,
) -> (SendStream, RecvStream, Result<(String, u64), (u64, String)>) {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let got = tokio::time::timeout(WAIT, async {
        loop {
            match recv.read(&mut byte).await {
                Ok(Some(1)) if byte[0] == b'\n' => return Ok(()),
                Ok(Some(1)) => line.push(byte[0]),
                _ => return Err(()),
            }
        }
    })
    .await
    .expect("welcome or close in time");
    let res = match got {
        Ok(()) => match Control::parse(&line) {
            Ok(Some(Control::Welcome { session, received, .. })) => Ok((session, received)),
            other => panic!("expected a welcome, got {other:?}"),
        },
        Err(()) => Err(closed(conn).await),
    };
    (send, recv, res)
}

/// How the bridge closed `conn` (bounded by [`WAIT`]); panics on any other end.
pub async fn closed(conn: &Connection) -> (u64, String) {
    let err = tokio::time::timeout(WAIT, conn.closed()).await.expect("closed in time");
    crate::app_close(&err).unwrap_or_else(|| panic!("expected an application close, got {err:?}"))
}

/// The next frame from the bridge (control lines skipped), with its newline.
pub async fn next_frame(recv: &mut RecvStream, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(line) = next_line(buf) {
            if line[0] != b'!' {
                return line;
            }
            continue;
        }
        read_more(recv, buf).await;
    }
}

/// The next line from the bridge, control lines included.
pub async fn next_any(recv: &mut RecvStream, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(line) = next_line(buf) {
            return line;
        }
        read_more(recv, buf).await;
    }
}

fn next_line(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let i = buf.iter().position(|b| *b == b'\n')?;
    Some(buf.drain(..=i).collect())
}

async fn read_more(recv: &mut RecvStream, buf: &mut Vec<u8>) {
    let mut chunk = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(WAIT, recv.read(&mut chunk)).await.unwrap().unwrap().expect("stream open");
    buf.extend_from_slice(&chunk[..n]);
}

/// A connection lost without the client's close (any close but code 0 with
/// `client closed` reads as a loss).
pub fn lose(conn: &Connection) {
    conn.close(VarInt::from_u32(7), b"test: path lost");
}
