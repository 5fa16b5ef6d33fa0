//! The command line: what each `thunderbolt` command does, built on the
//! library's serving core ([`crate::serve`]) and trust layers ([`crate::trust`]).

pub mod agents_cmd;
pub mod args;
pub mod banner;
pub mod connect;
pub mod control_cmd;
pub mod device_list;
pub mod devices_cmd;
pub mod iroh_cmd;
pub mod output;
pub mod pair_cmd;
pub mod redial;
pub mod share_cmd;
pub mod stdio;

use std::{ffi::OsString, sync::Arc, time::Duration};

use anyhow::{bail, Context, Result};
use thunderbolt_shared::Protocol;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    config::Config,
    home::Home,
    host::{plan::AgentPlan, HostContext},
    limits,
    serve::{agent::AgentCommand, gate, reaper, sessions, wss, Admission, Bridge},
    signals,
    trust::{account, allowfile},
};
use args::{Cli, Command, ProtocolAction, ProtocolCmd, ServeArgs};

/// Runs one parsed command line to its end.
pub async fn run(cli: Cli) -> Result<()> {
    let home = Home::resolve(cli.home)?;
    match cli.command {
        Command::Acp(cmd) => protocol_cmd(&home, Protocol::acp(), cmd).await,
        Command::Mcp(cmd) => protocol_cmd(&home, Protocol::mcp(), cmd).await,
        Command::Iroh(cmd) => iroh_cmd::run(&home, cmd),
        Command::Host(a) => agents_cmd::host(&home, a).await,
        Command::Agents(cmd) => agents_cmd::run(&home, cmd),
        Command::Status(a) => control_cmd::status(&home, a),
        Command::Kick(a) => control_cmd::kick(&home, a),
        Command::Devices(args::DevicesCmd::Scope(a)) => devices_cmd::scope(&home, a),
        Command::Share(a) => share_cmd::share(&home, a),
        Command::Sessions(a) => connect::sessions(&home, a).await,
        Command::Files(cmd) => connect::files(&home, cmd).await,
        Command::Note(a) => note(&home, a).await,
        Command::Reach(a) => {
            crate::reach::mcp::serve(crate::reach::client::ReachClient::new(&home), a.agent_name, a.channel)
                .await
        }
        Command::Service(cmd) => control_cmd::service(&home, cmd),
        Command::Login(a) => login(&home, a),
        Command::Logout => {
            let path = account::credential_path(&home);
            match std::fs::remove_file(&path) {
                Ok(()) => println!("removed {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("not logged in"),
                Err(e) => return Err(anyhow::anyhow!("cannot remove {}: {e}", path.display())),
            }
            Ok(())
        }
        Command::Adapt(a) => adapt(a).await,
        Command::ReapAgents => Ok(()),
    }
}

fn login(home: &Home, a: args::LoginArgs) -> Result<()> {
    let token = if a.token == "-" {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).context("cannot read the token from stdin")?;
        line.trim().to_string()
    } else {
        a.token
    };
    let path = account::store_credential(home, &a.cloud_url, &token)?;
    println!("stored the account credential in {} (bridges started from now on use it)", path.display());
    Ok(())
}

async fn protocol_cmd(home: &Home, protocol: Protocol, cmd: ProtocolCmd) -> Result<()> {
    match cmd.action {
        Some(ProtocolAction::Connect(args)) => connect::run(home, protocol, *args).await,
        Some(ProtocolAction::Serve) => {
            if protocol != Protocol::acp() {
                bail!("there is no built-in {protocol} server; give one after `--`");
            }
            crate::acp_agent::serve(tokio::io::stdin(), tokio::io::stdout()).await
        }
        None => serve_bridge(home, protocol, cmd.serve).await,
    }
}

