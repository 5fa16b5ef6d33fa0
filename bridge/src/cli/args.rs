//! The command line, written to read like the manual.
//!
//! ```text
//! thunderbolt acp --transport iroh [-- <agent-cmd…>]     serve an ACP agent over iroh
//! thunderbolt acp --transport wss [--port N]             … or on a loopback WebSocket for the desktop app
//! thunderbolt mcp --transport iroh -- <server-cmd…>      serve an MCP server over iroh
//! thunderbolt acp connect <ticket|nodeid> [-- <cmd…>]     dial a bridge (stdio or a local client)
//! thunderbolt acp serve                                   the built-in ACP agent, on stdio
//! thunderbolt iroh id | pair | allow | deny | list        identity and the manual allow file
//! ```

use std::{ffi::OsString, net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::net::{Discovery, NetConfig, OnOff};

#[derive(Debug, Parser)]
#[command(
    name = "thunderbolt",
    version,
    about = "Bridge a coding agent on this machine to your apps, end-to-end encrypted over iroh",
    long_about = "Bridge a coding agent on this machine to your apps, end-to-end encrypted over iroh.\n\n\
        Every peer is authenticated by its NodeId (an ed25519 key proven in the QUIC handshake) \
        and admitted only if you allowed it (`thunderbolt iroh allow <nodeid>`). Each admitted \
        connection gets its own agent process, pumped over one stream as newline-delimited JSON.\n\n\
        Quick start:\n  thunderbolt acp --transport iroh                 # serve the built-in ACP agent\n  \
        thunderbolt acp --transport iroh -- my-agent --acp  # serve your own agent\n  \
        thunderbolt iroh allow <nodeid-of-the-other-side>\n\n\
        Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more. The bridge runs on half \
        the cores (at least one), leaving the rest to its agents; TOKIO_WORKER_THREADS=N overrides.",
    arg_required_else_help = true
)]
pub struct Cli {
    /// State directory: identity keys, the allow file, devices, agents.d [default:
    /// $THUNDERBOLT_HOME, else ~/.thunderbolt].
    // Not clap's `env`: an argument set from the environment counts as given, and
    // clap would print `--home <DIR>` in every usage line as if it were required.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve an ACP agent over iroh, or dial one (`acp connect`).
    Acp(ProtocolCmd),
    /// Serve an MCP server over iroh, or dial one (`mcp connect`).
    // There is no built-in MCP server: `serve` is ACP's only.
    #[command(mut_subcommand("serve", |c| c.hide(true)))]
    Mcp(ProtocolCmd),
    /// Identity and manual trust: id, pair, allow, deny, list.
    #[command(subcommand)]
    Iroh(IrohCmd),
    /// Serve every agent described in $THUNDERBOLT_HOME/agents.d/*.json, in one process.
    ///
    /// Each agent has its own NodeId and ticket (clients reach it as they reach a single-agent
    /// bridge, the Thunderbolt app included). The folder is watched: add, change or remove a
    /// manifest and the host follows within a second, no restart. `thunderbolt agents list`
    /// shows what it serves; `thunderbolt agents check FILE` what a manifest would run.
    Host(HostArgs),
    /// The agents the host serves: list them, or check a manifest.
    #[command(subcommand)]
    Agents(AgentsCmd),
    /// What the running bridge or host is doing: agents, relay health, every session.
    ///
    /// Asks the running process through its control socket (`$THUNDERBOLT_HOME/control-*.sock`).
    /// Exit code 0 with an answer; 3 when no bridge runs on this home.
    Status(StatusArgs),
    /// End sessions now: by session id (from `thunderbolt status`), NodeId or device name.
    ///
    /// The peer is closed with code 1 `ended by the host`, its agent ended and its slot freed;
    /// a resumable session cannot be resumed after. A device's id on a shared session
    /// (`<session>.<n>`, as `status` lists it) ends that device's attachment only; the others
    /// go on (a NodeId or device name also detaches that device from the sessions it joined).
    /// Exit code 1 when nothing matched, 3 when no bridge runs.
    Kick(KickArgs),
    /// The sessions of a bridge's agent this device may join (from a device, like `connect`).
    ///
    /// Your own, and those your other devices started when this is one of your own devices
    /// (account or paired). Join one with `thunderbolt acp connect --attach <id> <ticket>`.
    Sessions(SessionsArgs),
    /// Files between this device and a bridge's agent: put them on the workstation, get them back.
    ///
    /// Over the device's own connection to the agent (admitted like a session), checked against
    /// each file's BLAKE3 hash as the bytes arrive; run the same command again after a cut and
    /// only what is missing is sent.
    #[command(subcommand)]
    Files(FilesCmd),
    /// Let another person's device into one live session: a one-time code and link.
    ///
    /// Redeemed once, by one device (no account, no pairing): that device may join exactly this
    /// session, watching (--observe) or driving it too (--drive: prompt and answer), until the
    /// share ends (--for), and nothing else: no other session is listed or joinable, none is
    /// started, no notice is sent to it. `thunderbolt status` shows it on the session;
    /// `thunderbolt kick NAME` ends it at once, for good. Exit code 1 when SESSION is not a live
    /// resumable session here, 3 when no bridge runs.
    Share(ShareArgs),
    /// What each paired device may do: show or change its scope without pairing again.
    #[command(subcommand)]
    Devices(DevicesCmd),
    /// Send your devices a message from this machine (a cron job, a script, a build).
    ///
    /// Handed to the running host (or bridge) on `$THUNDERBOLT_HOME/reach.sock`, which pushes it,
    /// end to end encrypted, to your devices that take notices, and keeps it in the page's list in
    /// the thread of `--from`, where you can reply. At most 10 at once, then one every 10 s.
    /// Exit code 0 when it was taken, 1 when refused (rate limited, too long), 3 when no host runs.
    Note(NoteArgs),
    /// An MCP server (stdio) whose tools message your devices and read your replies.
    ///
    /// Add it to any MCP client: `claude mcp add thunderbolt -- thunderbolt reach`. Tools:
    /// `send_message(text, reply_to?)`, `get_replies(wait_s?)` (each reply returned once),
    /// `status()`. It needs a running host (or bridge) on this home; until one runs, each tool
    /// says so.
    Reach(ReachArgs),
    /// Run the host as a user service that survives the terminal and reboots (systemd, launchd).
    #[command(subcommand)]
    Service(ServiceCmd),
    /// Store an account credential so bridges trust your own devices automatically.
    ///
    /// Writes `$THUNDERBOLT_HOME/credentials.json` (0600). The token is sent as
    /// `Authorization: Bearer`. `THUNDERBOLT_TOKEN` + `THUNDERBOLT_CLOUD_URL` take precedence.
    Login(LoginArgs),
    /// Remove the stored account credential.
    Logout,
    /// Internal: an agent of another shape served as ACP on stdio (what a manifest's `capture`
    /// or `webhook` runs).
    #[command(hide = true)]
    Adapt(AdaptArgs),
    /// Internal: the watcher a bridge starts so no agent process outlives it.
    #[command(name = "reap-agents", hide = true)]
    ReapAgents,
}

