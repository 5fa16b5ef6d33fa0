//! `thunderbolt status`, `kick` and `service`: clients of the running
//! bridge's control API ([`crate::control`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::{
    cli::args::{KickArgs, ServiceCmd, StatusArgs},
    control::{api::Status, client, service},
    home::Home,
};

/// Exit code when no bridge runs on the home (the status of nothing).
pub const EXIT_NOT_RUNNING: i32 = 3;

fn not_running(home: &Home) -> ! {
    eprintln!(
        "no bridge is running on {} (start one with `thunderbolt host`, or `thunderbolt acp --transport iroh`)",
        home.root_path().display()
    );
    std::process::exit(EXIT_NOT_RUNNING);
}

pub fn status(home: &Home, a: StatusArgs) -> Result<()> {
    let replies = client::each(home, |c| c.status());
    if replies.is_empty() {
        not_running(home);
    }
    let mut bridges = Vec::new();
    for (_, r) in replies {
        match r {
            Ok(s) => bridges.push(s),
            Err(e) => eprintln!("{e}"),
        }
    }
    if bridges.is_empty() {
        std::process::exit(1);
    }
    if a.json {
        println!("{}", json!({ "bridges": bridges }));
        return Ok(());
    }
    for b in &bridges {
        print!("{}", render(b));
    }
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

/// `1h 02m`, `3m 05s`, `12s`.
fn ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// One bridge's status for people.
fn render(b: &Status) -> String {
    use std::fmt::Write;
    let now = now_ms();
    let mut s = String::new();
    let up = now.saturating_sub(b.started_ms);
    let _ = writeln!(
        s,
        "thunderbolt {} (pid {}, up {}): {} of {} agent slots in use",
        b.kind,
        b.pid,
        ago(up),
        b.slots_used,
        b.slots
    );
    if let Some(sock) = &b.reach_socket {
        let _ = writeln!(s, "  messages: {sock} (thunderbolt note, thunderbolt reach, relay agents)");
    }
    for a in &b.agents {
        let title = if a.name.is_empty() { a.protocol.clone() } else { format!("{} ({})", a.name, a.label) };
        let _ = writeln!(s, "  agent {title}, {}: {} live session(s)", a.protocol, a.live_sessions);
        let _ = writeln!(s, "    NodeId:  {}", a.node_id);
        let _ = writeln!(s, "    Ticket:  {}", a.ticket);
        let r = &a.relay;
        let since = || ago(now.saturating_sub(r.since_ms.unwrap_or(now)));
        let relay = match (&r.url, r.connected) {
            (None, _) => "none (direct addresses only; browsers cannot reach it)".to_string(),
            (Some(url), true) => format!(
                "{url} connected for {}{}",
                since(),
                if r.drops > 0 { format!(" ({} drop(s) before)", r.drops) } else { String::new() }
            ),
            (Some(url), false) => format!(
                "{url} UNREACHABLE for {}{} (browsers cannot reach this bridge)",
                since(),
                r.last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
            ),
        };
        let _ = writeln!(s, "    Relay:   {relay}");
        // With several relays, each of them: the home one, and those it would move to.
        if r.relays.len() > 1 {
            for p in &r.relays {
                let since =
                    p.since_ms.map(|t| format!(" for {}", ago(now.saturating_sub(t)))).unwrap_or_default();
                let state = match (p.reachable, p.latency_ms) {
                    (None, _) => "not probed yet".to_string(),
                    (Some(true), Some(ms)) => format!("reachable{since}, {ms:.1} ms"),
                    (Some(true), None) => format!("reachable{since}"),
                    (Some(false), _) => format!(
                        "unreachable{since}{}",
                        p.last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
                    ),
                };
                let _ = writeln!(s, "      {} {}: {state}", if p.home { "home " } else { "     " }, p.url);
            }
        }
    }
    if b.sessions.is_empty() {
        let _ = writeln!(s, "  no sessions");
    }
    for x in &b.sessions {
        let device = x.device.as_ref().map(|d| format!(" ({d})")).unwrap_or_default();
        let state = match (x.state.as_str(), x.waits_ms) {
            ("detached", Some(w)) => format!("detached, waits {} more", ago(w)),
            ("warm", Some(w)) => format!("warm, idle, stops in {}", ago(w)),
            (st, _) => st.to_string(),
        };
        let path = match x.rtt_ms {
            Some(rtt) => format!("{} {:.1} ms", x.path, rtt),
            None => x.path.clone(),
        };
        let _ = writeln!(
            s,
            "  session {}{}: peer {}{device}, {}, {} ago; path {path}; sent {} received {}; pid {}{}",
            x.id,
            if x.agent.is_empty() { String::new() } else { format!(" ({})", x.agent) },
            x.peer_short,
            state,
            ago(now.saturating_sub(x.since_ms)),
            bytes(x.bytes_sent),
            bytes(x.bytes_received),
            x.pid.map_or_else(|| "-".to_string(), |p| p.to_string()),
            match (x.resumes, x.restored) {
                (0, false) => String::new(),
                (0, true) => "; restored after the restart".to_string(),
                (n, false) => format!("; resumed {n}×"),
                (n, true) => format!("; restored after the restart, resumed {n}×"),
            }
        );
        for d in &x.devices {
            let _ = writeln!(
                s,
                "    device {}: {}{}, {}{}, {}",
                d.id,
                d.device.clone().unwrap_or_else(|| d.peer.chars().take(10).collect()),
                if d.device.is_some() {
                    format!(" ({})", d.peer.chars().take(10).collect::<String>())
                } else {
                    String::new()
                },
                d.role,
                match (&d.scope, &d.share_until) {
                    (Some(s), Some(u)) => format!(" (a guest by a share, may do {s}, until {u})"),
                    (Some(s), None) => format!(" (may do {s})"),
                    (None, Some(u)) => format!(" (a guest by a share, until {u})"),
                    (None, None) => String::new(),
                },
                if d.attached { format!("attached, path {}", d.path) } else { "away".to_string() }
            );
        }
    }
    s
}

pub fn kick(home: &Home, a: KickArgs) -> Result<()> {
    let replies = client::each(home, |c| c.kick(&a.target));
    if replies.is_empty() {
        not_running(home);
    }
    let mut ended = 0;
    for (_, r) in replies {
        match r {
            Ok(n) => ended += n,
            Err(client::ClientError::Refused { error, .. }) => {
                eprintln!("error: {error} (see `thunderbolt iroh list`)");
                std::process::exit(2);
            }
            Err(e) => tracing::debug!("{e}"),
        }
    }
    if ended == 0 {
        eprintln!("no session matches '{}' (see `thunderbolt status`)", a.target);
        std::process::exit(1);
    }
    println!("ended {ended} session(s)");
    Ok(())
}

/// The service runs `thunderbolt host`, which serves agents.d: with no agent
/// there it would run and serve nothing, which nothing else would say.
fn warn_if_nothing_to_serve(home: &Home) {
    let dir = home.agents_dir();
    let loaded = crate::host::folder::load_dir(&dir, &crate::host::manifest::Machine::this());
    if !loaded.agents.is_empty() {
        return;
    }
    let refused = match loaded.refused.len() {
        0 => String::new(),
        n => format!(" ({n} manifest(s) there are refused: `thunderbolt agents list` says why)"),
    };
    eprintln!(
        "warning: no agent loads from {}{refused}: the service runs `thunderbolt host`, which serves \
         that folder, so it would serve nothing; add a manifest first, e.g. {}",
        dir.display(),
        crate::cli::agents_cmd::MANIFEST_EXAMPLE
    );
}

pub fn service(home: &Home, cmd: ServiceCmd) -> Result<()> {
    let (args, what) = match &cmd {
        ServiceCmd::Install(a) => (a, "install"),
        ServiceCmd::Uninstall(a) => (a, "uninstall"),
        ServiceCmd::Status(a) => (a, "status"),
    };
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let user_home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(std::path::PathBuf::from);
    let Some(user_home) = user_home else { bail!("HOME is not set: cannot tell where the unit goes") };
    let home =
        Home::new(std::path::absolute(home.root_path()).unwrap_or_else(|_| home.root_path().to_path_buf()));
    let unit = service::unit(args.manager.unwrap_or_else(service::Manager::here), &exe, &home, &user_home);
    match what {
        "install" => {
            warn_if_nothing_to_serve(&home);
            service::install(&unit, args.dry_run)
        }
        "uninstall" => service::uninstall(&unit, args.dry_run),
        _ => {
            service::status(&unit)?;
            if client::each(&home, |c| c.status()).is_empty() {
                println!("no bridge answers on {}", home.root_path().display());
            }
            Ok(())
        }
    }
}
