//! `thunderbolt iroh pair`: mints one code and says how to use it.
//!
//! What the code is for follows what runs here: while a host runs (or none
//! does, and `agents.d` has agents for your own devices), one code for every
//! agent of the host that admits your own devices, redeemable at any of
//! them; with `--agent NAME…`, those agents only; else this machine's
//! single-agent bridge, as before hosts existed.

use anyhow::{bail, Result};
use iroh::{EndpointAddr, EndpointId, TransportAddr};
use serde_json::json;
use thunderbolt_shared::{node_id_base32, pairing as pairing_wire, EndpointTicket, Protocol};

use crate::{
    cli::{args::PairArgs, banner::pairing_url, iroh_cmd::qr},
    control::api::Status,
    devices::scope::Verbs,
    devices::{now_ms, rfc3339},
    home::Home,
    host::{folder, manifest::Machine},
    identity,
    net::NetConfig,
    pairing::{CodeScope, Pairings, Target},
};

/// One agent a code pairs with, as the device will dial it.
#[derive(Debug, Clone)]
struct Reached {
    /// The manifest's name (empty for a single-agent bridge).
    name: String,
    label: String,
    protocol: Protocol,
    id: EndpointId,
    ticket: EndpointTicket,
}

/// What a code is minted for.
#[derive(Debug)]
struct Plan {
    /// "agent claude (Claude Code)", "every agent of this host that admits your own devices".
    what: String,
    targets: Vec<Target>,
    /// The agents the device may reach once paired; the first is the one it dials.
    agents: Vec<Reached>,
    /// Whether what serves them runs now.
    running: bool,
    /// What to say when it does not run.
    start: String,
    /// Whether this is a host's code (the JSON's `agents`).
    hosted: bool,
}

/// How long `iroh pair` waits for a self-hosted relay to say whether it
/// serves the app: a relay on the way answers in milliseconds; one that is off
/// must not hold up the code.
const RELAY_APP_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// The most of `relay.json` read: it is `{"thunderbolt_relay":true}`.
const RELAY_APP_ANSWER_MAX: usize = 1024;

/// `<relay>/app` when the first self-hosted relay serves the app
/// (thunderbolt-relay's `app_dir`: its `/app/relay.json` says
/// `thunderbolt_relay`), else `None`. Asked from a thread of its own: the
/// command runs inside the CLI's runtime, which must not be blocked on.
fn relay_app(net: &NetConfig) -> Option<String> {
    let crate::net::Relays::Custom(urls) = &net.relays else { return None };
    let relay = urls.first()?.clone();
    let probe = relay.join("app/relay.json").ok()?;
    let ask = move || -> Option<String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        // As relays are asked (`RelayCheck`): a relay with a private CA
        // answers like any other (the phone checks it when it opens the page).
        let client = crate::net::RelayCheck::client(None)?;
        rt.block_on(async {
            let ask = async {
                let r = client.get(probe).send().await.ok()?;
                if !r.status().is_success()
                    || r.content_length().is_some_and(|n| n > RELAY_APP_ANSWER_MAX as u64)
                {
                    return None;
                }
                r.bytes().await.ok()
            };
            let body = tokio::time::timeout(RELAY_APP_CHECK, ask).await.ok()??;
            let said: serde_json::Value =
                serde_json::from_slice(body.get(..RELAY_APP_ANSWER_MAX).unwrap_or(&body)).ok()?;
            (said["thunderbolt_relay"] == true)
                .then(|| format!("{}/app", relay.as_str().trim_end_matches('/')))
        })
    };
    std::thread::spawn(ask).join().ok().flatten()
}

/// The link a device's browser opens to redeem `code` at `ticket`: the
/// app's page (`app_url`, else a self-hosted relay's `/app` when it serves
/// one) with the ticket, the code and a self-hosted relay in its #fragment.
pub(super) fn pairing_link(
    net: &NetConfig,
    app_url: Option<String>,
    protocol: &Protocol,
    ticket: &str,
    code: &str,
) -> Option<String> {
    // A self-hosted relay rides along: a browser has no other way to learn it.
    let relay = match &net.relays {
        crate::net::Relays::Custom(urls) => {
            urls.first().map(|u| format!("&relay={}", fragment_escape(u.as_str())))
        }
        _ => None,
    };
    // No app address given: a self-hosted relay that serves the app is one,
    // so the link (and the QR code) opens a page a phone can use.
    let app_url = app_url.or_else(|| relay_app(net));
    pairing_url(app_url.as_deref(), protocol)
        .map(|page| format!("{page}#ticket={ticket}&pair={code}{}", relay.unwrap_or_default()))
}