/// The agent command to run per connection: the user's, or for ACP our built-in agent.
fn agent_command(protocol: &Protocol, argv: Vec<OsString>) -> Result<AgentCommand> {
    if let Some(cmd) = AgentCommand::new(argv) {
        return Ok(cmd);
    }
    if *protocol != Protocol::acp() {
        bail!(
            "`thunderbolt {protocol} --transport iroh` needs the server to run, after `--`, e.g.\n  \
             thunderbolt {protocol} --transport iroh -- npx -y @modelcontextprotocol/server-everything"
        );
    }
    let me = std::env::current_exe().context("cannot find our own executable for the built-in agent")?;
    Ok(AgentCommand::new(vec![me.into_os_string(), "acp".into(), "serve".into()]).expect("non-empty"))
}

fn secs(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid {what}: {v}"))
}

/// The bridge's [`Config`] from its flags, each checked with a message naming
/// the flag.
pub fn serve_config(args: &ServeArgs) -> Result<Config> {
    limits_config(&args.serving.limits, &args.serving.app)
}

/// The [`Config`] of these limit and app flags (the bridge's and the host's).
pub fn limits_config(l: &args::LimitArgs, app: &args::AppArgs) -> Result<Config> {
    let admission = Admission {
        max_agents: l.max_agents,
        max_per_device: limits::per_device_cap(l.max_agents),
        max_guests: limits::guests_cap(l.max_agents),
        handshake_timeout: secs(l.handshake_timeout, "--handshake-timeout")?,
        stream_open_timeout: secs(l.stream_open_timeout, "--stream-open-timeout")?,
        heartbeat: secs(l.heartbeat_interval, "--heartbeat-interval")?,
    };
    if admission.heartbeat.is_zero() {
        bail!("--heartbeat-interval must be above zero");
    }
    let idle_timeout = secs(l.idle_timeout, "--idle-timeout")?;
    if idle_timeout < limits::MIN_IDLE_TIMEOUT {
        bail!("--idle-timeout must be at least {}s", limits::MIN_IDLE_TIMEOUT.as_secs_f64());
    }
    for (flag, v) in [
        ("--max-agents", l.max_agents),
        ("--max-handshakes", l.max_handshakes),
        ("--per-remote-max", l.per_remote_max),
    ] {
        if v == 0 {
            bail!("{flag} must be at least 1 (0 would refuse every peer)");
        }
        if v > limits::MAX_COUNT_FLAG {
            bail!("{flag} {v} is more than this bridge allows ({})", limits::MAX_COUNT_FLAG);
        }
    }
    let gate = gate::GateLimits {
        per_remote_max: l.per_remote_max,
        window: secs(l.per_remote_window, "--per-remote-window")?,
        max_keys: limits::MAX_KEYS,
        max_handshakes: l.max_handshakes,
    };
    let resume = if l.no_resume {
        None
    } else {
        let grace = secs(l.resume_grace, "--resume-grace")?;
        if grace.is_zero() {
            bail!("--resume-grace must be above zero (use --no-resume to switch resuming off)");
        }
        Some(sessions::ResumeConfig { grace, buffer: l.resume_buffer })
    };
    let keep_warm = match l.keep_warm {
        None => None,
        Some(v) => {
            let d = secs(v, "--keep-warm")?;
            if d.is_zero() {
                bail!("--keep-warm must be above zero (leave it out to switch it off)");
            }
            Some(d)
        }
    };
    let backend_timeout = secs(app.backend_timeout, "--backend-timeout")?;
    Ok(Config {
        admission,
        gate,
        idle_timeout,
        max_frame: l.max_frame,
        resume,
        keep_warm,
        backend_timeout,
        journal: !l.no_journal,
        keep_files: l.keep_files,
        notify: None,
    })
}