#[derive(Debug, Args)]
pub struct ShareArgs {
    /// The session, by its id from `thunderbolt status`.
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// The guest watches: the session's history and live frames; its requests are refused.
    #[arg(long, conflicts_with = "drive", required_unless_present = "drive")]
    pub observe: bool,
    /// The guest drives too: it may prompt the agent and answer its questions.
    #[arg(long)]
    pub drive: bool,
    /// How long the share lasts from now (e.g. 30m, 1h, 8h; at most 366 days): then the guest is
    /// refused, and ended at once if it is on the session.
    #[arg(long = "for", default_value = "1h", value_name = "DURATION", value_parser = parse_scope_for)]
    pub for_: std::time::Duration,
    /// The name the guest's device gets here (`status`, `kick`); else the one it sends.
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
    /// How long the code may wait to be redeemed (at most the share's own --for).
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = crate::pairing::parse_duration)]
    pub expires: std::time::Duration,
    /// The app's base URL for the browser link.
    #[arg(long, env = "THUNDERBOLT_APP_URL", value_name = "URL")]
    pub app_url: Option<String>,
    /// Machine-readable output: the code, the link, the command line, the session, the end.
    #[arg(long)]
    pub json: bool,
    /// Do not draw the QR code.
    #[arg(long)]
    pub no_qr: bool,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Subcommand)]
pub enum DevicesCmd {
    /// Show or change what a device may do; running bridges apply it at once (a device that may
    /// no longer prompt is refused from its next request, one no longer admitted is ended).
    ///
    /// With no option it shows the scope. Options given replace those parts and keep the rest.
    /// Exit code 1 when NAME is no device known here.
    Scope(DevicesScopeArgs),
}

