//! `thunderbolt <protocol> connect <ticket|nodeid> [-- <cmd…>]`: dial a bridge and
//! pipe stdio (ours, or a spawned local client's) through one stream.
//!
//! Ends when the bridge finishes its side (the agent ended): the bridge then
//! says how the agent ended (close code 2), and we exit 0 only when it exited
//! with code 0, else non-zero with one line naming the code or the signal. If
//! the bridge refuses us, the reason it sent (`not allowlisted`, `bridge at
//! capacity`, …) is printed and we exit non-zero. We close with code 0 `client
//! closed` whenever we end first.

use std::{process::Stdio, time::Duration};

use anyhow::{anyhow, bail, Context, Result};
use iroh::{
    endpoint::{ConnectOptions, Connection, ConnectionError, VarInt},
    EndpointAddr, TransportAddr,
};
use thunderbolt_shared::{
    close::{self, is_alpn_refusal},
    pairing as pairing_wire, resume, words, EndpointTicket, Protocol, Target,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use crate::{cli::args::ConnectArgs, cli::redial, home::Home, identity, limits, net::Relays};

/// The longest listing a bridge may send (a few hundred bytes per session,
/// a few dozen sessions at most).
const MAX_LISTING: usize = 1 << 20;

/// How long the bridge may take to answer a listing once connected.
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// `thunderbolt sessions <ticket>`: the sessions of the bridge's agent this
/// device may join, one per line (or the bridge's JSON).
pub async fn sessions(home: &Home, args: crate::cli::args::SessionsArgs) -> Result<()> {
    use thunderbolt_shared::devices::Activity;
    let protocol: Protocol = args.protocol.parse().map_err(|e| anyhow!("--protocol: {e}"))?;
    let net = args.net.config()?;
    let target = with_relay_hint(args.target.parse()?, &net.relays);
    let (key, _) = identity::load_or_create(home, &Protocol::acp())?;
    not_ourselves(home, &target, &key, &protocol)?;
    let ep = net.bind(key, vec![], limits::IDLE_TIMEOUT).await?;
    let d = Dial { ep: &ep, target: &target, protocol: &protocol, net: &net };
    let result = list_sessions(d, args.dial_timeout, args.host).await;
    crate::net::close_endpoint(ep, CLOSE_FLUSH_TIMEOUT).await;
    let listing = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    if let Some(agents) = &listing.agents {
        let name = listing.host.as_deref().unwrap_or("the host");
        println!("{name}: {} agent(s) you reach", agents.len());
        for a in agents {
            println!(
                "  {} ({}, {}): thunderbolt {} connect {}",
                a.name, a.label, a.protocol, a.protocol, a.ticket
            );
        }
    } else if args.host {
        println!("(not a host of several agents, or an older version: this agent's sessions only)");
    }
    if listing.sessions.is_empty() {
        let of = if listing.agents.is_some() { "the host" } else { "this agent" };
        println!(
            "no session of {of} you may join (start one with `thunderbolt {protocol} connect <ticket>`)"
        );
        return Ok(());
    }
    let now = crate::devices::now_ms();
    let ago = |ms: u64| {
        let s = now.saturating_sub(ms) / 1000;
        match s {
            0..=59 => format!("{s}s"),
            60..=3599 => format!("{}m", s / 60),
            _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        }
    };
    for s in &listing.sessions {
        let attached: Vec<String> =
            s.attached.iter().map(|a| format!("{} ({})", a.device.label(), a.role.as_str())).collect();
        let mut state =
            if attached.is_empty() { s.state.clone() } else { format!("attached: {}", attached.join(", ")) };
        match s.activity {
            Some(Activity::Asking) => state.push_str("; needs an answer"),
            Some(Activity::Working) => state.push_str("; working"),
            Some(Activity::Idle) => state.push_str("; idle"),
            None => {}
        }
        println!(
            "{}  {}  started by {} {} ago; {}; last activity {} ago{}",
            s.id,
            s.agent,
            s.started_by.label(),
            ago(s.since_ms),
            state,
            ago(s.last_activity_ms),
            if s.acp_sessions.is_empty() {
                String::new()
            } else {
                format!("; ACP {}", s.acp_sessions.join(", "))
            }
        );
    }
    println!(
        "join one: thunderbolt {protocol} connect --attach <id> [--observe] [--history all|now] <ticket>"
    );
    Ok(())
}

/// Asks the bridge for its listing.
async fn list_sessions(
    d: Dial<'_>,
    dial_timeout: u64,
    host: bool,
) -> Result<thunderbolt_shared::devices::Listing> {
    let Dial { target, protocol, .. } = d;
    let conn = dial_one(d, &resume::resume_alpn(protocol), dial_timeout, || {
        anyhow!(
            "{} offers no resumable sessions (it runs with --no-resume, or predates them): nothing to join",
            target.id()
        )
    })
    .await?;
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&resume::Control::List { host }.encode()).await?;
        anyhow::Ok(recv.read_to_end(MAX_LISTING).await?)
    };
    let answer = tokio::time::timeout(LISTING_TIMEOUT, exchange).await;
    let refused = conn.close_reason();
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    let answer = match (answer, refused) {
        (Ok(Ok(a)), _) if !a.is_empty() => a,
        (_, Some(err)) => bail!("{}", describe_close(&err, protocol)),
        (Ok(Ok(_)), None) => {
            bail!("the bridge answered nothing: it does not list sessions (an older version?)")
        }
        (Ok(Err(e)), None) => bail!("the listing failed: {e:#}"),
        (Err(_), None) => bail!("the bridge did not answer within {LISTING_TIMEOUT:?}"),
    };
    serde_json::from_slice(answer.trim_ascii())
        .map_err(|e| anyhow!("the bridge's listing is unreadable: {e}"))
}

