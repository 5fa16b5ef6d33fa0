//! `thunderbolt <protocol> connect <ticket|nodeid> [-- <cmd…>]`: dial a bridge and
//! pipe stdio (ours, or a spawned local client's) through one stream.
//!
//! Ends when the bridge finishes its side (the agent exited): we then close
//! with code 0 `client closed`. If the bridge refuses us, the reason it sent
//! (`not allowlisted`, `bridge at capacity`, …) is printed and we exit non-zero.

use std::{process::Stdio, time::Duration};

use anyhow::{anyhow, bail, Context, Result};
use iroh::endpoint::{Connection, ConnectionError, VarInt};
use thunderbolt_shared::{
    close::{self, is_alpn_refusal},
    Protocol, Target,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use crate::{cli::ConnectArgs, home::Home, identity, limits, net::NetConfig};

/// How long a dial may take by default: covers relay fallback and discovery on
/// a slow link; a user waiting longer than this wants an error.
pub const DEFAULT_DIAL_TIMEOUT_SECS: u64 = 30;

/// How long we wait for our close frame to reach the bridge on exit.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Human text for a connection that ended with an error.
pub fn describe_close(err: &ConnectionError, protocol: &Protocol) -> String {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            match close::Refusal::from_close(ac.error_code.into_inner(), &ac.reason) {
                Some(r) => format!("the bridge refused the connection: {r}"),
                None => format!(
                    "the bridge closed the connection (code {}: {})",
                    ac.error_code,
                    String::from_utf8_lossy(&ac.reason)
                ),
            }
        }
        ConnectionError::ConnectionClosed(cc) if is_alpn_refusal(&cc.to_string()) => format!(
            "the peer does not serve {protocol} (ALPN {} was refused): is it a {protocol} bridge?",
            String::from_utf8_lossy(&protocol.alpn())
        ),
        ConnectionError::TimedOut => "the connection timed out (the bridge stopped answering)".into(),
        e => format!("connection lost: {e}"),
    }
}

pub async fn run(home: &Home, protocol: Protocol, args: ConnectArgs) -> Result<()> {
    let target: Target = args.target.parse().context("invalid target")?;
    let net = NetConfig::from_args(&args.net)?;
    // `connect` always dials with the ACP identity: the NodeId `iroh id` prints.
    let (key, _) = identity::load_or_create(home, &Protocol::acp())?;
    let ep = net.bind(key, vec![]).await?;
    let result = dial_and_pipe(&ep, &target, &protocol, args).await;
    let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, ep.close()).await;
    result
}

async fn dial_and_pipe(
    ep: &iroh::Endpoint,
    target: &Target,
    protocol: &Protocol,
    args: ConnectArgs,
) -> Result<()> {
    let alpn = protocol.alpn();
    debug!(target = %target.id(), "dialing");
    let dial = tokio::time::timeout(
        Duration::from_secs(args.dial_timeout),
        ep.connect(target.endpoint_addr(), &alpn),
    )
    .await;
    let conn = match dial {
        Err(_) => bail!(
            "could not reach {} within {}s (is the bridge running, and does the ticket carry a \
             reachable address or relay?)",
            target.id(),
            args.dial_timeout
        ),
        Ok(Err(e)) => {
            let text = format!("{e:#}");
            let e = anyhow!(e.to_string());
            if is_alpn_refusal(&text) {
                bail!(
                    "{} does not serve {protocol} (ALPN {} refused): is it a {protocol} bridge?",
                    target.id(),
                    String::from_utf8_lossy(&alpn)
                );
            }
            return Err(anyhow!(e).context(format!("could not connect to {}", target.id())));
        }
        Ok(Ok(c)) => c,
    };
    info!(bridge = %conn.remote_id().fmt_short(), "connected");
    let result = pipe(&conn, protocol, args.command).await;
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    result
}

/// Runs the two copy directions until the bridge finishes its side.
async fn pipe(conn: &Connection, protocol: &Protocol, command: Vec<std::ffi::OsString>) -> Result<()> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| anyhow!(describe_close(&e, protocol)))?;
    let (mut local_in, mut local_out, mut child): (
        Box<dyn AsyncRead + Unpin + Send>,
        Box<dyn AsyncWrite + Unpin + Send>,
        Option<tokio::process::Child>,
    ) = if command.is_empty() {
        (Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout()), None)
    } else {
        let mut c = tokio::process::Command::new(&command[0]);
        c.args(&command[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true);
        let mut child =
            c.spawn().with_context(|| format!("failed to spawn '{}'", command[0].to_string_lossy()))?;
        let out = child.stdout.take().expect("piped");
        let inp = child.stdin.take().expect("piped");
        (Box::new(out), Box::new(inp), Some(child))
    };
    let mut term = crate::signals::Terminate::new();

    let outcome = {
        let upload = async {
            let r = tokio::io::copy(&mut local_in, &mut send).await;
            let _ = send.finish();
            r
        };
        let download = async {
            let mut buf = vec![0u8; limits::READ_CHUNK];
            loop {
                match recv.read(&mut buf).await {
                    Ok(Some(n)) => {
                        local_out.write_all(&buf[..n]).await?;
                        local_out.flush().await?;
                    }
                    Ok(None) => return Ok::<_, anyhow::Error>(()),
                    Err(e) => return Err(e.into()),
                }
            }
        };
        tokio::pin!(upload, download);
        let mut upload_done = false;
        let outcome = loop {
            tokio::select! {
                r = &mut upload, if !upload_done => {
                    upload_done = true;
                    if let Err(e) = r {
                        debug!("upload ended: {e}");
                    }
                }
                r = &mut download => break r,
                err = conn.closed() => break Err(anyhow!(describe_close(&err, protocol))),
                which = term.recv() => {
                    info!("{which}: closing the connection");
                    break Ok(());
                }
            }
        };
        outcome
    };
    let _ = local_out.shutdown().await;
    if let Some(mut c) = child.take() {
        // The local client gets its stdin closed; give it a moment to exit by itself.
        drop(local_out);
        if tokio::time::timeout(Duration::from_secs(5), c.wait()).await.is_err() {
            let _ = c.kill().await;
        }
    }
    // A refusal can race the stream: prefer the bridge's stated reason.
    if let (Err(_), Some(reason)) = (&outcome, conn.close_reason()) {
        return Err(anyhow!(describe_close(&reason, protocol)));
    }
    outcome
}