#[derive(Debug, Args)]
pub struct DevicesScopeArgs {
    /// The device: its name (`thunderbolt iroh list`) or NodeId.
    #[arg(value_name = "NAME")]
    pub device: String,
    /// What it may do, comma-separated: observe, prompt, answer, start, files, or all
    /// (see `thunderbolt iroh pair --help`).
    #[arg(long, value_name = "VERBS")]
    pub scope: Option<crate::devices::scope::Verbs>,
    /// Only these agents of the host (a manifest's name; a single-agent bridge is named by its
    /// protocol, `acp`); repeat it for several.
    #[arg(long, value_name = "NAME", conflicts_with = "all_agents")]
    pub agent: Vec<String>,
    /// Every agent that admits it again.
    #[arg(long)]
    pub all_agents: bool,
    /// Its access ends this long from now (e.g. 1h, 8h, 7d).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_scope_for, conflicts_with = "no_end")]
    pub for_: Option<std::time::Duration>,
    /// Its access does not end.
    #[arg(long)]
    pub no_end: bool,
    /// Everything again, everywhere, for good: as the owner.
    #[arg(long, conflicts_with_all = ["scope", "agent", "all_agents", "for_", "no_end"])]
    pub owner: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct NoteArgs {
    /// Who it is from: the thread it goes in (1–32 characters, one line; a name, not a credential).
    #[arg(long, value_name = "NAME", default_value = crate::reach::socket::DEFAULT_FROM)]
    pub from: String,
    /// Send it to this device only (a name from `thunderbolt iroh list`); default: all of yours.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// The message (at most 16 KiB); `-` reads it from stdin.
    #[arg(value_name = "TEXT", required = true, num_args = 1..)]
    pub text: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ReachArgs {
    /// The thread this server's messages go in (default: the MCP client's own name).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
    /// Be a Claude Code channel too: its permission prompts go to your devices (Allow, Deny), the
    /// verdict comes back, and what you type in the thread reaches the session (never as an
    /// approval). See docs/cli.md, "Your agent reaches you", for enabling it in Claude Code.
    #[arg(long)]
    pub channel: bool,
}

#[derive(Debug, Args)]
pub struct AdaptArgs {
    /// `capture` (a contract program per turn), `webhook` (a POST per turn) or `relay` (a POST
    /// per turn, the reply on the reach socket).
    #[arg(value_parser = ["capture", "webhook", "relay"])]
    pub shape: String,
    /// The agent's name (the contract's `agent`).
    #[arg(long)]
    pub name: String,
    /// A turn's bound, in seconds (for `relay`: the silence that fails a turn).
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// A relay agent's commands (the manifest's `commands`, as JSON).
    #[arg(long)]
    pub commands: Option<String>,
    /// The program and its arguments (capture), or the URL (webhook).
    #[arg(last = true, required = true)]
    pub target: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// Backend base URL (ends in `/v1`). https, or http only for a loopback backend.
    #[arg(long, value_name = "URL")]
    pub cloud_url: String,
    /// The token; `-` reads it from stdin (keeps it out of the process list and shell history).
    #[arg(long, value_name = "TOKEN")]
    pub token: String,
}

impl Command {
    /// Whether this runs a client of one bridge (`acp connect`, `mcp connect`):
    /// one connection and its standard input and output, nothing to spread
    /// over threads. `main` gives it a runtime on one thread (see there).
    pub fn dials(&self) -> bool {
        matches!(
            self,
            Command::Acp(ProtocolCmd { action: Some(ProtocolAction::Connect(_)), .. })
                | Command::Mcp(ProtocolCmd { action: Some(ProtocolAction::Connect(_)), .. })
        )
    }
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ProtocolCmd {
    #[command(subcommand)]
    pub action: Option<ProtocolAction>,

    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum ProtocolAction {
    /// Dial a bridge by ticket or NodeId and pipe stdin/stdout (or a local client's stdio) to it.
    ///
    /// Dials with the ACP identity (`$THUNDERBOLT_HOME/iroh/identity`): the NodeId printed by
    /// `thunderbolt iroh id` is the one the bridge must allow.
    Connect(Box<ConnectArgs>),
    /// Run the built-in ACP agent on stdin/stdout (what `acp --transport iroh` serves when
    /// no agent command is given).
    Serve,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Peer-to-peer QUIC via iroh, end-to-end encrypted, from anywhere (the default).
    Iroh,
    /// A WebSocket on 127.0.0.1 for the desktop app on this machine
    /// (`ws://127.0.0.1:<port>/?token=…`, printed at start).
    Wss,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// How peers reach this bridge.
    #[arg(long, value_enum, default_value = "iroh")]
    pub transport: Transport,

    /// With --transport wss: the loopback port (default 8839 for ACP, 8840 for MCP; 0 picks
    /// a free one).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,

    #[command(flatten)]
    pub serving: ServingArgs,

    /// The agent to run for each admitted connection, after `--`. For `acp`, omitting it serves
    /// the built-in agent (`thunderbolt acp serve`).
    #[arg(last = true, value_name = "AGENT-CMD")]
    pub command: Vec<OsString>,

    // Last: its help heading would otherwise cover the arguments after it.
    #[command(flatten)]
    pub notify: NotifyArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Machine-readable output: `{"bridges": [ … ]}`, one entry per running bridge or host.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct KickArgs {
    /// A session id (as `thunderbolt status` shows it), a device's id on a shared session
    /// (`<session>.<n>`), a NodeId, or a device name.
    #[arg(value_name = "SESSION|NODEID|NAME")]
    pub target: String,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCmd {
    /// Write the unit (systemd user unit on Linux, LaunchAgent on macOS) and start it.
    Install(ServiceArgs),
    /// Stop the service and remove its unit.
    Uninstall(ServiceArgs),
    /// Whether it is installed, and what the service manager says of it.
    Status(ServiceArgs),
}

#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// Print what would be written or done, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The service manager to write for (default: this machine's).
    #[arg(long = "for", value_enum, value_name = "MANAGER")]
    pub manager: Option<crate::control::service::Manager>,
}

#[derive(Debug, Args)]
pub struct HostArgs {
    #[command(flatten)]
    pub serving: ServingArgs,

    #[command(flatten)]
    pub notify: NotifyArgs,
}

/// What every serving command takes: how it is reached, its limits, the app
/// and account it works with.
#[derive(Debug, Args)]
pub struct ServingArgs {
    #[command(flatten)]
    pub net: NetArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub app: AppArgs,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCmd {
    /// Every manifest in agents.d: name, label, protocol, NodeId, ticket, and whether it
    /// loads (or why it is refused).
    List(AgentsListArgs),
    /// Check one manifest and print exactly what it would run (argv, cwd, environment with
    /// secret-looking values masked). Exit code 1 when it is refused.
    Check(AgentsCheckArgs),
}

#[derive(Debug, Args)]
pub struct AgentsListArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Print this agent's ticket as a QR code.
    #[arg(long, value_name = "NAME")]
    pub qr: Option<String>,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct AgentsCheckArgs {
    /// The manifest file.
    #[arg(value_name = "FILE")]
    pub file: std::path::PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The bridge: an `endpoint…` ticket, or a 64-character hex NodeId.
    #[arg(value_name = "TICKET|NODEID")]
    pub target: String,

    /// How long to wait for the connection before giving up, in seconds.
    #[arg(long, default_value_t = crate::limits::DEFAULT_DIAL_TIMEOUT_SECS, value_name = "SECS")]
    pub dial_timeout: u64,

    /// Offer only thunderbolt/<p>/0: a lost connection ends the session. By default the
    /// resumable protocol (thunderbolt/<p>/r1) is offered first, and a lost connection is redialed
    /// and the session carried on, every message delivered once and in order (bridges without
    /// it are served the plain protocol).
    #[arg(long)]
    pub no_resume: bool,

    /// Pair first with this one-time code (from `thunderbolt iroh pair` on the bridge's machine),
    /// then connect. Once paired, later connections need no code.
    #[arg(long, value_name = "CODE")]
    pub pair: Option<String>,

    /// With --pair: the name this device asks to be saved under (default: this machine's
    /// hostname). `iroh pair --name` on the bridge's side wins over it.
    #[arg(long, value_name = "LABEL", requires = "pair")]
    pub device_name: Option<String>,

    /// Join a session another of your devices started (or one of yours), by its id from
    /// `thunderbolt sessions <ticket>`, instead of starting one. As its controller by default:
    /// your frames go to the agent, and the device that had control becomes an observer.
    #[arg(long, value_name = "SESSION", conflicts_with_all = ["no_resume", "pair"])]
    pub attach: Option<String>,

    /// With --attach: join as an observer. You see every frame; your requests are refused
    /// (a JSON-RPC error naming the role), your answers to the agent's questions go on.
    #[arg(long, requires = "attach")]
    pub observe: bool,

    /// With --attach: `all` replays the session from its start (as far as the bridge keeps it),
    /// `now` shows only what comes next.
    #[arg(long, value_enum, requires = "attach", default_value = "all", value_name = "all|now")]
    pub history: HistoryArg,

    /// Seconds of silence after which the connection is taken for lost (then redialed when
    /// resuming). Keep-alives flow every 3 s (every third of this when shorter). At least 0.3.
    #[arg(long, default_value_t = crate::limits::IDLE_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub idle_timeout: f64,

    #[command(flatten)]
    pub net: NetArgs,

    /// A local client to spawn and connect to the bridge through its stdin/stdout, after `--`.
    #[arg(last = true, value_name = "LOCAL-CLIENT-CMD")]
    pub command: Vec<OsString>,
}

/// What a device joining a session is sent of its past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HistoryArg {
    /// The session from its start.
    All,
    /// Only what comes next.
    Now,
}

impl From<HistoryArg> for thunderbolt_shared::devices::History {
    fn from(h: HistoryArg) -> Self {
        match h {
            HistoryArg::All => Self::All,
            HistoryArg::Now => Self::Now,
        }
    }
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// The bridge (or the host's agent): an `endpoint…` ticket, or a 64-character hex NodeId.
    #[arg(value_name = "TICKET|NODEID")]
    pub target: String,

    /// The protocol the agent speaks.
    #[arg(long, default_value = "acp", value_name = "acp|mcp")]
    pub protocol: String,

    /// Machine-readable output: the bridge's `{"sessions": [ … ]}` as it sent it.
    #[arg(long)]
    pub json: bool,

    /// Every agent of the host the ticket's agent runs on: the sessions of
    /// each that you may join, and the agents you reach (one round trip).
    #[arg(long)]
    pub host: bool,

    /// How long to wait for the connection before giving up, in seconds.
    #[arg(long, default_value_t = crate::limits::DEFAULT_DIAL_TIMEOUT_SECS, value_name = "SECS")]
    pub dial_timeout: u64,

    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Subcommand)]
pub enum FilesCmd {
    /// Put files on the workstation. Prints one JSON receipt line per file: `name`, `size`,
    /// `hash` (BLAKE3), `uri` (the `file://` URI on the workstation, for a prompt's
    /// `resource_link`), and `sent` (bytes this run moved).
    ///
    /// Files land in $THUNDERBOLT_HOME/files/<agent>/<device>/<session>/ on the workstation
    /// (0600 files, 0700 folders), under their own name (`name (2).ext` when another file holds
    /// it). Exit code 0 when every file arrived, 1 otherwise.
    Put(FilesPutArgs),
    /// Get a file from the workstation by its `file://` URI (from a receipt, or a path the agent
    /// named inside its workspace). Prints one JSON line: `name`, `size`, `hash`, `path`,
    /// `received` (bytes this run moved).
    ///
    /// Only files inside the agent's working folder or this device's own files folder, and
    /// never a key's place (`.ssh`, `.gnupg`, …). A cut transfer leaves OUT.part beside OUT:
    /// run the command again to resume it.
    Get(FilesGetArgs),
}

#[derive(Debug, Args)]
pub struct FilesPutArgs {
    /// The bridge (or the host's agent): an `endpoint…` ticket, or a 64-character hex NodeId.
    #[arg(value_name = "TICKET|NODEID")]
    pub target: String,

    /// The files to put.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<std::path::PathBuf>,

    /// The session the files belong to (its id from `thunderbolt sessions`, or its ACP
    /// session id): they land in its own folder, which goes with the session when it ends
    /// (unless the bridge runs with --keep-files).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,

    #[command(flatten)]
    pub dial: FilesDialArgs,
}

#[derive(Debug, Args)]
pub struct FilesGetArgs {
    /// The bridge (or the host's agent): an `endpoint…` ticket, or a 64-character hex NodeId.
    #[arg(value_name = "TICKET|NODEID")]
    pub target: String,

    /// The file on the workstation: `file:///…`.
    #[arg(value_name = "URI")]
    pub uri: String,

    /// Where to write it (default: its name, in this folder). An existing OUT with other
    /// content is not replaced.
    #[arg(value_name = "OUT")]
    pub out: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub dial: FilesDialArgs,
}

/// How `files` reaches the bridge.
#[derive(Debug, Args)]
pub struct FilesDialArgs {
    /// The protocol the agent speaks.
    #[arg(long, default_value = "acp", value_name = "acp|mcp")]
    pub protocol: String,

    /// How long to wait for the connection before giving up, in seconds.
    #[arg(long, default_value_t = crate::limits::DEFAULT_DIAL_TIMEOUT_SECS, value_name = "SECS")]
    pub dial_timeout: u64,

    #[command(flatten)]
    pub net: NetArgs,
}

/// Network knobs. Defaults are what a user on the internet wants; tests and
/// offline setups turn everything public off.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Relay server URL(s), comma-separated, replacing the public relays; or `disabled` for
    /// direct addresses only. Default: n0's public relays.
    #[arg(long = "relay-url", env = "THUNDERBOLT_IROH_RELAY_URL", value_name = "URLS|disabled")]
    pub relay: Option<String>,

    /// Address discovery: `n0` publishes and resolves NodeIds through n0's DNS; `off` relies on
    /// tickets alone.
    #[arg(long, env = "THUNDERBOLT_IROH_DISCOVERY", value_enum, default_value = "n0")]
    pub discovery: Discovery,

    /// Ask the LAN gateway (UPnP/PCP/NAT-PMP) for a port mapping.
    #[arg(long, env = "THUNDERBOLT_IROH_PORTMAPPER", value_enum, default_value = "on")]
    pub portmapper: OnOff,

    /// Socket address to bind (e.g. 127.0.0.1:0). Default: all interfaces, random port.
    #[arg(long, env = "THUNDERBOLT_IROH_BIND", value_name = "ADDR")]
    pub bind: Option<SocketAddr>,

    /// Extra CA certificate(s) (PEM) to trust for relays, e.g. a self-hosted relay with a
    /// private certificate. Added to the built-in roots.
    #[arg(long, env = "THUNDERBOLT_IROH_RELAY_CA", value_name = "PEM-FILE")]
    pub relay_ca: Option<std::path::PathBuf>,
}

impl NetArgs {
    /// The network settings these flags describe.
    pub fn config(&self) -> anyhow::Result<NetConfig> {
        Ok(NetConfig {
            relays: crate::net::Relays::parse(self.relay.as_deref())?,
            discovery: self.discovery,
            portmapper: self.portmapper,
            bind: self.bind,
            relay_ca: match &self.relay_ca {
                Some(p) if !p.as_os_str().is_empty() => crate::net::load_ca(p)?,
                _ => Vec::new(),
            },
        })
    }
}

/// The account backend and the app, as the environment usually gives them.
#[derive(Debug, Clone, Args)]
pub struct AppArgs {
    /// Account backend base URL (ends in `/v1`), with THUNDERBOLT_TOKEN: bridges then trust
    /// your own devices automatically. Takes precedence over `thunderbolt login`'s stored
    /// credential.
    #[arg(long, env = "THUNDERBOLT_CLOUD_URL", value_name = "URL")]
    pub cloud_url: Option<String>,

    /// Account token for the backend (a personal access token, sent as `x-api-key`). Prefer the
    /// environment variable or `thunderbolt login`: a flag shows in the process list.
    #[arg(long = "account-token", env = "THUNDERBOLT_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Seconds each call to the account backend may take.
    #[arg(
        long,
        env = "THUNDERBOLT_BACKEND_TIMEOUT_SECS",
        default_value_t = crate::limits::BACKEND_TIMEOUT.as_secs_f64(),
        value_name = "SECS"
    )]
    pub backend_timeout: f64,

    /// The app's base URL, for the pairing hint in the banner (`<app>/settings/agents`).
    #[arg(long, env = "THUNDERBOLT_APP_URL", value_name = "URL")]
    pub app_url: Option<String>,

    /// With --transport wss: more allowed origins (comma-separated), besides the desktop app's.
    #[arg(long, env = "THUNDERBOLT_APP_ORIGIN", value_name = "ORIGINS")]
    pub app_origin: Option<String>,
}

/// Notices to you when an agent needs an answer or finished its turn while no device is
/// attached: Web Push to the browsers that subscribed (on by default), and a URL of yours.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Notices (an agent needs an answer or finished while no device is attached)")]
pub struct NotifyArgs {
    /// Also POST each notice here: a webhook (a small JSON document) or an ntfy topic URL
    /// (with --notify-format ntfy). https, or http to this machine only.
    #[arg(long, env = "THUNDERBOLT_NOTIFY_URL", value_name = "URL")]
    pub notify_url: Option<String>,