/// How long we wait for our close frame to reach the bridge on exit.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long closing may take when no connection was made: nothing needs
/// telling, so `--dial-timeout N` ends after about N seconds, not N plus the
/// seconds a dead connection attempt would drain for.
const UNREACHED_CLOSE_TIMEOUT: Duration = Duration::from_millis(100);

/// After the bridge finished its stream, how long we wait for it to say how the
/// agent ended. Ours closes about one round trip after our acknowledgement
/// (milliseconds; 5 s covers a starved machine); a bridge that predates the
/// close never does, and then the agent's end is unknown (taken as success,
/// as before).
const AGENT_END_WAIT: Duration = Duration::from_secs(5);

/// A refused connection is closed by the bridge right after the handshake, so
/// "connected" is only said once the bridge sent data or this many handshake
/// durations passed without a refusal (bounded both ways below).
const ADMISSION_SETTLE_FACTOR: u32 = 3;
const ADMISSION_SETTLE_MIN: Duration = Duration::from_millis(200);
const ADMISSION_SETTLE_MAX: Duration = Duration::from_secs(2);

/// Whether `err` is a warm agent's bridge ending our connection because we
/// are done (our input ended, all we asked was answered): the agent runs on.
pub fn kept_warm(err: &ConnectionError) -> bool {
    matches!(err, ConnectionError::ApplicationClosed(ac) if ac.error_code.into_inner() == close::CLOSE_CODE_KEPT_WARM as u64)
}

/// How the agent ended, when `err` is the bridge's close after the agent's last byte.
fn agent_end(err: &ConnectionError) -> Option<close::AgentEnd> {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            close::AgentEnd::from_close(ac.error_code.into_inner(), &ac.reason)
        }
        _ => None,
    }
}

/// Human text for a connection that ended with an error.
pub fn describe_close(err: &ConnectionError, protocol: &Protocol) -> String {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            let code = ac.error_code.into_inner();
            if let Some(end) = close::AgentEnd::from_close(code, &ac.reason) {
                return end.describe();
            }
            match close::Refusal::from_close(code, &ac.reason) {
                Some(r) => r.describe(),
                None => format!(
                    "the bridge closed the connection (code {}: {})",
                    ac.error_code,
                    String::from_utf8_lossy(&ac.reason)
                ),
            }
        }
        ConnectionError::ConnectionClosed(cc) if is_alpn_refusal(&cc.to_string()) => format!(
            "the peer does not serve {protocol} (ALPN {} was refused): is it {}?",
            String::from_utf8_lossy(&protocol.alpn()),
            protocol.with_article("bridge")
        ),
        ConnectionError::TimedOut => "the connection timed out (the bridge stopped answering)".into(),
        e => format!("connection lost: {e}"),
    }
}

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
                Ok(()) => dial_and_pipe(d, &client, args, &mut reached).await,
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

/// `dial`, given up early when it can only go through the relay and the
/// relay refused this device (the reason is then found by [`unreachable`]).
async fn relay_or_bust<T>(
    ep: &iroh::Endpoint,
    target: &Target,
    dial: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    if target.endpoint_addr().ip_addrs().next().is_some() {
        return dial.await;
    }
    tokio::select! {
        r = dial => r,
        _ = crate::net::relay_denied(ep) => Err(anyhow!("the relay refused this device")),
    }
}

/// What a dial is: from this endpoint, to that bridge, for a protocol, with
/// these network settings (what a failure's words are worked out from).
#[derive(Clone, Copy)]
struct Dial<'a> {
    ep: &'a iroh::Endpoint,
    target: &'a Target,
    protocol: &'a Protocol,
    net: &'a crate::net::NetConfig,
}

