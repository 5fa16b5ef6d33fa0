//! `thunderbolt iroh id | pair | allow | deny | list`.

use anyhow::{Context, Result};
use iroh::{EndpointAddr, TransportAddr};
use serde_json::json;
use thunderbolt_shared::{node_id_base32, parse_node_id, EndpointTicket, Protocol};

use crate::{cli::args::IrohCmd, home::Home, identity, trust::allowfile};

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
        IrohCmd::Pair(a) => {
            let (protocol, id, ticket) = offline_ticket(home, &a.protocol, &a.net)?;
            let (dial_id, _) = identity::load_or_create(home, &Protocol::acp())?;
            if a.json {
                println!(
                    "{}",
                    json!({
                        "protocol": protocol.as_str(),
                        "nodeId": id.to_string(),
                        "nodeIdBase32": node_id_base32(&id),
                        "ticket": ticket.to_string(),
                        "dialerNodeId": dial_id.public().to_string(),
                    })
                );
                return Ok(());
            }
            println!("Pairing ticket for this machine's {protocol} bridge (NodeId {id}):\n");
            println!("  {ticket}\n");
            println!("On this machine (the workstation), run the bridge:");
            println!(
                "  thunderbolt {protocol} --transport iroh{}",
                if protocol == Protocol::acp() { "" } else { " -- <server-cmd…>" }
            );
            println!("  (its banner prints a fresher ticket that also carries direct addresses)\n");
            println!("On the other machine, print its NodeId:");
            println!("  thunderbolt iroh id");
            println!("then allow that NodeId here:");
            println!("  thunderbolt iroh allow <its-nodeid>");
            println!("and connect from there:");
            println!("  thunderbolt {protocol} connect {ticket}\n");
            if !a.no_qr {
                println!("{}", qr(&ticket.to_string())?);
            }
        }
        IrohCmd::Allow(a) => {
            let id = parse_node_id(&a.node_id)?;
            let path = home.allowlist_path();
            let added = allowfile::allow(&path, &id)?;
            if a.json {
                println!("{}", json!({"nodeId": id.to_string(), "added": added, "path": path}));
            } else if added {
                println!("allowed {id} (in {})", path.display());
            } else {
                println!("{id} was already allowed (in {})", path.display());
            }
        }
        IrohCmd::Deny(a) => {
            let id = parse_node_id(&a.node_id)?;
            let path = home.allowlist_path();
            let removed = allowfile::deny(&path, &id)?;
            // Running bridges re-check now instead of at their next heartbeat.
            let ended: u64 = crate::control::client::ask_all(home, "POST", "/v1/recheck", None)
                .iter()
                .map(|(_, r)| r.body["ended"].as_u64().unwrap_or(0))
                .sum();
            if a.json {
                println!(
                    "{}",
                    json!({"nodeId": id.to_string(), "removed": removed, "path": path, "sessionsEnded": ended})
                );
            } else if removed {
                let live = if ended > 0 { format!("; {ended} live session(s) ended") } else { String::new() };
                println!("removed {id} from {}; its next connection is refused{live}", path.display());
            } else {
                println!("{id} was not in {}", path.display());
            }
        }
        IrohCmd::List(a) => {
            let path = home.allowlist_path();
            let allowed = allowfile::read(&path)?;
            for bad in &allowed.bad_lines {
                eprintln!("warning: {}:{}: ignored: {}", path.display(), bad.line_no, bad.error);
            }
            if a.json {
                let ids: Vec<String> = allowed.ids.iter().map(|i| i.to_string()).collect();
                let bad: Vec<_> =
                    allowed.bad_lines.iter().map(|b| json!({"line": b.line_no, "error": b.error})).collect();
                println!("{}", json!({"path": path, "nodeIds": ids, "badLines": bad}));
            } else if allowed.ids.is_empty() {
                eprintln!(
                    "no peers allowed yet ({}); add one with: thunderbolt iroh allow <nodeid>",
                    path.display()
                );
            } else {
                for id in &allowed.ids {
                    println!("{id}");
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

/// The ticket as a terminal QR code (two modules per character cell).
pub fn qr(data: &str) -> Result<String> {
    use qrcode::{render::unicode, EcLevel, QrCode};
    let code = QrCode::with_error_correction_level(data.as_bytes(), EcLevel::L)
        .context("ticket too long for a QR code")?;
    Ok(code.render::<unicode::Dense1x2>().quiet_zone(true).build())
}