    /// What --notify-url receives: `json` (the notice as JSON) or `ntfy` (ntfy's plain-text
    /// form, the title in a header).
    #[arg(long, value_enum, default_value = "json", value_name = "FORMAT")]
    pub notify_format: crate::notify::webhook::Format,

    /// Notify while a device is attached too (by default only while none is: a resumable
    /// session whose client is away, a warm agent between connections).
    #[arg(long)]
    pub notify_always: bool,

    // How much notices say: `--notify-bare` (Web Push names the event only) and
    // `--notify-text` (--notify-url's say what is asked or done too). Named for the flag it
    // grew from: the notifier's config takes it as its `text`.
    #[command(flatten)]
    pub notify_text: crate::notify::words::Wording,

    /// No Web Push: browsers cannot subscribe, and none is sent.
    #[arg(long)]
    pub no_push: bool,

    /// The contact (mailto: or https:) push services see with this bridge's Web Push key.
    #[arg(long, default_value = crate::notify::DEFAULT_CONTACT, value_name = "MAILTO|URL")]
    pub notify_contact: String,
}

/// Admission limits. Defaults are the contract's; operators and tests may change them.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Most agent processes alive at once; further peers are refused with `bridge at capacity`.
    #[arg(long, default_value_t = crate::limits::MAX_LIVE_AGENTS, value_name = "N")]
    pub max_agents: usize,

