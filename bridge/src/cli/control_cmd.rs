//! `thunderbolt status`, `kick` and `service`: clients of the running
//! bridge's control API ([`crate::control`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{
    cli::args::{KickArgs, ServiceCmd, StatusArgs},
    control::{client, service},
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
    let replies = client::ask_all(home, "GET", "/v1/status", None);
    if replies.is_empty() {
        not_running(home);
    }
    let mut bridges = Vec::new();
    for (path, r) in replies {
        if r.status == 200 {
            bridges.push(r.body);
        } else {
            eprintln!(
                "{}: refused ({}): {}",
                path.display(),
                r.status,
                r.body["error"].as_str().unwrap_or("")
            );
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
fn render(b: &Value) -> String {
    use std::fmt::Write;
    let now = now_ms();
    let mut s = String::new();
    let str_of = |v: &Value| v.as_str().unwrap_or("").to_string();
    let up = now.saturating_sub(b["startedMs"].as_u64().unwrap_or(now));
    let _ = writeln!(
        s,
        "thunderbolt {} (pid {}, up {}): {} of {} agent slots in use",
        str_of(&b["kind"]),
        b["pid"],
        ago(up),
        b["slotsUsed"],
        b["slots"]
    );
    for a in b["agents"].as_array().into_iter().flatten() {
        let name = str_of(&a["name"]);
        let title = if name.is_empty() {
            str_of(&a["protocol"])
        } else {
            format!("{name} ({})", str_of(&a["label"]))
        };
        let _ =
            writeln!(s, "  agent {title}, {}: {} live session(s)", str_of(&a["protocol"]), a["liveSessions"]);
        let _ = writeln!(s, "    NodeId:  {}", str_of(&a["nodeId"]));
        let _ = writeln!(s, "    Ticket:  {}", str_of(&a["ticket"]));
        let r = &a["relay"];
        let relay = match (r["url"].as_str(), r["connected"].as_bool()) {
            (None, _) => "none (direct addresses only; browsers cannot reach it)".to_string(),
            (Some(url), Some(true)) => format!(
                "{url} connected for {}{}",
                ago(now.saturating_sub(r["sinceMs"].as_u64().unwrap_or(now))),
                if r["drops"].as_u64().unwrap_or(0) > 0 {
                    format!(" ({} drop(s) before)", r["drops"])
                } else {
                    String::new()
                }
            ),
            (Some(url), _) => format!(
                "{url} UNREACHABLE for {}{} (browsers cannot reach this bridge)",
                ago(now.saturating_sub(r["sinceMs"].as_u64().unwrap_or(now))),
                r["lastError"].as_str().map(|e| format!(": {e}")).unwrap_or_default()
            ),
        };
        let _ = writeln!(s, "    Relay:   {relay}");
    }
    let sessions = b["sessions"].as_array().cloned().unwrap_or_default();
    if sessions.is_empty() {
        let _ = writeln!(s, "  no sessions");
    }
    for x in &sessions {
        let agent = str_of(&x["agent"]);
        let device = x["device"].as_str().map(|d| format!(" ({d})")).unwrap_or_default();
        let state = match (str_of(&x["state"]).as_str(), x["waitsMs"].as_u64()) {
            ("detached", Some(w)) => format!("detached, waits {} more", ago(w)),
            ("warm", Some(w)) => format!("warm, idle, stops in {}", ago(w)),
            (st, _) => st.to_string(),
        };
        let path = match x["rttMs"].as_f64() {
            Some(rtt) => format!("{} {:.1} ms", str_of(&x["path"]), rtt),
            None => str_of(&x["path"]),
        };
        let _ = writeln!(
            s,
            "  session {}{}: peer {}{device}, {}, {} ago; path {path}; sent {} received {}; pid {}{}",
            str_of(&x["id"]),
            if agent.is_empty() { String::new() } else { format!(" ({agent})") },
            str_of(&x["peerShort"]),
            state,
            ago(now.saturating_sub(x["sinceMs"].as_u64().unwrap_or(now))),
            bytes(x["bytesSent"].as_u64().unwrap_or(0)),
            bytes(x["bytesReceived"].as_u64().unwrap_or(0)),
            x["pid"].as_u64().map_or_else(|| "-".to_string(), |p| p.to_string()),
            match x["resumes"].as_u64().unwrap_or(0) {
                0 => String::new(),
                n => format!("; resumed {n}×"),
            }
        );
    }
    s
}

pub fn kick(home: &Home, a: KickArgs) -> Result<()> {
    let replies = client::ask_all(home, "POST", "/v1/kick", Some(&json!({ "target": a.target })));
    if replies.is_empty() {
        not_running(home);
    }
    if let Some(why) = replies.iter().find_map(|(_, r)| r.body["error"].as_str()) {
        eprintln!("error: {why} (see `thunderbolt iroh list`)");
        std::process::exit(2);
    }
    let ended: u64 = replies.iter().map(|(_, r)| r.body["ended"].as_u64().unwrap_or(0)).sum();
    if ended == 0 {
        eprintln!("no session matches '{}' (see `thunderbolt status`)", a.target);
        std::process::exit(1);
    }
    println!("ended {ended} session(s)");
    Ok(())
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
        "install" => service::install(&unit, args.dry_run),
        "uninstall" => service::uninstall(&unit, args.dry_run),
        _ => {
            service::status(&unit)?;
            if client::ask_all(&home, "GET", "/v1/status", None).is_empty() {
                println!("no bridge answers on {}", home.root_path().display());
            }
            Ok(())
        }
    }
}
