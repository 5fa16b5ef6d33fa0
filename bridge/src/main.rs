//! `thunderbolt`: bridge a stdio coding agent (ACP or MCP) over iroh.
//!
//! See `thunderbolt --help` and the README. Logs go to stderr (`RUST_LOG`
//! adjusts them); the banner and command output go to stdout.

mod account;
mod acp_agent;
mod agent;
mod allowfile;
mod banner;
mod cli;
mod connect;
mod gate;
mod home;
mod hub;
mod identity;
mod iroh_cmd;
mod limits;
mod net;
mod pump;
mod reaper;
mod redact;
mod redial;
mod serve;
mod session;
mod signals;
mod throttle;
mod trust;
mod wss;

use std::{ffi::OsString, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{bail, Context, Result};
use clap::Parser;
use thunderbolt_shared::Protocol;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    agent::AgentCommand,
    cli::{Cli, Command, ProtocolAction, ProtocolCmd, ServeArgs},
    home::Home,
    serve::{Admission, Bridge},
    session::SessionConfig,
};

/// Default log filter: our own info lines, only warnings from the network stack.
const DEFAULT_LOG_FILTER: &str =
    "info,iroh=warn,noq=warn,noq_proto=warn,iroh_relay=warn,portmapper=warn,netwatch=warn";

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::ReapAgents) {
        return reaper::run_watcher();
    }
    init_logging(&cli);
    // reqwest (account backend) and iroh both use rustls with ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = limits::worker_threads(
        std::env::var_os("TOKIO_WORKER_THREADS").is_some(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    ) {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run(cli));
    // Do not wait for blocking tasks: a read of our stdin (`connect`) never
    // returns while stdin stays open, and everything we own is already ended.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // `acp serve` speaks JSON-RPC on stdout; logs must stay on stderr everywhere.
    let quiet = matches!(&cli.command, Command::Acp(ProtocolCmd { action: Some(ProtocolAction::Serve), .. }));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    if quiet {
        builder.with_max_level(tracing::Level::WARN).init();
    } else {
        builder.init();
    }
}

async fn run(cli: Cli) -> Result<()> {
    let home = Home::resolve(cli.home)?;
    match cli.command {
        Command::Acp(cmd) => protocol_cmd(&home, Protocol::acp(), cmd).await,
        Command::Mcp(cmd) => protocol_cmd(&home, Protocol::mcp(), cmd).await,
        Command::Iroh(cmd) => iroh_cmd::run(&home, cmd),
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
        Command::ReapAgents => Ok(()),
    }
}

