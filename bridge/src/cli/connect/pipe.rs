//! The session pump, once connected: a resumable connection is handed to
//! [`redial`](crate::cli::redial) (which keeps the session across losses);
//! a plain (`/0`) one is piped here, both directions at once, until the
//! bridge finishes its side and says how the agent ended. Our local side is
//! our stdio or a client we spawn (`-- <cmd…>`).
//!
//! Apart from dialing and from how an end is told: this is the loop a
//! session spends its life in, and what it waits for at its end.

use std::{process::Stdio, time::Duration};

use anyhow::{anyhow, bail, Context, Result};
use iroh::endpoint::{Connection, VarInt};
use thunderbolt_shared::{close, resume, Protocol, Target};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use super::ending::{agent_end, agent_result, describe_close, kept_warm, Interrupted};
use crate::{cli::redial, limits};

/// After the bridge finished its stream, how long we wait for it to say how the
/// agent ended. Ours closes about one round trip after our acknowledgement
/// (milliseconds; 5 s covers a starved machine); a bridge that predates the
/// close never does, and then the agent's end is unknown (taken as success,
/// as before).
const AGENT_END_WAIT: Duration = Duration::from_secs(5);

/// How long a local client whose stdin we closed gets to exit by itself.
const LOCAL_CLIENT_EXIT_WAIT: Duration = Duration::from_secs(5);

/// The local client gets its stdin closed (by the caller); it may exit by itself, briefly.
async fn wait_local_client(mut c: tokio::process::Child) {
    if tokio::time::timeout(LOCAL_CLIENT_EXIT_WAIT, c.wait()).await.is_err() {
        let _ = c.kill().await;
    }
}

/// Runs the two copy directions until the bridge finishes its side.
pub(super) async fn pipe(
    ep: &crate::net::ClientEndpoint,
    target: &Target,
    conn: &Connection,
    protocol: &Protocol,
    command: Vec<std::ffi::OsString>,
    settle: Duration,
    join: Option<resume::Control>,
) -> Result<()> {
    if join.is_some() && !conn.alpn().ends_with(resume::RESUME_ALPN_SUFFIX) {
        bail!("the bridge does not offer resumable sessions (it runs with --no-resume?): there is no session to join");
    }
    let (mut local_in, mut local_out, mut child): (
        Box<dyn AsyncRead + Unpin + Send>,
        Box<dyn AsyncWrite + Unpin + Send>,
        Option<tokio::process::Child>,
    ) = if command.is_empty() {
        (crate::cli::stdio::stdin(), crate::cli::stdio::stdout(), None)
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
    if conn.alpn().ends_with(resume::RESUME_ALPN_SUFFIX) {
        let finish =
            redial::run(ep, target, protocol, conn.clone(), local_in, local_out, &mut term, join).await;
        if let Some(c) = child.take() {
            wait_local_client(c).await;
        }
        return match finish? {
            redial::Finish::AgentEnded(end) => agent_result(end),
            redial::Finish::KeptWarm => Ok(()),
            redial::Finish::Left => {
                info!("left the session: it goes on for the other device(s) on it");
                Ok(())
            }
            redial::Finish::Interrupted(which) => Err(Interrupted(which).into()),
        };
    }
    let _path_log = crate::paths::log_changes(conn, conn.remote_id().fmt_short().to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| anyhow!(describe_close(&e, protocol)))?;
    let announce = |how: &str| info!(bridge = %conn.remote_id().fmt_short(), "connected ({how})");
    let mut announced = false;
    let mut ended: Option<close::AgentEnd> = None;
    // Told to stop (a signal): there is nothing more to wait for.
    let mut stopped = false;
    // Which signal, when one stopped us.
    let mut interrupted: Option<&'static str> = None;

    let outcome = {
        let upload = async {
            // Large reads: stdin is read on tokio's blocking pool, one hand-off per
            // read, and `copy`'s own buffer is 8 KiB.
            let mut local_in = tokio::io::BufReader::with_capacity(limits::READ_CHUNK, &mut local_in);
            let r = tokio::io::copy_buf(&mut local_in, &mut send).await;
            let _ = send.finish();
            r
        };
        let (first_data_tx, mut first_data) = tokio::sync::oneshot::channel::<()>();
        let download = async {
            let mut buf = vec![0u8; limits::READ_CHUNK];
            let mut first_data_tx = Some(first_data_tx);
            // A write per message (a bulk run in one): see `output`.
            let mut out = crate::cli::output::Messages::new(&mut local_out);
            loop {
                match recv.read(&mut buf).await {
                    Ok(Some(n)) => {
                        if let Some(tx) = first_data_tx.take() {
                            let _ = tx.send(());
                        }
                        out.chunk(&buf[..n]).await?;
                    }
                    Ok(None) => {
                        out.finish().await?;
                        return Ok::<_, anyhow::Error>(());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let settled = tokio::time::sleep(settle);
        tokio::pin!(upload, download, settled);
        let mut upload_done = false;
        let outcome = loop {
            tokio::select! {
                biased;
                r = &mut download => {
                    // After the agent's end was announced the stream has nothing more to give.
                    break if ended.is_some() { Ok(()) } else { r };
                }
                err = conn.closed(), if ended.is_none() => match agent_end(&err) {
                    // Sent after our acknowledgement of the last byte: the download finishes by itself.
                    Some(end) => ended = Some(end),
                    None if kept_warm(&err) => {
                        info!("done: the agent stays warm for the next connection");
                        stopped = true;
                        break Ok(());
                    }
                    None => break Err(anyhow!(describe_close(&err, protocol))),
                },
                r = &mut upload, if !upload_done => {
                    upload_done = true;
                    if let Err(e) = r {
                        debug!("upload ended: {e}");
                    }
                }
                _ = &mut first_data, if !announced => {
                    announced = true;
                    announce("the bridge answered");
                }
                _ = &mut settled, if !announced => {
                    announced = true;
                    announce("admitted");
                }
                which = term.recv() => {
                    info!("{which}: closing the connection");
                    stopped = true;
                    interrupted = Some(which);
                    break Ok(());
                }
            }
        };
        // A short session can get its first byte and its end in one poll of the
        // download, which ends the loop before the announcement branch runs.
        if !announced && first_data.try_recv().is_ok() {
            announce("the bridge answered");
        }
        outcome
    };
    if interrupted.is_some() {
        // Closed here, before `send` is dropped (which finishes the stream): an
        // agent that ends at its input's end (`cat`) would otherwise end the
        // session before the bridge reads why the client left.
        conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    }
    if outcome.is_ok() && ended.is_none() && !stopped && conn.close_reason().is_none() {
        // The stream ended: the bridge is about to say how the agent ended.
        match tokio::time::timeout(AGENT_END_WAIT, conn.closed()).await {
            Ok(err) => ended = agent_end(&err),
            Err(_) => debug!("the bridge did not say how the agent ended within {AGENT_END_WAIT:?}"),
        }
    }
    let _ = local_out.shutdown().await;
    if let Some(c) = child.take() {
        drop(local_out);
        wait_local_client(c).await;
    }
    // A refusal can race the stream: prefer the bridge's stated reason.
    if let (Err(_), Some(reason)) = (&outcome, conn.close_reason()) {
        if agent_end(&reason).is_none() {
            return Err(anyhow!(describe_close(&reason, protocol)));
        }
    }
    outcome?;
    if let Some(which) = interrupted {
        return Err(Interrupted(which).into());
    }
    agent_result(ended)
}