/// `thunderbolt adapt`: a contract program or a webhook served as ACP.
async fn adapt(a: args::AdaptArgs) -> Result<()> {
    use crate::shapes::Shape;
    let shape = match a.shape.as_str() {
        "capture" => Shape::Capture(a.target),
        shape => {
            let url = a.target.first().map(|u| u.to_string_lossy().into_owned()).unwrap_or_default();
            let url = url::Url::parse(&url).with_context(|| format!("not a URL: {url}"))?;
            if shape == "relay" {
                Shape::Relay(url)
            } else {
                Shape::Webhook(url)
            }
        }
    };
    let timeout = Duration::try_from_secs_f64(a.timeout).context("--timeout is a number of seconds")?;
    let commands =
        a.commands.as_deref().map(serde_json::from_str).transpose().context("--commands is JSON")?;
    crate::shapes::serve(shape, a.name, timeout, commands).await
}

/// `thunderbolt note`: one message to the owner's devices, through the
/// running host's socket.
async fn note(home: &Home, a: args::NoteArgs) -> Result<()> {
    use crate::reach::client::{CallError, ReachClient};
    let text = if a.text == ["-"] {
        use std::io::Read;
        let mut t = String::new();
        std::io::stdin()
            .take(thunderbolt_shared::reach::MAX_TEXT as u64 + 1)
            .read_to_string(&mut t)
            .context("cannot read the message from stdin (it must be UTF-8 text)")?;
        t
    } else {
        a.text.join(" ")
    };
    let mut req = serde_json::json!({"op": "note", "from": a.from, "text": text});
    if let Some(d) = a.device {
        req["device"] = serde_json::json!(d);
    }
    match ReachClient::new(home).call(&req).await {
        Ok(v) => {
            let pushed = v["pushed"].as_u64().unwrap_or(0);
            println!(
                "sent {} in the thread '{}'; pushed to {pushed} device(s){}",
                v["id"].as_str().unwrap_or("?"),
                req["from"].as_str().unwrap_or_default(),
                if pushed == 0 { " (none takes notices now: it waits in the page's list)" } else { "" }
            );
            Ok(())
        }
        Err(e @ CallError::NotRunning { .. }) => {
            eprintln!("thunderbolt note: {e}");
            std::process::exit(3);
        }
        Err(CallError::Refused(why)) if why == "rate limited" => bail!(
            "rate limited: the host takes {} messages at once, then one every {} s; try again shortly",
            crate::reach::NOTE_BURST,
            crate::reach::NOTE_EVERY.as_secs()
        ),
        Err(e) => bail!("{e}"),
    }
}

/// Starts the notices these flags ask for; `None` when nothing would receive
/// one (`--no-push` and no `--notify-url`). A bad URL or contact stops the
/// start here, naming the flag.
pub fn start_notifier(home: &Home, a: &args::NotifyArgs) -> Result<Option<Arc<crate::notify::Notifier>>> {
    use crate::notify::{webhook::Webhook, Notifier, NotifyConfig};
    let webhook = a
        .notify_url
        .as_deref()
        .map(|u| Webhook::parse(u, a.notify_format))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let contact = a.notify_contact.trim();
    if !(contact.starts_with("mailto:") || contact.starts_with("https://")) {
        bail!("--notify-contact '{contact}' must be a mailto: or https: URL (push services use it to reach you)");
    }
    if a.no_push && webhook.is_none() {
        return Ok(None);
    }
    let config = NotifyConfig {
        always: a.notify_always,
        text: a.notify_text,
        push: !a.no_push,
        contact: contact.to_string(),
        webhook,
    };
    Ok(Some(Notifier::start(config, home)))
}