/// Why a dial failed (`err`: iroh's words, `None` for our own timeout), in
/// one line that says what to do.
async fn unreachable(d: Dial<'_>, secs: u64, err: Option<String>) -> anyhow::Error {
    let Dial { ep, target, protocol, net } = d;
    let id = target.id();
    let text = err.unwrap_or_default();
    if is_alpn_refusal(&text) {
        return anyhow!(
            "{id} does not serve {protocol} (ALPN {} refused): is it {}?",
            String::from_utf8_lossy(&protocol.alpn()),
            protocol.with_article("bridge")
        );
    }
    if words::is_identity_mismatch(&text) {
        return anyhow!(words::OTHER_IDENTITY);
    }
    // The relay turned this device away: nothing reaches the bridge through it.
    if let Some(why) = crate::net::relay_refusal(ep) {
        return anyhow!("{why}: ask its operator to allow this device ({}), or use another relay", ep.id());
    }
    let no_addr = target.endpoint_addr().addrs.is_empty();
    if no_addr && matches!(target, Target::Ticket(_)) {
        return anyhow!(words::NO_ADDRESS);
    }
    if no_addr {
        let discovery = if net.discovery == crate::net::Discovery::Off {
            "discovery is off (THUNDERBOLT_IROH_DISCOVERY=off)"
        } else {
            "discovery found none"
        };
        return anyhow!(
            "could not connect to {id}: a bare NodeId carries no address and {discovery}: use the \
             ticket from the bridge's banner, or --relay-url with the bridge's relay"
        );
    }
    let problem = crate::net::relay_problem(ep, net).await;
    let timed_out = text.is_empty() || text.to_ascii_lowercase().contains("timed out");
    if let (Some(p), true, Some(url)) = (&problem, timed_out, net.relays.urls().first()) {
        // Never out of this device at all: the page's words, then what we found.
        return anyhow!("{}; {p}", words::relay_unreachable(url.as_str()));
    }
    let relay = problem.map(|p| format!("; the relay: {p}")).unwrap_or_default();
    if timed_out {
        return anyhow!(
            "could not reach {id} within {secs}s: is the bridge running, and does the ticket carry a \
             reachable address or relay?{relay}"
        );
    }
    anyhow!("could not connect to {id}: {text}{relay}")
}

/// One connection with `alpn` for a one-off exchange (a pairing, a listing),
/// within `dial_timeout` seconds; a bridge that refuses the ALPN gets
/// `refused`'s words, any other failure [`unreachable`]'s.
async fn dial_one(
    d: Dial<'_>,
    alpn: &[u8],
    dial_timeout: u64,
    refused: impl FnOnce() -> anyhow::Error,
) -> Result<Connection> {
    let Dial { ep, target, .. } = d;
    let dial = tokio::time::timeout(
        Duration::from_secs(dial_timeout),
        relay_or_bust(ep, target, async {
            ep.connect(target.endpoint_addr(), alpn).await.map_err(anyhow::Error::from)
        }),
    );
    match dial.await {
        Err(_) => Err(unreachable(d, dial_timeout, None).await),
        Ok(Err(e)) if is_alpn_refusal(&format!("{e:#}")) => Err(refused()),
        Ok(Err(e)) => Err(unreachable(d, dial_timeout, Some(format!("{e:#}"))).await),
        Ok(Ok(c)) => Ok(c),
    }
}

/// How long the bridge may take to answer a pairing request once connected
/// (it writes two small files).
const PAIR_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Pairs this device with the bridge using a one-time code
/// ([`thunderbolt_shared::pairing`]), before connecting as usual.
async fn pair_first(d: Dial<'_>, code: &str, name: &str, dial_timeout: u64) -> Result<()> {
    let Dial { target, protocol, .. } = d;
    let conn = dial_one(d, &pairing_wire::pair_alpn(protocol), dial_timeout, || {
        anyhow!(
            "{} does not take pairing codes (it predates `iroh pair`, or is not {}): \
             run `thunderbolt iroh id` here and `thunderbolt iroh allow <that-nodeid>` there instead",
            target.id(),
            protocol.with_article("bridge")
        )
    })
    .await?;
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&pairing_wire::request(code, name)).await?;
        send.finish()?;
        let answer = recv.read_to_end(pairing_wire::MAX_PAIR_ANSWER).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(PAIR_ANSWER_TIMEOUT, exchange).await;
    // The bridge's refusal says why; it wins over however the stream ended.
    let refused = || match conn.close_reason() {
        Some(ConnectionError::ApplicationClosed(ac)) => {
            Some(String::from_utf8_lossy(&ac.reason).into_owned())
        }
        _ => None,
    };
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            let why = match refused() {
                Some(r) => r,
                None => match tokio::time::timeout(Duration::from_secs(1), conn.closed()).await {
                    Ok(ConnectionError::ApplicationClosed(ac)) => {
                        String::from_utf8_lossy(&ac.reason).into_owned()
                    }
                    _ => format!("{e:#}"),
                },
            };
            bail!("pairing refused: {why}{}", thunderbolt_shared::words::pairing_hint(&why).unwrap_or(""));
        }
        Err(_) => bail!("the bridge did not answer the pairing request within {PAIR_ANSWER_TIMEOUT:?}"),
    };
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(answer.trim_ascii())
        .map_err(|_| anyhow!("the bridge's pairing answer is unreadable"))?;
    if v["paired"] != true {
        bail!("the bridge did not pair this device (it answered {v})");
    }
    match v["name"].as_str() {
        Some(n) => info!("paired with {} as \"{n}\"", target.id().fmt_short()),
        None => info!("paired with {}", target.id().fmt_short()),
    }
    crate::cli::pair_cmd::tell_agents(&v, protocol);
    Ok(())
}

