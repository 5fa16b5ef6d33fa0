//! `thunderbolt iroh id | pair | allow | deny | list`.

use anyhow::{bail, Context, Result};
use iroh::{EndpointAddr, TransportAddr};
use serde_json::json;
use thunderbolt_shared::{node_id_base32, pairing as pairing_wire, EndpointTicket, Protocol, Target};

use crate::{
    cli::{
        args::{IrohCmd, PairArgs},
        banner::pairing_url,
    },
    devices::{now_ms, rfc3339, Devices, How},
    home::Home,
    host::{folder, manifest::Machine},
    identity,
    pairing::{self, Pairings},
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
        IrohCmd::Pair(a) => pair(home, a)?,
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
            if a.json {
                let ids: Vec<String> = allowed.ids.iter().map(|i| i.to_string()).collect();
                let devices: Vec<_> = allowed
                    .ids
                    .iter()
                    .map(|id| {
                        let d = known.get(id);
                        json!({
                            "nodeId": id.to_string(),
                            "name": d.and_then(|d| d.name.clone()),
                            "how": d.map(|d| d.how),
                            "added": d.map(|d| rfc3339(d.added_ms)),
                            "lastSeen": d.and_then(|d| d.last_seen_ms).map(rfc3339),
                        })
                    })
                    .collect();
                let bad: Vec<_> =
                    allowed.bad_lines.iter().map(|b| json!({"line": b.line_no, "error": b.error})).collect();
                println!("{}", json!({"path": path, "nodeIds": ids, "devices": devices, "badLines": bad}));
            } else if allowed.ids.is_empty() {
                eprintln!(
                    "no peers allowed yet ({}); pair one with `thunderbolt iroh pair`, or add one with \
                     `thunderbolt iroh allow <nodeid>`",
                    path.display()
                );
            } else {
                let now = now_ms();
                for id in &allowed.ids {
                    match known.get(id) {
                        Some(d) => println!(
                            "{id}  {}  added {} by {}, last seen {}",
                            d.name.as_deref().unwrap_or("(no name)"),
                            ago(now, d.added_ms),
                            d.how,
                            d.last_seen_ms.map_or_else(|| "never".to_string(), |t| ago(now, t)),
                        ),
                        None => println!("{id}  (no name)"),
                    }
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

/// `thunderbolt iroh pair`: mints a one-time code and says how to use it.
fn pair(home: &Home, a: PairArgs) -> Result<()> {
    let net = a.net.config()?;
    // What the code pairs with, whose identity the device dials.
    let (protocol, what, target, identity_file) = match &a.agent {
        Some(name) => {
            let dir = home.agents_dir();
            let loaded = folder::load_dir(&dir, &Machine::this());
            let Some(spec) = loaded.agents.get(name) else {
                let known: Vec<&str> = loaded.agents.keys().map(String::as_str).collect();
                bail!(
                    "no agent named '{name}' loads from {} ({}; `thunderbolt agents list` shows why)",
                    dir.display(),
                    if known.is_empty() {
                        "none does".to_string()
                    } else {
                        format!("these do: {}", known.join(", "))
                    }
                );
            };
            (
                spec.protocol.clone(),
                format!("agent {name} ({})", spec.label),
                pairing::agent_target(name),
                spec.identity.file_name(name),
            )
        }
        None => {
            let protocol = Protocol::parse_known(&a.protocol)?;
            let file = protocol.identity_file_name();
            (
                protocol.clone(),
                format!("this machine's {protocol} bridge"),
                pairing::bridge_target(protocol.as_str()),
                file,
            )
        }
    };
    let (key, _) = identity::load_or_create_named(home, &identity_file)?;
    let id = key.public();
    // A running bridge's ticket also carries its direct addresses.
    let live = live_ticket(home, &id);
    let running = live.is_some();
    let ticket = live.unwrap_or_else(|| {
        EndpointTicket::new(EndpointAddr::from_parts(
            id,
            net.relays.urls().into_iter().map(TransportAddr::Relay),
        ))
    });
    let name = a.name.as_deref().and_then(pairing_wire::clean_name);
    let code = Pairings::new(home).mint(&target, name.clone(), a.expires)?;
    let command = format!("thunderbolt {protocol} connect --pair {code} {ticket}");
    // A self-hosted relay rides along: a browser has no other way to learn it.
    let relay = match &net.relays {
        crate::net::Relays::Custom(urls) => {
            urls.first().map(|u| format!("&relay={}", fragment_escape(u.as_str())))
        }
        _ => None,
    };
    let link = pairing_url(a.app_url.as_deref(), &protocol)
        .map(|page| format!("{page}#ticket={ticket}&pair={code}{}", relay.unwrap_or_default()));
    let expires_ms = now_ms().saturating_add(a.expires.as_millis() as u64);
    let no_address = ticket.endpoint_addr().addrs.is_empty();
    if a.json {
        println!(
            "{}",
            json!({
                "code": code, "ticket": ticket.to_string(), "command": command, "link": link,
                "nodeId": id.to_string(), "nodeIdBase32": node_id_base32(&id), "protocol": protocol.as_str(),
                "agent": a.agent, "name": name, "expires": rfc3339(expires_ms), "bridgeRunning": running,
            })
        );
        return Ok(());
    }
    println!(
        "One-time pairing code for {what} (NodeId {}): pairs one device, valid {}.\n",
        id.fmt_short(),
        for_how_long(a.expires)
    );
    println!("On the device, run:\n  {command}\n");
    match &link {
        Some(link) => {
            println!("or open this link in its browser (the code rides in the #fragment, which no web server sees):");
            println!("  {link}\n");
        }
        None => println!(
            "(For a link a phone's browser opens, give the app's address: --app-url <url> or THUNDERBOLT_APP_URL.)\n"
        ),
    }
    if !a.no_qr {
        // The link when there is one: a phone's camera opens it.
        println!("{}", qr(link.as_deref().unwrap_or(&command))?);
    }
    if !running {
        let how = match &a.agent {
            Some(_) => "thunderbolt host".to_string(),
            None => format!("thunderbolt {protocol} --transport iroh -- <agent-cmd…>"),
        };
        println!("No bridge serves this NodeId right now: start it before the device dials ({how}).");
    }
    if no_address {
        eprintln!(
            "warning: this ticket carries no address (relays are disabled and no bridge runs to \
             add its direct ones): start the bridge, then run `thunderbolt iroh pair` again"
        );
    }
    println!(
        "Without a code: on the device run `thunderbolt iroh id`, then here `thunderbolt iroh allow <its-nodeid> --name <label>`."
    );
    Ok(())
}

/// `text` safe as a value in a `#a=b&c=d` fragment (URLSearchParams reads it back).
fn fragment_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The ticket a running bridge of this home serves `id` with, if one does.
fn live_ticket(home: &Home, id: &iroh::EndpointId) -> Option<EndpointTicket> {
    crate::control::client::each(home, |c| c.status()).into_iter().find_map(|(_, r)| {
        r.ok()?.agents.into_iter().find(|a| a.node_id == id.to_string()).and_then(|a| a.ticket.parse().ok())
    })
}

/// "10 minutes", "1 hour", "90 seconds".
fn for_how_long(d: std::time::Duration) -> String {
    let s = d.as_secs();
    let (n, unit) = if s.is_multiple_of(86_400) {
        (s / 86_400, "day")
    } else if s.is_multiple_of(3600) {
        (s / 3600, "hour")
    } else if s.is_multiple_of(60) {
        (s / 60, "minute")
    } else {
        (s, "second")
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
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
        assert_eq!(for_how_long(std::time::Duration::from_secs(600)), "10 minutes");
        assert_eq!(for_how_long(std::time::Duration::from_secs(3600)), "1 hour");
        assert_eq!(for_how_long(std::time::Duration::from_secs(90)), "90 seconds");
        assert_eq!(ago(120_000, 0), "2 min ago");
    }
}
