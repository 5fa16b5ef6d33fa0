//! `thunderbolt iroh id | pair | allow | deny | list`.

use anyhow::{bail, Context, Result};
use iroh::{EndpointAddr, TransportAddr};
use serde_json::json;
use thunderbolt_shared::{node_id_base32, pairing as pairing_wire, EndpointTicket, Protocol, Target};

use crate::{
    cli::{args::IrohCmd, device_list},
    devices::{now_ms, rfc3339, Devices, How},
    home::Home,
    host::{folder, manifest::Machine},
    identity,
    trust::allowfile,
};

pub fn run(home: &Home, cmd: IrohCmd) -> Result<()> {
    match cmd {
        IrohCmd::Id(a) => {
            let (protocol, id, ticket) = offline_ticket(home, &a.protocol, &a.net)?;
            if a.json {
                println!(
                    "{}",
                    json!({
                        "protocol": protocol.as_str(),
                        "nodeId": id.to_string(),
                        "nodeIdBase32": node_id_base32(&id),
                        "ticket": ticket.to_string(),
                        "identityPath": home.identity_path(&protocol),
                    })
                );
            } else {
                println!("NodeId: {id}");
                println!("Ticket: {ticket}");
            }
        }
        IrohCmd::Pair(a) => crate::cli::pair_cmd::pair(home, a)?,
        IrohCmd::Allow(a) => {
            let id = a.node_id.parse::<Target>()?.id();
            let path = home.allowlist_path();
            let name = a.name.as_deref().and_then(pairing_wire::clean_name);
            let devices = Devices::new(home);
            if let Some(other) = name.as_deref().and_then(|n| devices.name_taken(n, &id)) {
                bail!(
                    "another device ({other}) is named '{}' already: choose another name (names are told apart without case); nothing was changed",
                    name.unwrap_or_default()
                );
            }
            let added = allowfile::allow(&path, &id)?;
            // A device allowed earlier keeps how it came (a pairing stays a pairing).
            let how = if added { How::Allow } else { devices.get(&id).map_or(How::Allow, |d| d.how) };
            devices.record(&id, name.clone(), how)?;
            let label = name.map(|n| format!(" as \"{n}\"")).unwrap_or_default();
            if a.json {
                println!(
                    "{}",
                    json!({"nodeId": id.to_string(), "added": added, "name": devices.name_of(&id), "path": path})
                );
            } else if added {
                println!("allowed {id}{label} (in {})", path.display());
            } else {
                println!("{id} was already allowed{label} (in {})", path.display());
            }
        }
        IrohCmd::Deny(a) => {
            let devices = Devices::new(home);
            let id = match devices.resolve(&a.node_id) {
                Ok(id) => id,
                Err(why) => {
                    bail!("'{}': {why} (`thunderbolt iroh list` shows them); nothing was changed", a.node_id)
                }
            };
            let name = devices.name_of(&id);
            let paired_with = devices.get(&id).map(|d| d.agents).unwrap_or_default();
            let path = home.allowlist_path();
            let removed = allowfile::deny(&path, &id)?;
            devices.forget(&id)?;
            // Its notices end with it: the browsers it subscribed get nothing more.
            let pushes = crate::notify::push::Subscriptions::new(home).forget(&id).unwrap_or_else(|e| {
                eprintln!("warning: its push subscriptions were not removed: {e}");
                0
            });
            // Running bridges re-check now instead of at their next heartbeat.
            let ended: u64 = crate::control::client::each(home, |c| c.recheck())
                .into_iter()
                .map(|(_, r)| r.unwrap_or(0) as u64)
                .sum();
            let label = name.as_deref().map(|n| format!(" (\"{n}\")")).unwrap_or_default();
            if a.json {
                println!(
                    "{}",
                    json!({"nodeId": id.to_string(), "name": name, "removed": removed || !paired_with.is_empty(), "path": path, "pairedWith": paired_with, "sessionsEnded": ended, "pushSubscriptionsRemoved": pushes})
                );
            } else if removed || !paired_with.is_empty() {
                let mut live =
                    if ended > 0 { format!("; {ended} live session(s) ended") } else { String::new() };
                if pushes > 0 {
                    live.push_str(&format!("; {pushes} push subscription(s) removed"));
                }
                let from = if removed {
                    path.display().to_string()
                } else {
                    format!("its pairing with {}", paired_with.join(", "))
                };
                println!("removed {id}{label} from {from}; its next connection is refused{live}");
            } else {
                println!("{id}{label} was not in {}", path.display());
            }
        }
        IrohCmd::List(a) => {
            let path = home.allowlist_path();
            let allowed = allowfile::read(&path)?;
            for bad in &allowed.bad_lines {
                eprintln!("warning: {}:{}: ignored: {}", path.display(), bad.line_no, bad.error);
            }
            let known = Devices::new(home).all();
            let manifests = folder::load_dir(&home.agents_dir(), &Machine::this()).agents;
            let hosted = !manifests.is_empty();
            let listed = device_list::list(&allowed.ids, &known, &manifests);
            if a.json {
                let ids: Vec<String> = allowed.ids.iter().map(|i| i.to_string()).collect();
                let devices: Vec<_> = listed
                    .iter()
                    .map(|l| {
                        let d = l.device.as_ref();
                        json!({
                            "nodeId": l.id.to_string(),
                            "name": d.and_then(|d| d.name.clone()),
                            "how": l.via.as_str(),
                            "allowFile": l.in_allow_file,
                            "agents": l.agents,
                            "added": d.map(|d| rfc3339(d.added_ms)),
                            "lastSeen": d.and_then(|d| d.last_seen_ms).map(rfc3339),
                            "scope": d.and_then(|d| d.scope.clone()).unwrap_or_else(crate::devices::scope::Scope::full),
                        })
                    })
                    .collect();
                let bad: Vec<_> =
                    allowed.bad_lines.iter().map(|b| json!({"line": b.line_no, "error": b.error})).collect();
                println!("{}", json!({"path": path, "nodeIds": ids, "devices": devices, "badLines": bad}));
            } else if listed.is_empty() {
                eprintln!(
                    "no devices may connect yet ({} is empty, and none paired with an agent); pair one with \
                     `thunderbolt iroh pair`, or add one with `thunderbolt iroh allow <nodeid>`",
                    path.display()
                );
            } else {
                let now = now_ms();
                for l in &listed {
                    let d = l.device.as_ref();
                    let when = d.map(|d| format!(" {}", ago(now, d.added_ms))).unwrap_or_default();
                    let seen =
                        d.and_then(|d| d.last_seen_ms).map_or_else(|| "never".to_string(), |t| ago(now, t));
                    let scope = match d.and_then(|d| d.scope.as_ref()).filter(|s| !s.is_full()) {
                        Some(s) if s.expired(now) => format!("; may do {} (ended)", s.describe()),
                        Some(s) => format!("; may do {}", s.describe()),
                        None => String::new(),
                    };
                    println!(
                        "{}  {}  {}{when}; reaches {}; last seen {seen}{scope}",
                        l.id,
                        d.and_then(|d| d.name.as_deref()).unwrap_or("(no name)"),
                        l.via.words(),
                        device_list::reach_words(l, hosted),
                    );
                }
            }
        }
    }
    Ok(())
}