    /// Longest message (one ndjson line, without its newline) forwarded in either direction, in
    /// bytes (suffixes K, M, G for KiB, MiB, GiB). A longer line costs only itself: it is skipped
    /// without being buffered and whoever waits for it gets a JSON-RPC error. Memory: a session
    /// holds at most about this much per direction for an unfinished line.
    #[arg(long, default_value = "32M", value_name = "BYTES", value_parser = frame_size)]
    pub max_frame: usize,

    /// Seconds an admitted peer has to open its stream before `idle: no data stream opened`.
    #[arg(long, default_value_t = crate::limits::STREAM_OPEN_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub stream_open_timeout: f64,

    /// Seconds of silence after which a peer is taken for gone (a client killed without closing,
    /// or whose network vanished): its session ends, or waits for it (--resume-grace).
    /// Keep-alives flow every 3 s (every third of this when shorter). At least 0.3.
    #[arg(long, default_value_t = crate::limits::IDLE_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub idle_timeout: f64,

    /// Seconds a QUIC handshake may take before the connection is dropped.
    #[arg(long, default_value_t = crate::limits::HANDSHAKE_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub handshake_timeout: f64,

    /// Most QUIC handshakes in flight at once; further connection attempts are dropped unanswered.
    #[arg(long, default_value_t = crate::limits::MAX_HANDSHAKES, value_name = "N")]
    pub max_handshakes: usize,