pub fn pair(home: &Home, a: PairArgs) -> Result<()> {
    let net = a.net.config()?;
    let statuses: Vec<Status> =
        crate::control::client::each(home, |c| c.status()).into_iter().filter_map(|(_, r)| r.ok()).collect();
    let plan = plan(home, &a, &net, &statuses)?;
    let Some(first) = plan.agents.first().cloned() else { bail!("nothing to pair with") };
    let name = a.name.as_deref().and_then(pairing_wire::clean_name);
    let scope = (a.scope.is_some() || a.for_.is_some()).then(|| CodeScope {
        verbs: a.scope.unwrap_or(Verbs::ALL),
        for_ms: a.for_.map(|d| d.as_millis() as u64),
        until_ms: None,
        session: None,
        agent: None,
    });
    let code = Pairings::new(home).mint_scoped(&plan.targets, name.clone(), a.expires, scope.clone())?;
    let scope_words = scope.as_ref().map(|s| {
        let verbs = if s.verbs.is_all() { "everything".to_string() } else { s.verbs.to_string() };
        match a.for_ {
            Some(d) => format!("{verbs}, for {} from pairing", for_how_long(d)),
            None => verbs,
        }
    });
    let (protocol, ticket, id) = (&first.protocol, &first.ticket, first.id);
    let command = format!("thunderbolt {protocol} connect --pair {code} {ticket}");
    let link = pairing_link(&net, a.app_url.clone(), protocol, &ticket.to_string(), &code);
    let expires_ms = now_ms().saturating_add(a.expires.as_millis() as u64);
    let no_address = ticket.endpoint_addr().addrs.is_empty();
    if a.json {
        let agents: Vec<_> = plan
            .agents
            .iter()
            .filter(|_| plan.hosted)
            .map(|r| {
                json!({
                    "name": r.name, "label": r.label, "protocol": r.protocol.as_str(),
                    "nodeId": r.id.to_string(), "ticket": r.ticket.to_string(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "code": code, "ticket": ticket.to_string(), "command": command, "link": link,
                "nodeId": id.to_string(), "nodeIdBase32": node_id_base32(&id), "protocol": protocol.as_str(),
                "agent": a.agent.first(), "agents": agents, "name": name, "expires": rfc3339(expires_ms),
                "bridgeRunning": plan.running,
                "scope": scope.as_ref().map(|s| json!({"verbs": s.verbs, "forMs": s.for_ms})),
            })
        );
        return Ok(());
    }
    println!(
        "One-time pairing code for {}: pairs one device, valid {}.\n",
        plan.what,
        for_how_long(a.expires)
    );
    if let Some(words) = &scope_words {
        println!("The device may do: {words}.\n");
    }
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
    if plan.agents.len() > 1 {
        println!(
            "It dials {} ({}); the code pairs at any of these, and the device learns every one's ticket when it pairs:",
            first.name,
            id.fmt_short()
        );
        for r in &plan.agents {
            println!("  {} ({}, {})  {}", r.name, r.label, r.protocol, r.ticket);
        }
        println!();
    }
    if !a.no_qr {
        // The link when there is one: a phone's camera opens it.
        println!("{}", qr(link.as_deref().unwrap_or(&command))?);
    }
    if !plan.running {
        println!("{}", plan.start);
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

/// Tells the device's user (`connect --pair`'s log) every agent the pairing
/// lets it reach, from the bridge's answer: each with the line that reaches it.
pub fn tell_agents(answer: &serde_json::Value, protocol: &Protocol) {
    let Ok(answer) = serde_json::from_value::<pairing_wire::Answer>(answer.clone()) else { return };
    if answer.agents.is_empty() {
        return;
    }
    tracing::info!("this device may now reach {} agent(s) of that host:", answer.agents.len());
    for a in &answer.agents {
        let p = if a.protocol == protocol.as_str() { protocol.as_str() } else { a.protocol.as_str() };
        tracing::info!("  {} ({}): thunderbolt {p} connect {}", a.name, a.label, a.ticket);
    }
}

/// What `a` asks a code for, given what runs here.
fn plan(home: &Home, a: &PairArgs, net: &NetConfig, statuses: &[Status]) -> Result<Plan> {
    let host = statuses.iter().find(|s| s.kind == "host");
    let dir = home.agents_dir();
    // A running host's ticket carries its direct addresses; else the configured relays.
    let reached = |spec: &crate::host::manifest::AgentSpec| -> Result<Reached> {
        let (key, _) = identity::load_or_create_named(home, &spec.identity.file_name(&spec.name))?;
        let id = key.public();
        let ticket = live_ticket(host.into_iter(), &id).unwrap_or_else(|| offline_ticket(id, net));
        Ok(Reached {
            name: spec.name.clone(),
            label: spec.label.clone(),
            protocol: spec.protocol.clone(),
            id,
            ticket,
        })
    };
    let start = "No host serves these agents right now: start it before the device dials (thunderbolt host)."
        .to_string();
    if !a.agent.is_empty() {
        let loaded = folder::load_dir(&dir, &Machine::this());
        let mut agents = Vec::new();
        for name in &a.agent {
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
            if !agents.iter().any(|r: &Reached| r.name == *name) {
                agents.push(reached(spec)?);
            }
        }
        let what = agents.iter().map(|r| format!("{} ({})", r.name, r.label)).collect::<Vec<_>>().join(", ");
        return Ok(Plan {
            what: format!("{} {what}", if agents.len() == 1 { "agent" } else { "agents" }),
            targets: agents.iter().map(|r| Target::Agent(r.name.clone())).collect(),
            running: host.is_some(),
            agents,
            start,
            hosted: true,
        });
    }
    let protocol = Protocol::parse_known(&a.protocol)?;
    let (key, _) = identity::load_or_create_named(home, &protocol.identity_file_name())?;
    let bridge_id = key.public();
    let bridge_live = live_ticket(statuses.iter().filter(|s| s.kind != "host"), &bridge_id);
    // The host's agents for your own devices: while a host runs, or while
    // nothing runs and it has some (it is what `service install` starts).
    let own: Vec<Reached> = if host.is_some() || bridge_live.is_none() {
        let loaded = folder::load_dir(&dir, &Machine::this());
        let mut own = Vec::new();
        for spec in loaded.agents.values().filter(|s| s.accept_from.own_devices) {
            own.push(reached(spec)?);
        }
        own
    } else {
        Vec::new()
    };
    let targets = vec![Target::Bridge(protocol.to_string()), Target::OwnDevices];
    if host.is_some() && own.is_empty() {
        bail!(
            "no agent of the running host admits your own devices (each manifest's accept_from): \
             pair with one by name, `thunderbolt iroh pair --agent NAME`"
        );
    }
    if !own.is_empty() {
        let mut agents = own;
        // The device dials the agent on the bridge's identity if there is one
        // (its ticket stays the one a bridge here always had), else the
        // first of the protocol asked for.
        let first = agents
            .iter()
            .position(|r| r.id == bridge_id)
            .or_else(|| agents.iter().position(|r| r.protocol == protocol))
            .unwrap_or(0);
        agents.swap(0, first);
        agents[1..].sort_by(|x, y| x.name.cmp(&y.name));
        let names = agents.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ");
        return Ok(Plan {
            what: format!("every agent of this host that admits your own devices ({names})"),
            targets,
            running: host.is_some(),
            agents,
            start,
            hosted: true,
        });
    }
    let running = bridge_live.is_some();
    let ticket = bridge_live.unwrap_or_else(|| offline_ticket(bridge_id, net));
    Ok(Plan {
        what: format!("this machine's {protocol} bridge (NodeId {})", bridge_id.fmt_short()),
        targets,
        agents: vec![Reached {
            name: String::new(),
            label: protocol.to_string(),
            protocol: protocol.clone(),
            id: bridge_id,
            ticket,
        }],
        running,
        start: format!(
            "No bridge serves this NodeId right now: start it before the device dials \
             (thunderbolt {protocol} --transport iroh -- <agent-cmd…>, or thunderbolt host)."
        ),
        hosted: false,
    })
}

/// The ticket one of `statuses`' bridges serves `id` with, if one does.
fn live_ticket<'s>(statuses: impl Iterator<Item = &'s Status>, id: &EndpointId) -> Option<EndpointTicket> {
    statuses
        .flat_map(|s| s.agents.iter())
        .find(|a| a.node_id == id.to_string())
        .and_then(|a| a.ticket.parse().ok())
}

/// `id` at the configured relays (no direct addresses: those exist only
/// while a bridge runs, and its banner has them).
fn offline_ticket(id: EndpointId, net: &NetConfig) -> EndpointTicket {
    EndpointTicket::new(EndpointAddr::from_parts(id, net.relays.urls().into_iter().map(TransportAddr::Relay)))
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

/// "10 minutes", "1 hour", "90 seconds".
pub(super) fn for_how_long(d: std::time::Duration) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(for_how_long(std::time::Duration::from_secs(600)), "10 minutes");
        assert_eq!(for_how_long(std::time::Duration::from_secs(3600)), "1 hour");
        assert_eq!(for_how_long(std::time::Duration::from_secs(90)), "90 seconds");
        assert_eq!(fragment_escape("http://127.0.0.1:3340/?a=b"), "http://127.0.0.1:3340/%3Fa%3Db");
    }
}
