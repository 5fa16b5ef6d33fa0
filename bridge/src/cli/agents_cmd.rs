//! `thunderbolt host` and `thunderbolt agents list | check`.

use std::{collections::HashMap, sync::Arc};

use anyhow::{bail, Result};
use serde_json::json;
use thunderbolt_shared::node_id_base32;
use tracing::info;

use crate::{
    cli::{
        account_backend,
        args::{AgentsCmd, HostArgs},
        iroh_cmd::qr,
        limits_config, Serving,
    },
    home::Home,
    host::{
        self,
        folder::{self, Folder},
        manifest::{self, Machine},
        HostContext,
    },
    identity, redact,
};

/// `thunderbolt host`: serves every agent of agents.d and follows the folder.
pub async fn host(home: &Home, args: HostArgs) -> Result<()> {
    let net = args.serving.net.config()?;
    let mut config = limits_config(&args.serving.limits, &args.serving.app)?;
    config.notify = crate::cli::start_notifier(home, &args.notify)?;
    // First: a second host on this home stops here, naming the first.
    let control = crate::control::Control::bind(home, "host")?;
    let credential = account_backend(home, &args.serving.app, config.backend_timeout);
    let ctx = Arc::new(HostContext::new(home.clone(), net, config.clone(), credential));
    let mut folder = Folder::new(home.agents_dir(), Machine::this());
    let loaded = folder.load();
    host::report(&loaded);
    let mut served = Vec::new();
    let mut started = Vec::new();
    // All at once: an unreachable relay's wait is paid once, not once per agent.
    let starts = futures::future::join_all(loaded.agents.values().map(|spec| ctx.start(spec))).await;
    for (spec, start) in loaded.agents.values().zip(starts) {
        match start {
            Ok((a, s)) => {
                served.push(a);
                started.push(s);
            }
            Err(e) => tracing::warn!(agent = %spec.name, "cannot serve {}: {e:#}", spec.name),
        }
    }
    let notify = crate::notify::Notifier::describe(config.notify.as_deref());
    let mut banner = host::banner(folder.dir(), &started, &loaded, &home.allowlist_path(), &notify);
    if let Some(url) = ctx.net.relays.only_one() {
        // Before the banner's last line (what scripts wait for).
        let note = format!(
            "  Relay:   {url} is the only relay: when it is down, no browser reaches these agents \
             (give a second, --relay-url {url},<another>, and either may die)\n  Allow a peer:"
        );
        banner = banner.replacen("  Allow a peer:", &note, 1);
    }
    let by_name: HashMap<String, _> =
        started.iter().map(|s| s.name.clone()).zip(served.iter().cloned()).collect();
    let serving = Serving::start(home, &config, &banner, "host", served);
    tokio::spawn(host::watch(ctx, folder, loaded, by_name, serving.changes.clone(), serving.stop.clone()));
    serving.run(control).await;
    info!("host stopped");
    Ok(())
}

/// The smallest manifest, as the words that ask for one show it.
pub const MANIFEST_EXAMPLE: &str = r#"{"name": "my-agent", "command": ["my-agent", "--acp"]}"#;

pub fn run(home: &Home, cmd: AgentsCmd) -> Result<()> {
    match cmd {
        AgentsCmd::List(a) => list(home, a),
        AgentsCmd::Check(a) => check(a),
    }
}