    /// Connection attempts one remote (EndpointId on a relay path, else IP) may make per window.
    #[arg(long, default_value_t = crate::limits::PER_REMOTE_MAX, value_name = "N")]
    pub per_remote_max: usize,

    /// The sliding window for --per-remote-max, in seconds.
    #[arg(long, default_value_t = crate::limits::PER_REMOTE_WINDOW.as_secs_f64(), value_name = "SECS")]
    pub per_remote_window: f64,

    /// Seconds between heartbeats: refresh the account allowlist and close sessions no longer allowed.
    #[arg(long, default_value_t = crate::limits::HEARTBEAT_INTERVAL.as_secs_f64(), value_name = "SECS")]
    pub heartbeat_interval: f64,

    /// Seconds a resumable session (clients that offer ALPN thunderbolt/<p>/r1, like
    /// `thunderbolt acp connect`) keeps its agent running after its connection was lost without
    /// the client closing it, for the client to come back and carry on. Output the agent writes
    /// meanwhile is kept (see --resume-buffer). Clients of thunderbolt/<p>/0 are not affected.
    #[arg(long, default_value_t = crate::limits::RESUME_GRACE.as_secs_f64(), value_name = "SECS")]
    pub resume_grace: f64,

    /// Most agent output (bytes; K, M, G suffixes) a resumable session holds for its client: not
    /// yet acknowledged, or written while the client was away. When it is full the agent is held
    /// (its output is not read) until the client acknowledges some; nothing is dropped.
    #[arg(long, default_value = "32M", value_name = "BYTES", value_parser = frame_size)]
    pub resume_buffer: usize,