/// `thunderbolt <p> --transport iroh -- <agent>`: a host of one agent, made
/// in memory from the flags, started like `thunderbolt host` starts each of
/// its agents ([`HostContext::start_plan`]).
async fn serve_bridge(home: &Home, protocol: Protocol, args: ServeArgs) -> Result<()> {
    if args.transport == args::Transport::Wss {
        return serve_wss(protocol, args).await;
    }
    if args.port.is_some() {
        bail!("--port is for --transport wss (iroh picks its own port; see --bind)");
    }
    let agent = agent_command(&protocol, args.command.clone())?;
    agent.check_program().map_err(anyhow::Error::msg)?;
    let net = args.serving.net.config()?;
    let mut config = serve_config(&args)?;
    config.notify = start_notifier(home, &args.notify)?;
    // First: a second bridge of this protocol on this home stops here, naming the first.
    let control = crate::control::Control::bind(home, protocol.as_str())?;
    let credential = account_backend(home, &args.serving.app, config.backend_timeout);
    let ctx = HostContext::new(home.clone(), net, config.clone(), credential);
    let command = agent.redacted();
    // Before anything is registered with the account: an allow file that is
    // not a file stops the start here.
    if let Err(e @ allowfile::AllowFileError::File(allowfile::ReadError::NotRegular { .. })) =
        allowfile::read(&home.allowlist_path())
    {
        return Err(e.into());
    }
    let (served, started) = ctx.start_plan(&AgentPlan::single(&protocol, agent, &config)).await?;
    let banner = banner::Banner {
        protocol: &protocol,
        addr: &started.addr,
        new_identity: started.new_identity,
        command: &command,
        allow_file: &home.allowlist_path(),
        manual_peers: ctx.allow.current().ids.len(),
        account_trust: &started.account,
        app_url: args.serving.app.app_url.as_deref(),
        resume: config.resume,
        journal: config.journal,
        keep_warm: config.keep_warm,
        relay_problem: started.relay_problem.clone(),
        only_relay: ctx.net.relays.only_one().map(|u| u.to_string()),
        notify: crate::notify::Notifier::describe(config.notify.as_deref()),
    };
    let serving = Serving::start(home, &config, &banner.render(), "bridge", vec![served]);
    serving.run(control).await;
    info!("bridge stopped");
    Ok(())
}

