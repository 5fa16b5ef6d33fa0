//! A bridge that lies once, for the tests of both clients (`thunderbolt
//! connect` and the browser's): it welcomes a new resumable session, takes
//! the client's first frame, closes the connection as a restarting bridge
//! that keeps the session does, and then answers the client's resumption
//! with the welcome of *another* session. A client must end the session
//! saying so, never take the other session for its own; both clients take
//! welcomes through `thunderbolt_shared::resume_client`, and this checks
//! that each does over a real connection.
//!
//! Prints `Ticket: <ticket>` then `Allow a peer: -` once listening (the
//! bridge's banner, as the test harnesses read it), `hello: <line>` for each
//! hello, and `closed: <how>` for how the client closed the second
//! connection; exits then.
//!
//! Usage: `wrong-welcome [--relay-url URL] [--protocol P]`

use std::time::Duration;

use anyhow::{bail, Context, Result};
use iroh::{endpoint::VarInt, SecretKey};
use iroh_tickets::endpoint::EndpointTicket;
use thunderbolt_shared::{
    close::{CLOSE_CODE_REFUSED, REASON_SESSION_KEPT},
    resume::{resume_alpn, Control, CONTROL_PREFIX},
    Protocol,
};
use thunderbolt_tests::loopback_endpoint;

/// How long the client may take for each step (a hello, its first frame,
/// its close): a test waits less.
const STEP: Duration = Duration::from_secs(60);
/// The welcome's grace: long enough for the client to come back.
const GRACE_MS: u64 = 30_000;
/// Longest line read (hellos and frames of a test are short).
const MAX_LINE: usize = 64 * 1024;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut relay, mut protocol) = (None, "acp".to_string());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--relay-url" => relay = Some(args.next().context("--relay-url needs a URL")?.parse()?),
            "--protocol" => protocol = args.next().context("--protocol needs a name")?,
            "-h" | "--help" => {
                println!("usage: wrong-welcome [--relay-url URL] [--protocol P]");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    let protocol: Protocol = protocol.parse()?;
    let ep =
        loopback_endpoint(SecretKey::generate(), relay.as_ref(), false, vec![resume_alpn(&protocol)]).await?;
    println!("Ticket: {}", EndpointTicket::new(ep.addr()));
    println!("Allow a peer: -");
    for (n, session) in ["the-first-session", "another-session"].into_iter().enumerate() {
        let incoming = tokio::time::timeout(STEP, ep.accept()).await?.context("endpoint closed")?;
        let conn = incoming.accept()?.await?;
        let (mut send, mut recv) = tokio::time::timeout(STEP, conn.accept_bi()).await??;
        let mut lines = Lines::default();
        let hello = lines.next(&mut recv).await?;
        println!("hello: {}", String::from_utf8_lossy(&hello).trim_end());
        let welcome = Control::Welcome { session: session.into(), received: 0, grace_ms: GRACE_MS };
        send.write_all(&welcome.encode()).await?;
        if n == 0 {
            // The client's first frame (control lines, such as acks, skipped).
            loop {
                let line = lines.next(&mut recv).await?;
                if line.first() != Some(&CONTROL_PREFIX) {
                    break;
                }
            }
            conn.close(VarInt::from_u32(CLOSE_CODE_REFUSED), REASON_SESSION_KEPT.as_bytes());
        } else {
            let how = tokio::time::timeout(STEP, conn.closed()).await?;
            println!("closed: {how}");
        }
    }
    ep.close().await;
    Ok(())
}

/// Whole lines off a stream.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    async fn next(&mut self, recv: &mut iroh::endpoint::RecvStream) -> Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                return Ok(self.buf.drain(..=i).collect());
            }
            if self.buf.len() > MAX_LINE {
                bail!("a line over {MAX_LINE} bytes");
            }
            let chunk = tokio::time::timeout(STEP, recv.read_chunk(MAX_LINE)).await??;
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c),
                None => bail!("the client finished its stream"),
            }
        }
    }
}