    /// Serve thunderbolt/<p>/0 only: every session ends with its connection.
    #[arg(long)]
    pub no_resume: bool,

    /// Do not journal resumable sessions. By default each is journaled in
    /// $THUNDERBOLT_HOME/iroh/sessions/ (0600) so it survives a restart of the bridge (an
    /// upgrade, a service restart, a crash): the client redials, the agent is started again
    /// and its ACP sessions taken back (session/resume or session/load).
    #[arg(long, conflicts_with = "no_resume")]
    pub no_journal: bool,

    /// Keep the files devices put for a session (`thunderbolt files put --session`, the
    /// page's Attach) after the session ended. By default a session's files folder,
    /// $THUNDERBOLT_HOME/files/<agent>/<device>/<session>/, goes with it; files put for
    /// no session stay either way.
    #[arg(long)]
    pub keep_files: bool,

    /// Seconds an agent keeps running after its client left: a plain client's
    /// (thunderbolt/<p>/0, which cannot resume: the app's shipped client, acpx, `connect
    /// --no-resume`) however its connection ended, and a resumable client's once it closed
    /// (a lost resumable connection waits --resume-grace first). The next connection from
    /// the same NodeId, plain or a new resumable session, attaches to it instead of
    /// spawning one, so in-memory sessions survive (`session/load`). Output the agent
    /// writes while no client is attached is dropped; requests it sends then, or left
    /// unanswered, get a JSON-RPC error (-32000). Off by default.
    #[arg(long, value_name = "SECS")]
    pub keep_warm: Option<f64>,
}

/// A frame or buffer size flag (see [`crate::config::parse_size`]).
fn frame_size(v: &str) -> Result<usize, String> {
    crate::config::parse_size(v)
}

