//! `thunderbolt share SESSION`: a one-time code that lets another person's
//! device into one live session, watching or driving, until it ends.
//!
//! The code is a pairing code (`/pair1` redeems it; `connect --pair` and the
//! page's pairing link work unchanged) whose scope names the session: the
//! device it admits is a share's guest (`devices::How::Share`), admitted by
//! nothing else, seeing nothing else.

use anyhow::{bail, Result};
use serde_json::json;
use thunderbolt_shared::{pairing as pairing_wire, Protocol};

use super::{
    args::ShareArgs,
    control_cmd::EXIT_NOT_RUNNING,
    pair_cmd::{for_how_long, pairing_link},
};
use crate::{
    devices::{now_ms, rfc3339, scope::Verbs},
    home::Home,
    pairing::{CodeScope, Pairings, Target},
};

pub fn share(home: &Home, a: ShareArgs) -> Result<()> {
    let net = a.net.config()?;
    let replies = crate::control::client::each(home, |c| c.status());
    if replies.is_empty() {
        eprintln!(
            "no bridge is running on {}: a share is of a live session (start one with `thunderbolt host`)",
            home.root_path().display()
        );
        std::process::exit(EXIT_NOT_RUNNING);
    }
    let found = replies.into_iter().filter_map(|(_, r)| r.ok()).find_map(|st| {
        let s = st.sessions.iter().find(|s| s.id == a.session)?.clone();
        let agent = st.agents.iter().find(|ag| ag.name == s.agent)?.clone();
        Some((s, agent))
    });
    let Some((session, agent)) = found else {
        bail!(
            "'{}' is no live session here: `thunderbolt status` lists them by id; nothing was shared",
            a.session
        );
    };
    if session.state == "warm" || session.protocol.as_deref() == Some("0") {
        bail!(
            "session {} is a plain one (its client speaks thunderbolt/{}/0): only resumable sessions can be joined, so it cannot be shared",
            a.session,
            agent.protocol
        );
    }
    let protocol: Protocol = agent.protocol.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let verbs: Verbs =
        if a.drive { "prompt,answer".parse() } else { "observe".parse() }.map_err(anyhow::Error::msg)?;
    let until_ms = now_ms().saturating_add(a.for_.as_millis() as u64);
    let (target, scope_agent) = if agent.name.is_empty() {
        (Target::Bridge(agent.protocol.clone()), agent.protocol.clone())
    } else {
        (Target::Agent(agent.name.clone()), agent.name.clone())
    };
    let scope = CodeScope {
        verbs,
        for_ms: None,
        until_ms: Some(until_ms),
        session: Some(session.id.clone()),
        agent: Some(scope_agent),
    };
    let name = a.name.as_deref().and_then(pairing_wire::clean_name);
    // A code that outlives its share would admit nobody: it waits at most as long.
    let valid = a.expires.min(a.for_);
    let code = Pairings::new(home).mint_scoped(&[target], name.clone(), valid, Some(scope))?;
    let ticket = agent.ticket.clone();
    let command = format!("thunderbolt {protocol} connect --pair {code} {ticket}");
    let link = pairing_link(&net, a.app_url.clone(), &protocol, &ticket, &code);
    let what = if a.drive { "watch and drive (prompt, answer)" } else { "watch only" };
    let of = session.device.clone().unwrap_or_else(|| session.peer_short.clone());
    if a.json {
        println!(
            "{}",
            json!({
                "code": code, "ticket": ticket, "command": command, "link": link, "session": session.id,
                "agent": agent.name, "verbs": verbs, "until": rfc3339(until_ms), "name": name,
                "expires": rfc3339(now_ms().saturating_add(valid.as_millis() as u64)),
            })
        );
        return Ok(());
    }
    println!(
        "A one-time share of session {} ({}'s, {}) for another person's device: it may {what}, until {} ({}).",
        session.id,
        of,
        if agent.label.is_empty() { "the agent" } else { &agent.label },
        rfc3339(until_ms),
        for_how_long(a.for_)
    );
    println!("The first device to redeem it (within {}) gets it; no other can.\n", for_how_long(valid));
    println!("On their device, run:\n  {command}\n");
    if let Some(link) = &link {
        println!("or open this link in its browser:\n  {link}\n");
    }
    if !a.no_qr {
        println!("{}", super::iroh_cmd::qr(link.as_deref().unwrap_or(&command))?);
    }
    println!(
        "`thunderbolt status` shows them on the session; `thunderbolt kick <their name>` ends it at once."
    );
    Ok(())
}