fn list(home: &Home, a: crate::cli::args::AgentsListArgs) -> Result<()> {
    let net = a.net.config()?;
    let dir = home.agents_dir();
    let loaded = folder::load_dir(&dir, &Machine::this());
    // What runs on this home: the host (its agents' live sessions, and the
    // ticket it prints: its addresses as bound, with relays disabled the only
    // ticket that reaches it), and single-agent bridges, which serve an agent
    // of their command line, not of agents.d.
    let (hosts, singles): (Vec<_>, Vec<_>) = crate::control::client::each(home, |c| c.status())
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .partition(|s| s.kind == "host");
    let served: HashMap<String, crate::control::api::AgentStatus> =
        hosts.into_iter().flat_map(|s| s.agents.into_iter().map(|a| (a.name.clone(), a))).collect();
    let mut rows = Vec::new();
    for spec in loaded.agents.values() {
        let (key, _) = identity::load_or_create_named(home, &spec.identity.file_name(&spec.name))?;
        let id = key.public();
        let live = served
            .get(&spec.name)
            .filter(|a| a.node_id == id.to_string())
            .and_then(|a| a.ticket.parse::<thunderbolt_shared::EndpointTicket>().ok());
        let ticket = live
            .clone()
            .unwrap_or_else(|| thunderbolt_shared::EndpointTicket::new(host::offline_addr(id, &net)));
        rows.push((spec, id, ticket, live.is_some()));
    }
    let live: HashMap<&str, u64> = served.iter().map(|(n, a)| (n.as_str(), a.live_sessions as u64)).collect();
    if let Some(name) = &a.qr {
        let Some((_, _, ticket, _)) = rows.iter().find(|(s, _, _, _)| &s.name == name) else {
            bail!("no agent named '{name}' loads from {} (see `thunderbolt agents list`)", dir.display());
        };
        println!("{}", qr(&ticket.to_string())?);
        return Ok(());
    }
    if a.json {
        let agents: Vec<_> = rows
            .iter()
            .map(|(s, id, t, running)| {
                json!({
                    "name": s.name, "label": s.label, "protocol": s.protocol.as_str(),
                    "nodeId": id.to_string(), "nodeIdBase32": node_id_base32(id), "ticket": t.to_string(),
                    "ticketFrom": if *running { "the running host" } else { "the configuration" },
                    "file": s.source, "status": "loaded", "warnings": s.warnings,
                    "liveSessions": live.get(s.name.as_str()),
                })
            })
            .collect();
        let refused: Vec<_> = loaded
            .refused
            .iter()
            .map(|(f, why)| json!({"file": f, "status": "refused", "reason": why}))
            .collect();
        let bridges: Vec<_> = singles
            .iter()
            .flat_map(|s| s.agents.iter().map(move |a| (s.pid, a)))
            .map(|(pid, a)| {
                json!({
                    "pid": pid, "protocol": a.protocol, "nodeId": a.node_id, "ticket": a.ticket,
                    "liveSessions": a.live_sessions,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"dir": dir, "agents": agents, "refused": refused, "folder": loaded.folder, "bridges": bridges})
        );
        return Ok(());
    }
    if rows.is_empty() && loaded.refused.is_empty() {
        println!(
            "no agents in {} yet: that folder is what `thunderbolt host` serves, one manifest per agent, e.g. {MANIFEST_EXAMPLE}",
            dir.display()
        );
    }
    for s in &singles {
        for a in &s.agents {
            let protocol = a.protocol.parse::<thunderbolt_shared::Protocol>();
            let what =
                protocol.map_or_else(|_| format!("a {} bridge", a.protocol), |p| p.with_article("bridge"));
            println!(
                "{what} runs here apart from agents.d (pid {}, {} live session(s)): it serves the agent of its \
                 own command line; `thunderbolt status` shows it",
                s.pid, a.live_sessions
            );
            println!("  NodeId: {}  ({})", a.node_id, a.node_id_base32);
            println!("  Ticket: {}", a.ticket);
        }
    }
    for (s, id, t, running) in &rows {
        let sessions = match live.get(s.name.as_str()) {
            Some(n) => format!("; {n} live session(s)"),
            None => String::new(),
        };
        println!("{} ({}, {}): loaded from {}{sessions}", s.name, s.label, s.protocol, s.source.display());
        println!("  NodeId: {id}  ({})", node_id_base32(id));
        println!("  Ticket: {t}");
        if !running && t.endpoint_addr().addrs.is_empty() {
            println!(
                "  (this ticket carries no address: relays are disabled and no host serves this agent now; \
                 start `thunderbolt host` and list again for a ticket with its direct addresses)"
            );
        }
        for w in &s.warnings {
            println!("  warning: {w}");
        }
    }
    for (f, why) in &loaded.refused {
        println!("{}: refused: {why}", f.display());
    }
    if let Some(why) = &loaded.folder {
        println!("the folder is refused: {why}");
    }
    Ok(())
}

fn check(a: crate::cli::args::AgentsCheckArgs) -> Result<()> {
    let spec = match manifest::load(&a.file, &Machine::this()) {
        Ok(s) => s,
        Err(why) => {
            if a.json {
                println!("{}", json!({"file": a.file, "status": "refused", "reason": why.0}));
                std::process::exit(1);
            }
            bail!("{} is refused: {why}", a.file.display());
        }
    };
    let argv: Vec<String> = spec.argv.iter().map(|w| w.to_string_lossy().into_owned()).collect();
    let env: serde_json::Map<String, serde_json::Value> =
        spec.env.iter().map(|(k, v)| (k.clone(), redact::env_value(k, v).into())).collect();
    if a.json {
        println!(
            "{}",
            json!({
                "file": a.file, "status": "loaded", "name": spec.name, "label": spec.label,
                "protocol": spec.protocol.as_str(), "argv": redact::redact_command(&argv),
                "cwd": spec.cwd, "env": env, "warnings": spec.warnings,
            })
        );
        return Ok(());
    }
    println!("{} loads: agent {} ({}, {})", a.file.display(), spec.name, spec.label, spec.protocol);
    println!("  runs:  {}", redact::redact_command(&argv));
    println!(
        "  in:    {}",
        spec.cwd
            .as_ref()
            .map_or_else(|| "the host's working directory".to_string(), |c| c.display().to_string())
    );
    for (k, v) in &env {
        println!("  env:   {k}={}", v.as_str().unwrap_or_default());
    }
    let who = if spec.accept_from.own_devices { "your own devices (account and allow file)" } else { "" };
    let listed: Vec<String> = spec.accept_from.ids.iter().map(|i| i.to_string()).collect();
    println!(
        "  from:  {who}{}{}",
        if !who.is_empty() && !listed.is_empty() { ", " } else { "" },
        listed.join(", ")
    );
    for w in &spec.warnings {
        println!("  warning: {w}");
    }
    Ok(())
}