/// A bare NodeId carries no address. With relays of our own (`--relay-url`, e.g. a
/// self-hosted relay) the bridge is assumed to use them, as the browser client
/// does, so a NodeId dials without discovery; with n0's relays discovery finds it.
fn with_relay_hint(target: Target, relays: &Relays) -> Target {
    match (&target, relays) {
        (Target::NodeId(id), Relays::Custom(urls)) => Target::Ticket(EndpointTicket::new(
            EndpointAddr::new(*id).with_addrs(urls.iter().cloned().map(TransportAddr::Relay)),
        )),
        _ => target,
    }
}

async fn dial_and_pipe(
    d: Dial<'_>,
    client: &crate::net::ClientEndpoint,
    args: ConnectArgs,
    reached: &mut bool,
) -> Result<()> {
    let Dial { ep, target, protocol, .. } = d;
    let alpn = protocol.alpn();
    debug!(target = %target.id(), "dialing");
    let dial_started = tokio::time::Instant::now();
    let dial = async {
        if args.no_resume {
            return ep.connect(target.endpoint_addr(), &alpn).await.map_err(anyhow::Error::from);
        }
        // The resumable protocol first; a bridge without it picks the plain one.
        let opts = ConnectOptions::new().with_additional_alpns(vec![alpn.clone()]);
        let connecting =
            ep.connect_with_opts(target.endpoint_addr(), &resume::resume_alpn(protocol), opts).await?;
        Ok(connecting.await?)
    };
    let dial =
        tokio::time::timeout(Duration::from_secs(args.dial_timeout), relay_or_bust(ep, target, dial)).await;
    let conn = match dial {
        Err(_) => return Err(unreachable(d, args.dial_timeout, None).await),
        Ok(Err(e)) => return Err(unreachable(d, args.dial_timeout, Some(format!("{e:#}"))).await),
        Ok(Ok(c)) => c,
    };
    *reached = true;
    debug!(bridge = %conn.remote_id().fmt_short(), "handshake done");
    let settle =
        (dial_started.elapsed() * ADMISSION_SETTLE_FACTOR).clamp(ADMISSION_SETTLE_MIN, ADMISSION_SETTLE_MAX);
    let join = args.attach.as_ref().map(|id| resume::Control::Join {
        id: id.clone(),
        observe: args.observe,
        history: args.history.into(),
    });
    let result = pipe(client, target, &conn, protocol, args.command, settle, join).await;
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    result
}

/// How long a local client whose stdin we closed gets to exit by itself.
const LOCAL_CLIENT_EXIT_WAIT: Duration = Duration::from_secs(5);

/// The local client gets its stdin closed (by the caller); it may exit by itself, briefly.
async fn wait_local_client(mut c: tokio::process::Child) {
    if tokio::time::timeout(LOCAL_CLIENT_EXIT_WAIT, c.wait()).await.is_err() {
        let _ = c.kill().await;
    }
}

/// Runs the two copy directions until the bridge finishes its side.
async fn pipe(
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
        (super::stdio::stdin(), super::stdio::stdout(), None)
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
            let mut out = super::output::Messages::new(&mut local_out);
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

/// `connect` was stopped by a signal: it exits 130 (Ctrl-C) or 143 (SIGTERM),
/// as a shell reports a process ended by one, never 0 (0 means the agent's
/// work ended well).
#[derive(Debug, thiserror::Error)]
#[error("stopped by {0}")]
pub struct Interrupted(pub &'static str);

impl Interrupted {
    pub fn exit_code(&self) -> u8 {
        if self.0 == "SIGTERM" {
            128 + 15
        } else {
            128 + 2
        }
    }
}

/// Our exit for how the agent ended: success only for exit code 0 (or an
/// end the bridge did not describe, as older bridges' is).
fn agent_result(ended: Option<close::AgentEnd>) -> Result<()> {
    match ended {
        Some(end) if !end.is_success() => Err(anyhow!(end.describe())),
        Some(end) => {
            debug!("{}", end.describe());
            Ok(())
        }
        None => Ok(()),
    }
}
