//! `thunderbolt <protocol> connect <ticket|nodeid> [-- <cmd…>]`: dial a bridge and
//! pipe stdio (ours, or a spawned local client's) through one stream.
//!
//! Ends when the bridge finishes its side (the agent ended): the bridge then
//! says how the agent ended (close code 2), and we exit 0 only when it exited
//! with code 0, else non-zero with one line naming the code or the signal. If
//! the bridge refuses us, the reason it sent (`not allowlisted`, `bridge at
//! capacity`, …) is printed and we exit non-zero. We close with code 0 `client
//! closed` whenever we end first.
//!
//! Here: the command itself (an endpoint bound, pairing first if asked, the
//! endpoint closed at the end). Its jobs, a file each:
//! - `dial`: reaching the bridge (the ALPN offered, why a dial failed, in
//!   words that say what to do) and handing the connection to the pump;
//! - `pipe`: the session pump: a resumable connection handed to
//!   [`redial`](crate::cli::redial), a plain (`/0`) one piped here;
//! - `ending`: how a session ended (the bridge's close, the agent's end, a
//!   signal) and the exit that follows;
//! - `listing`: `thunderbolt sessions`, the sessions this device may join;
//! - `pairing`: a one-time code exchanged before the first connection;
//! - `files`: `thunderbolt files put|get`, files to and from the workstation.

mod dial;
mod ending;
mod files;
mod listing;
mod pairing;
mod pipe;

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use thunderbolt_shared::{close, Protocol, Target};

use crate::{cli::args::ConnectArgs, home::Home, identity};
use dial::{dial_and_pipe, with_relay_hint, Dial};
pub use ending::{describe_close, kept_warm, Interrupted};
pub use files::files;
pub use listing::sessions;
use pairing::pair_first;

/// How long we wait for our close frame to reach the bridge on exit.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long closing may take when no connection was made: nothing needs
/// telling, so `--dial-timeout N` ends after about N seconds, not N plus the
/// seconds a dead connection attempt would drain for.
const UNREACHED_CLOSE_TIMEOUT: Duration = Duration::from_millis(100);

pub async fn run(home: &Home, protocol: Protocol, args: ConnectArgs) -> Result<()> {
    let net = args.net.config()?;
    let target = with_relay_hint(args.target.parse()?, &net.relays);
    // `connect` always dials with the ACP identity: the NodeId `iroh id` prints.
    let (key, _) = identity::load_or_create(home, &Protocol::acp())?;
    not_ourselves(home, &target, &key, &protocol)?;
    // Keep-alives and a short idle timeout: a dead path is noticed (and, when
    // resuming, redialed) in seconds.
    let idle = Duration::try_from_secs_f64(args.idle_timeout)
        .map_err(|_| anyhow!("invalid --idle-timeout: {}", args.idle_timeout))?;
    // Our own home relay dies too when the bridge's does: each endpoint of
    // ours looks for another at once. A redial after a relay's death goes
    // out from a fresh endpoint (see `ClientEndpoint`).
    let client = crate::net::ClientEndpoint::bind(&net, key, idle).await?;
    let ep = client.current();
    let mut reached = false;
    let d = Dial { ep: &ep, target: &target, protocol: &protocol, net: &net };
    let result = match args.pair.clone() {
        Some(code) => {
            let name = args.device_name.clone().unwrap_or_else(crate::trust::account::device_name);
            match pair_first(d, &code, &name, args.dial_timeout).await {
                Ok(pairing::Next::Connect) => dial_and_pipe(d, &client, args, &mut reached).await,
                Ok(pairing::Next::Done) => Ok(()),
                Ok(pairing::Next::Join { session, observe }) => {
                    let mut args = args;
                    args.attach = Some(session);
                    args.observe = observe;
                    dial_and_pipe(d, &client, args, &mut reached).await
                }
                Err(e) => Err(e),
            }
        }
        None => dial_and_pipe(d, &client, args, &mut reached).await,
    };
    // Refused as a stranger: say the one line that lets this device in.
    let result = result.map_err(|e| {
        if e.downcast_ref::<Interrupted>().is_none()
            && format!("{e:#}").ends_with(close::REASON_NOT_ALLOWLISTED)
        {
            // The page says the same (`words::closed`).
            anyhow!(
                "{}",
                thunderbolt_shared::words::closed(
                    close::CLOSE_CODE_REFUSED as u64,
                    close::REASON_NOT_ALLOWLISTED,
                    &ep.id().to_string()
                )
            )
        } else {
            e
        }
    });
    // Only a connection that reached the bridge has a close frame worth waiting for.
    let budget = if reached { CLOSE_FLUSH_TIMEOUT } else { UNREACHED_CLOSE_TIMEOUT };
    drop(ep);
    client.close(budget).await;
    result
}

/// A target with this home's own NodeId is this home's bridge: we dial with
/// the identity it serves under, and an endpoint cannot dial itself (iroh says
/// only `Connecting to ourself is not supported`). Said before dialing, with
/// what to do instead.
fn not_ourselves(home: &Home, target: &Target, key: &iroh::SecretKey, protocol: &Protocol) -> Result<()> {
    if target.id() != key.public() {
        return Ok(());
    }
    bail!(
        "this is the bridge of this very home ({}): connect dials with this home's identity, which is the \
         bridge's own, and nothing can dial itself. Connect from another home \
         (`THUNDERBOLT_HOME=<another folder> thunderbolt {protocol} connect <ticket>`, then allow or pair \
         that identity), or from the device that should reach this bridge",
        home.root_path().display()
    )
}