fn login(home: &Home, a: cli::LoginArgs) -> Result<()> {
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
        Some(ProtocolAction::Connect(args)) => connect::run(home, protocol, args).await,
        Some(ProtocolAction::Serve) => {
            if protocol != Protocol::acp() {
                bail!("there is no built-in {protocol} server; give one after `--`");
            }
            acp_agent::serve(tokio::io::stdin(), tokio::io::stdout()).await
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

async fn serve_bridge(home: &Home, protocol: Protocol, args: ServeArgs) -> Result<()> {
    if args.transport == cli::Transport::Wss {
        return serve_wss(protocol, args).await;
    }
    if args.port.is_some() {
        bail!("--port is for --transport wss (iroh picks its own port; see --bind)");
    }
    let agent = agent_command(&protocol, args.command)?;
    agent.check_program().map_err(anyhow::Error::msg)?;
    let net = net::NetConfig::from_args(&args.net)?;
    let l = &args.limits;
    let admission = Admission {
        max_agents: l.max_agents,
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
    let gate_limits = gate::GateLimits {
        per_remote_max: l.per_remote_max,
        window: secs(l.per_remote_window, "--per-remote-window")?,
        max_keys: gate::MAX_KEYS,
        max_handshakes: l.max_handshakes,
    };
    let (key, origin) = identity::load_or_create(home, &protocol)?;
    let resume = if l.no_resume {
        None
    } else {
        let grace = secs(l.resume_grace, "--resume-grace")?;
        if grace.is_zero() {
            bail!("--resume-grace must be above zero (use --no-resume to switch resuming off)");
        }
        Some(hub::ResumeConfig { grace, buffer: l.resume_buffer })
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
    // The server's order decides (rustls picks its first ALPN the client
    // offers): r1 first, so a client offering both gets the resumable protocol.
    let mut alpns = Vec::new();
    if resume.is_some() {
        alpns.push(thunderbolt_shared::resume::resume_alpn(&protocol));
    }
    alpns.push(protocol.alpn());
    let endpoint = net.bind(key, alpns, idle_timeout).await?;
    let addr = net::reachable_addr(&endpoint, &net.relays).await;

    if let Err(e @ allowfile::AllowFileError::NotRegular { .. }) = allowfile::read(&home.allowlist_path()) {
        return Err(e.into());
    }
    let allow = Arc::new(allowfile::LiveAllowFile::new(home.allowlist_path()));
    let manual_peers = allow.current().ids.len();
    let account = start_account(home, endpoint.id(), &args.app).await;
    let mut layers: Vec<Arc<dyn trust::TrustPolicy>> = Vec::new();
    let account_status = match &account {
        Ok(a) => {
            layers.push(a.trust.clone());
            a.trust.status()
        }
        Err(why) => format!("off ({why})"),
    };
    layers.push(allow);
    let trust: Arc<dyn trust::TrustPolicy> = Arc::new(trust::Layered { layers });
    let app_url = args.app.app_url.clone();
    let banner = banner::Banner {
        protocol: &protocol,
        addr: &addr,
        new_identity: origin == identity::Origin::Created,
        command: &agent.redacted(),
        allow_file: &home.allowlist_path(),
        manual_peers,
        account_trust: &account_status,
        app_url: app_url.as_deref(),
        resume,
        keep_warm,
    };
    // Before the banner: a SIGTERM right after it must shut down cleanly.
    let term = signals::Terminate::new();
    print!("{}", banner.render());
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(term, stop.clone()));
    let gate = Arc::new(gate::Gate::new(gate_limits, Arc::new(gate::SystemClock)));
    reaper::start();
    let session = SessionConfig { max_frame: l.max_frame, resume, keep_warm, ..SessionConfig::new(agent) };
    let bridge = Bridge::new(endpoint, trust, gate, account.ok().map(Arc::new), admission, session);
    bridge.run(stop).await;
    info!("bridge stopped");
    Ok(())
}

/// `--transport wss`: the loopback WebSocket bridge.
async fn serve_wss(protocol: Protocol, args: ServeArgs) -> Result<()> {
    let agent = agent_command(&protocol, args.command)?;
    agent.check_program().map_err(anyhow::Error::msg)?;
    let l = &args.limits;
    if l.max_agents == 0 || l.max_agents > limits::MAX_COUNT_FLAG {
        bail!("--max-agents must be within 1..={}", limits::MAX_COUNT_FLAG);
    }
    let port = args.port.unwrap_or_else(|| wss::default_port(&protocol));
    let listener = wss::bind(port).await?;
    let addr = listener.local_addr()?;
    let token = wss::new_token();
    let origins = wss::origins(args.app.app_origin.as_deref());
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
    let session = SessionConfig { max_frame: l.max_frame, ..SessionConfig::new(agent) };
    let server = wss::WssServer {
        listener,
        token,
        origins,
        agents: Arc::new(tokio::sync::Semaphore::new(l.max_agents)),
        max_agents: l.max_agents,
        handshake_timeout: secs(l.handshake_timeout, "--handshake-timeout")?,
        session: Arc::new(session),
    };
    server.run(stop).await;
    info!("bridge stopped");
    Ok(())
}

/// Account trust, if a usable credential exists; else why it is off.
async fn start_account(
    home: &Home,
    own: iroh::EndpointId,
    app: &cli::AppArgs,
) -> std::result::Result<account::Account, String> {
    let timeout = Duration::try_from_secs_f64(app.backend_timeout)
        .map_err(|_| format!("invalid --backend-timeout {}", app.backend_timeout))?;
    let cred = account::load_credential(home, app.token.clone(), app.cloud_url.clone());
    let cred = match cred {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Err("no credential: set THUNDERBOLT_TOKEN and THUNDERBOLT_CLOUD_URL, or run \
                        `thunderbolt login`"
                .into())
        }
        Err(e) => {
            tracing::warn!("account trust is off: {e}");
            return Err(e.to_string());
        }
    };
    let backend = account::Backend::new(cred, timeout).map_err(|e| e.to_string())?;
    let a = account::Account::start(backend, own, &account::device_name()).await;
    if a.trust.is_enabled() {
        Ok(a)
    } else {
        Err(a.trust.status().trim_start_matches("off (").trim_end_matches(')').to_string())
    }
}

/// Ctrl-C or SIGTERM: stop accepting, end every session (agents killed), exit.
async fn stop_on_signal(mut term: signals::Terminate, stop: CancellationToken) {
    let which = term.recv().await;
    info!("{which}: shutting down");
    stop.cancel();
}