#[derive(Debug, Subcommand)]
pub enum IrohCmd {
    /// Print this machine's NodeId and a ticket for a protocol's identity.
    Id(IdArgs),
    /// Mint a one-time pairing code: one scan (or one command) on a new device adds it.
    ///
    /// While a host runs, one code is for every agent of the host that admits your own devices
    /// (`--agent NAME` for some), redeemable at any of them; the device learns them all when it
    /// pairs. Prints the `connect --pair` command line and a browser link (the code in its
    /// #fragment, which no web server sees), and the link as a QR code. The code is stored only
    /// as a hash, pairs one device, and expires (10 minutes by default); a device that tries five
    /// wrong codes waits.
    Pair(PairArgs),
    /// Allow a peer (by NodeId or ticket) to connect to your bridges.
    Allow(AllowArgs),
    /// Remove a peer from the allow file; a running bridge ends its sessions at once.
    Deny(DenyArgs),
    /// List the devices that may connect: how each was let in (a pairing code, the allow file,
    /// the account), its name, the agents it may reach, when it was added and last seen.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct IdArgs {
    /// Whose identity: `acp` (also the identity `connect` dials with) or `mcp`.
    #[arg(long, default_value = "acp")]
    pub protocol: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct PairArgs {
    /// Without a host: whose NodeId the device pairs with, `acp` (the ACP bridge) or `mcp`.
    #[arg(long, default_value = "acp")]
    pub protocol: String,
    /// Pair with this agent of the host only (`agents.d/<file>.json`'s name); repeat it for
    /// several. Without it, while a host runs, the code is for every agent of the host that
    /// admits your own devices.
    #[arg(long, value_name = "NAME")]
    pub agent: Vec<String>,
    /// The name the device gets (`iroh list`, `status`, the log); else the name it sends.
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
    /// How long the code is valid: e.g. 10m, 1h, 90s.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = crate::pairing::parse_duration)]
    pub expires: std::time::Duration,
    /// What the device may do, comma-separated: observe (see sessions and their history),
    /// prompt (send the agent requests), answer (answer the agent's permission requests, also
    /// from a notice), start (open sessions; carries prompt and answer), files (send and fetch
    /// files); or all. prompt and answer carry observe. Default: all, as the owner.
    #[arg(long, value_name = "VERBS")]
    pub scope: Option<crate::devices::scope::Verbs>,
    /// How long the device keeps access once it paired (e.g. 8h, 30m, 7d; at most 366 days):
    /// then it is refused, and its live sessions end at once. Default: no end.
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_scope_for)]
    pub for_: Option<std::time::Duration>,
    /// Machine-readable output: the code, the ticket, the link, the command line.
    #[arg(long)]
    pub json: bool,
    /// Do not draw the QR code.
    #[arg(long)]
    pub no_qr: bool,
    /// The app's base URL for the browser link (`<app>/settings/agents#ticket=…&pair=…`).
    #[arg(long, env = "THUNDERBOLT_APP_URL", value_name = "URL")]
    pub app_url: Option<String>,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct AllowArgs {
    /// The peer: its NodeId (64 hex or 52 base32 characters, as `thunderbolt iroh id` prints on
    /// its side) or its ticket.
    #[arg(value_name = "NODEID|TICKET")]
    pub node_id: String,
    /// A name for the device (`iroh list`, `status`, the log; `iroh deny` takes it too).
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DenyArgs {
    /// The peer: its NodeId, its ticket, or its device name.
    #[arg(value_name = "NODEID|TICKET|NAME")]
    pub node_id: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// `--for`'s value: a duration ([`crate::pairing::parse_duration`]) no
/// longer than a scope may run ([`crate::devices::scope::MAX_FOR`]).
fn parse_scope_for(v: &str) -> Result<std::time::Duration, String> {
    let d = crate::pairing::parse_duration(v).map_err(|e| e.replace("a pairing code", "access"))?;
    let max = crate::devices::scope::MAX_FOR;
    if d > max {
        return Err(format!(
            "'{v}' is longer than access may be given for ({} days); leave --for out for no end",
            max.as_secs() / 86_400
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_sizes() {
        assert_eq!(frame_size("32M").unwrap(), 32 << 20);
        assert_eq!(frame_size("32MiB").unwrap(), 32 << 20);
        assert_eq!(frame_size("4096").unwrap(), 4096);
        assert_eq!(frame_size("1g").unwrap(), 1 << 30);
        assert!(frame_size("10").is_err(), "below the minimum");
        assert!(frame_size("5G").is_err(), "above the maximum");
        assert!(frame_size("lots").is_err());
        assert!(frame_size("99999999999999999999G").is_err());
    }

    #[test]
    fn only_the_connect_commands_dial() {
        let dials = |args: &[&str]| Cli::try_parse_from(args).unwrap().command.dials();
        assert!(dials(&["thunderbolt", "acp", "connect", "TICKET"]));
        assert!(dials(&["thunderbolt", "mcp", "connect", "TICKET", "--", "client"]));
        assert!(!dials(&["thunderbolt", "acp", "--transport", "iroh", "--", "cat"]));
        assert!(!dials(&["thunderbolt", "host"]));
        assert!(!dials(&["thunderbolt", "iroh", "id"]));
    }

    /// Every flag, argument and command a person can see says what it is for.
    #[test]
    fn everything_visible_has_help() {
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let builtin = matches!(a.get_id().as_str(), "help" | "version");
                if !a.is_hide_set() && !builtin && a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help") {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(here.clone());
                }
                walk(sub, &here, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "thunderbolt", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}