/// `--transport wss`: the loopback WebSocket bridge.
async fn serve_wss(protocol: Protocol, args: ServeArgs) -> Result<()> {
    let agent = agent_command(&protocol, args.command.clone())?;
    agent.check_program().map_err(anyhow::Error::msg)?;
    let config = serve_config(&args)?;
    let port = args.port.unwrap_or_else(|| wss::default_port(&protocol));
    let listener = wss::bind(port).await?;
    let addr = listener.local_addr()?;
    let token = wss::new_token();
    let origins = wss::origins(args.serving.app.app_origin.as_deref());
    let term = signals::Terminate::new();
    // The one place the token is shown: the URL the user pastes into the app.
    println!("thunderbolt {protocol} bridge is listening on ws://{addr} (WebSocket, this machine only)");
    println!("  Agent:   {}", agent.redacted());
    println!("  Origins: {}", origins.join(", "));
    println!("  Paste into the app: ws://{addr}/?token={token}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(term, stop.clone()));
    reaper::start();
    // A WebSocket session ends with its socket: nothing to resume or keep warm.
    let session = Config { resume: None, keep_warm: None, ..config.clone() }.session(agent);
    let server = wss::WssServer {
        listener,
        token,
        origins,
        agents: Arc::new(tokio::sync::Semaphore::new(config.admission.max_agents)),
        max_agents: config.admission.max_agents,
        handshake_timeout: config.admission.handshake_timeout,
        session: Arc::new(session),
    };
    server.run(stop).await;
    info!("bridge stopped");
    Ok(())
}

/// The account backend of the credential the environment or `thunderbolt
/// login` gives; else why account trust is off.
pub(crate) fn account_backend(
    home: &Home,
    app: &args::AppArgs,
    timeout: Duration,
) -> std::result::Result<account::Backend, account::OffReason> {
    use account::OffReason;
    let cred = match account::load_credential(home, app.token.clone(), app.cloud_url.clone()) {
        Ok(Some(c)) => c,
        Ok(None) => return Err(OffReason::NoCredential),
        Err(e) => {
            tracing::warn!("account trust is off: {e}");
            return Err(OffReason::BadCredential(e.to_string()));
        }
    };
    account::Backend::new(cred, timeout).map_err(|e| OffReason::BadCredential(e.to_string()))
}

/// A bridge that has printed its banner and serves until a signal: the one
/// start-up path of `thunderbolt <p> --transport iroh` and `thunderbolt host`.
pub(crate) struct Serving {
    pub bridge: Bridge,
    /// Where the host asks the running bridge to add, change or remove agents.
    pub changes: tokio::sync::mpsc::UnboundedSender<crate::serve::Change>,
    pub stop: CancellationToken,
}

impl Serving {
    /// Prints `banner`, then serves `agents` (`kind`: what `status` says it is).
    pub fn start(
        home: &Home,
        config: &Config,
        banner: &str,
        kind: &'static str,
        agents: Vec<Arc<crate::serve::Served>>,
    ) -> Self {
        // The home's messages: the first process to take the socket serves
        // them. Taken before the banner, so whoever waits for it finds it.
        let reach = match crate::reach::socket::ReachSocket::bind(home) {
            Ok(Some(socket)) => {
                let door = agents.first().map(|a| crate::reach::Door {
                    node: a.endpoint.id().to_string(),
                    protocol: a.config().protocol.clone(),
                });
                let owner = match &door {
                    Some(d) if kind != "host" => format!("{kind} ({})", d.protocol),
                    _ => kind.to_string(),
                };
                let reach = crate::reach::Reach::new(home, config.notify.clone(), &owner);
                if let Some(d) = door {
                    reach.set_door(d);
                }
                reach.describe(socket.path());
                info!(
                    "messages to your devices: {} (thunderbolt note, thunderbolt reach)",
                    socket.path().display()
                );
                Some((reach, socket))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(
                    "messages are off: cannot serve {} ({e})",
                    crate::reach::socket::socket_path(home).display()
                );
                None
            }
        };
        // Before the banner: a SIGTERM right after it must shut down cleanly.
        let term = signals::Terminate::new();
        print!("{banner}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let stop = CancellationToken::new();
        tokio::spawn(stop_on_signal(term, stop.clone()));
        let reach = reach.map(|(reach, socket)| {
            tokio::spawn(socket.serve(reach.clone(), stop.clone()));
            reach
        });
        reaper::start();
        let gate = Arc::new(gate::Gate::new(config.gate.clone(), Arc::new(gate::SystemClock)));
        let (bridge, changes) = Bridge::serve(kind, gate, config.admission.clone(), agents);
        let on_revoked = config.notify.clone().map(|n| n as Arc<dyn crate::serve::taps::OnRevoked>);
        let journals = (config.journal && config.resume.is_some())
            .then(|| match crate::journal::Journals::open(home) {
                Ok(j) => Some(Arc::new(j)),
                Err(e) => {
                    tracing::warn!(
                        "sessions will not survive a restart: cannot use {}/sessions ({e})",
                        home.iroh_dir().display()
                    );
                    None
                }
            })
            .flatten();
        let bridge = bridge
            .with_home(home, config.keep_files)
            .on_revoked(on_revoked)
            .with_journals(journals)
            .with_reach(reach);
        Self { bridge, changes, stop }
    }

    /// Runs the bridge with its control API, telling a service manager it is
    /// ready (and, later, stopping), until a signal.
    pub async fn run(self, control: crate::control::Control) {
        let Self { bridge, stop, .. } = self;
        let api = tokio::spawn(control.serve(Arc::new(bridge.handle()), stop.clone()));
        let watchdog = tokio::spawn(crate::control::readiness::watchdog(stop.clone()));
        crate::control::readiness::ready();
        let stopping = {
            let stop = stop.clone();
            tokio::spawn(async move {
                stop.cancelled().await;
                crate::control::readiness::stopping();
            })
        };
        bridge.run(stop).await;
        let _ = api.await;
        watchdog.abort();
        let _ = stopping.await;
    }
}

/// Ctrl-C or SIGTERM: stop accepting, end every session (agents killed), exit.
pub(crate) async fn stop_on_signal(mut term: signals::Terminate, stop: CancellationToken) {
    let which = term.recv().await;
    info!("{which}: shutting down");
    stop.cancel();
}