/// The identity's NodeId and a ticket naming the configured relays (no direct
/// addresses: those exist only while a bridge runs, and its banner has them).
fn offline_ticket(
    home: &Home,
    protocol: &str,
    net: &crate::cli::args::NetArgs,
) -> Result<(Protocol, iroh::EndpointId, EndpointTicket)> {
    let protocol = Protocol::parse_known(protocol)?;
    let net = net.config()?;
    let (key, _) = identity::load_or_create(home, &protocol)?;
    let id = key.public();
    let addr = EndpointAddr::from_parts(id, net.relays.urls().into_iter().map(TransportAddr::Relay));
    Ok((protocol, id, EndpointTicket::new(addr)))
}

/// `data` as a terminal QR code (two modules per character cell).
///
/// On a terminal it is drawn black on white whatever the terminal's own
/// colours: plain block characters come out inverted on a dark background,
/// which many phone cameras do not read. Into a pipe or a file it stays
/// plain text.
pub fn qr(data: &str) -> Result<String> {
    use qrcode::{render::unicode, EcLevel, QrCode};
    use std::io::IsTerminal;
    let code = QrCode::with_error_correction_level(data.as_bytes(), EcLevel::L)
        .context("ticket too long for a QR code")?;
    let plain = code.render::<unicode::Dense1x2>().quiet_zone(true).build();
    if !std::io::stdout().is_terminal() {
        return Ok(plain);
    }
    // Black text (the dark modules) on a white background (the light ones).
    const BLACK_ON_WHITE: &str = "\x1b[38;5;16;48;5;231m";
    const RESET: &str = "\x1b[0m";
    Ok(plain.lines().map(|l| format!("{BLACK_ON_WHITE}{l}{RESET}")).collect::<Vec<_>>().join("\n"))
}

/// "just now", "5 min ago", "3 h ago", "2 days ago".
fn ago(now_ms: u64, then_ms: u64) -> String {
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0..60 => "just now".into(),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_write_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_121_900_000), "2026-12-01T10:45:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(ago(120_000, 0), "2 min ago");
    }
}
