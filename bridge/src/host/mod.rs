//! `thunderbolt host`: every agent described in `$THUNDERBOLT_HOME/agents.d/`,
//! served by one process.
//!
//! Each agent gets an endpoint of its own (its own NodeId and ticket, so the
//! clients that exist today, the Thunderbolt app's included, reach it without
//! picking an agent), all through the serving core's one admission
//! ([`crate::serve::Bridge`]): one gate and handshake cap, one pool of agent
//! slots (`--max-agents`) beside each agent's `max_sessions`, one allow file,
//! one account credential and heartbeat. The folder is watched: a new valid
//! file serves within about a second, a changed one applies to new sessions
//! (running ones keep what they started with; a changed identity or protocol
//! is a new endpoint, so its old sessions end), a removed one stops its agent
//! and ends its sessions with [`crate::serve::REASON_AGENT_REMOVED`].
//!
//! Account trust: every hosted agent's NodeId is registered with the account
//! as a device of its own (`<hostname> (<label>)`), so the account's list,
//! fetched once per heartbeat, says of each whether it is still trusted; a
//! revoked agent loses its account trust, and only it.

pub mod folder;
pub mod manifest;
pub mod plan;
pub mod ports;

use std::{collections::HashMap, sync::Arc};

use anyhow::Result;
use iroh::{EndpointAddr, TransportAddr};
use thunderbolt_shared::{node_id_base32, EndpointTicket};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    config::Config,
    home::Home,
    host::{folder::Folder, manifest::AgentSpec, plan::AgentPlan},
    identity,
    net::NetConfig,
    serve::{accept, taps::TapSource, AgentConfig, AgentName, Change, Served},
    trust::{self, account, allowfile::LiveAllowFile, TrustPolicy},
};

/// What every hosted agent shares.
pub struct HostContext {
    pub home: Home,
    pub net: NetConfig,
    pub config: Config,
    pub allow: Arc<LiveAllowFile>,
    /// The devices that paired with one agent by a code (each agent trusts its own).
    pub devices: Arc<crate::devices::Devices>,
    /// The account credential (each agent registers with it), or why there is none.
    pub credential: Result<account::Backend, account::OffReason>,
    /// Endpoints bound so far: after the first, a fixed `--bind` port would
    /// clash, so the others take any free port on the same address.
    bound: std::sync::atomic::AtomicUsize,
}

/// One agent as the host started it, for the banner and `agents list`.
#[derive(Debug, Clone)]
pub struct Started {
    pub name: String,
    pub label: String,
    pub protocol: String,
    pub addr: EndpointAddr,
    pub account: String,
    /// Why its relay was not reached at start, when it was not.
    pub relay_problem: Option<String>,
    /// Its identity was created by this start (a new NodeId).
    pub new_identity: bool,
}

impl Started {
    pub fn ticket(&self) -> EndpointTicket {
        EndpointTicket::new(self.addr.clone())
    }
}

impl HostContext {
    pub fn new(
        home: Home,
        net: NetConfig,
        config: Config,
        credential: Result<account::Backend, account::OffReason>,
    ) -> Self {
        let allow = Arc::new(crate::trust::allowfile::live(home.allowlist_path()));
        let devices = Arc::new(crate::devices::Devices::new(&home));
        Self { home, net, config, allow, devices, credential, bound: 0.into() }
    }

    /// Binds `spec`'s endpoint with its identity and starts serving it.
    pub async fn start(&self, spec: &AgentSpec) -> Result<(Arc<Served>, Started)> {
        self.start_plan(&AgentPlan::from_spec(spec, &self.config, &self.home)?).await
    }

    /// The one builder of a served agent (a manifest's or the single-agent
    /// bridge's): its identity, its endpoint, its account registration, then
    /// how its sessions run and who may reach it.
    pub async fn start_plan(&self, plan: &AgentPlan) -> Result<(Arc<Served>, Started)> {
        let (key, origin) = identity::load_or_create_named(&self.home, &plan.identity_file)?;
        let mut net = self.net.clone();
        if self.bound.fetch_add(1, std::sync::atomic::Ordering::AcqRel) > 0 {
            if let Some(b) = net.bind.as_mut() {
                b.set_port(0);
            }
        }
        let alpns = accept::alpns(&plan.protocol, plan.resume.is_some());
        let ep = ports::bind(&self.home, &net, key, alpns, self.config.idle_timeout).await?;
        let (addr, relay_problem) = crate::net::reachable_addr(&ep, &net).await;
        let (account, account_status) = match &self.credential {
            Err(why) => (None, account::AccountStatus::Off(why.clone()).to_string()),
            Ok(backend) => {
                let a = account::Account::start(backend.clone(), ep.id(), &plan.account_name).await;
                let status = a.trust.status().to_string();
                (Some(Arc::new(a)), status)
            }
        };
        let config = self.agent_config(plan, account, ep.id());
        let started = Started {
            relay_problem,
            name: plan.name.to_string(),
            label: plan.label.clone(),
            protocol: plan.protocol.to_string(),
            addr,
            account: account_status,
            new_identity: origin == identity::Origin::Created,
        };
        let served = Served::new(ep, config);
        served.relay.configured(&net.relays);
        Ok((served, started))
    }

    /// How `plan`'s sessions run and who may reach it.
    pub fn agent_config(
        &self,
        plan: &AgentPlan,
        account: Option<Arc<account::Account>>,
        node: iroh::EndpointId,
    ) -> AgentConfig {
        let mut session = self.config.session(plan.command.clone());
        session.resume = plan.resume;
        session.keep_warm = plan.keep_warm;
        session.idle_stop = plan.idle_stop;
        let own: Option<Arc<dyn TrustPolicy>> = plan.own_devices.then(|| {
            let mut layers: Vec<Arc<dyn TrustPolicy>> = Vec::new();
            if let Some(a) = &account {
                layers.push(a.trust.clone());
            }
            layers.push(self.allow.clone());
            Arc::new(trust::Layered { layers }) as Arc<dyn TrustPolicy>
        });
        let paired = plan.name.manifest_name().filter(|_| plan.paired).map(|name| {
            Arc::new(crate::devices::PairedWith { devices: self.devices.clone(), agent: name.into() })
                as Arc<dyn TrustPolicy>
        });
        let scope_name: Arc<str> = plan.name.scope_name(&plan.protocol.to_string()).into();
        // Then the guests of its sessions' shares; each device narrowed by its scope.
        let shares =
            Arc::new(crate::devices::SharedWith { devices: self.devices.clone(), agent: scope_name.clone() });
        let admits = trust::Layered {
            layers: vec![Arc::new(trust::AcceptFrom { own, ids: plan.ids.clone(), paired }), shares],
        };
        let trust: Arc<dyn TrustPolicy> = Arc::new(crate::devices::Scoped {
            inner: Arc::new(admits),
            devices: self.devices.clone(),
            agent: scope_name,
        });
        session.taps = self.config.notify.clone().map(|notifier| {
            Arc::new(crate::notify::session::AgentNotify {
                notifier,
                agent: plan.notice_agent.as_str().into(),
                label: plan.notice_label.as_str().into(),
                trust: trust.clone(),
                node: node.to_string().into(),
                protocol: plan.protocol.as_str().into(),
            }) as Arc<dyn TapSource>
        });
        AgentConfig {
            name: plan.name.clone(),
            label: plan.label.as_str().into(),
            protocol: plan.protocol.to_string(),
            trust,
            session: Arc::new(session),
            max_sessions: plan.max_sessions,
            account,
            bridge_identity: plan.on_bridge_identity(),
            own_devices: plan.own_devices,
        }
    }
}

/// Whether a changed manifest needs a new endpoint (a new NodeId or ALPN
/// family): then its old sessions end; otherwise new sessions just run with it.
pub fn needs_new_endpoint(old: &AgentSpec, new: &AgentSpec) -> bool {
    old.identity != new.identity || old.protocol != new.protocol
}

/// Logs what a read of the folder refused and warned about, one line each.
pub fn report(loaded: &folder::Loaded) {
    if let Some(why) = &loaded.folder {
        warn!("agents.d refused: {why}");
    }
    for (file, why) in &loaded.refused {
        warn!("skipping {}: {why}", file.display());
    }
    for spec in loaded.agents.values() {
        for w in &spec.warnings {
            warn!(agent = %spec.name, "{w}");
        }
    }
}

/// Watches the folder and asks the running bridge to follow it. `served`:
/// the agents it serves now, by name.
pub async fn watch(
    ctx: Arc<HostContext>,
    mut folder: Folder,
    mut current: folder::Loaded,
    mut served: HashMap<String, Arc<Served>>,
    changes: mpsc::UnboundedSender<Change>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(folder::POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(next) = folder.changed() else { continue };
        let diff = folder::diff(&current, &next);
        // New refusals and warnings, once each.
        let fresh = folder::Loaded {
            agents: diff.added.iter().chain(&diff.changed).map(|s| (s.name.clone(), s.clone())).collect(),
            refused: next.refused.iter().filter(|r| !current.refused.contains(r)).cloned().collect(),
            folder: next.folder.clone().filter(|_| next.folder != current.folder),
        };
        report(&fresh);
        for name in &diff.removed {
            info!(agent = %name, "manifest removed: no longer serving {name}; its sessions end");
            served.remove(name);
            let _ = changes.send(Change::Remove(AgentName::hosted(name)));
        }
        let mut to_start: Vec<&AgentSpec> = Vec::new();
        for spec in &diff.changed {
            let old = &current.agents[&spec.name];
            let running = served.get(&spec.name).cloned();
            match running {
                Some(agent) if !needs_new_endpoint(old, spec) => {
                    // Same endpoint: new sessions get the new settings.
                    match AgentPlan::from_spec(spec, &ctx.config, &ctx.home) {
                        Ok(plan) => {
                            let cfg =
                                ctx.agent_config(&plan, agent.config().account.clone(), agent.endpoint.id());
                            agent.endpoint.set_alpns(accept::alpns(&plan.protocol, plan.resume.is_some()));
                            info!(agent = %spec.name, "manifest changed: new sessions of {} use it; running ones keep theirs", spec.name);
                            let _ = changes.send(Change::Replace(cfg));
                        }
                        Err(e) => warn!(agent = %spec.name, "cannot apply the changed manifest: {e:#}"),
                    }
                }
                _ => {
                    info!(agent = %spec.name, "manifest changed its identity or protocol: restarting {}; its sessions end", spec.name);
                    let _ = changes.send(Change::Remove(AgentName::hosted(&spec.name)));
                    served.remove(&spec.name);
                    to_start.push(spec);
                }
            }
        }
        to_start.extend(diff.added.iter());
        // Started together: an unreachable relay's wait (5 s) is paid once per
        // look at the folder, not once per agent in turn.
        let started =
            futures::future::join_all(to_start.iter().map(|spec| start_and_add(&ctx, spec, &changes))).await;
        for (spec, agent) in to_start.iter().zip(started) {
            if let Some(a) = agent {
                served.insert(spec.name.clone(), a);
            }
        }
        current = next;
    }
}

async fn start_and_add(
    ctx: &HostContext,
    spec: &AgentSpec,
    changes: &mpsc::UnboundedSender<Change>,
) -> Option<Arc<Served>> {
    match ctx.start(spec).await {
        Ok((served, started)) => {
            info!(
                agent = %spec.name,
                "now serving {} ({}, {}) as {}; ticket {}",
                spec.name,
                spec.label,
                spec.protocol,
                started.addr.id,
                started.ticket()
            );
            let _ = changes.send(Change::Add(served.clone()));
            Some(served)
        }
        Err(e) => {
            warn!(agent = %spec.name, "cannot serve {}: {e:#}", spec.name);
            None
        }
    }
}

/// The host's banner: every agent with its NodeId and ticket, what was refused.
pub fn banner(
    dir: &std::path::Path,
    started: &[Started],
    loaded: &folder::Loaded,
    allow_file: &std::path::Path,
    notify: &str,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "thunderbolt host is serving {} agent(s) from {}", started.len(), dir.display());
    if started.is_empty() {
        let _ = writeln!(
            s,
            "  (none yet: add a manifest, e.g. {}/my-agent.json with {{\"name\": \"my-agent\", \"command\": [\"my-agent\", \"--acp\"]}}; it is picked up without a restart)",
            dir.display()
        );
    }
    // Agents share their relays: one cause they all share is said once, not per agent.
    let shared_problem = match started.split_first() {
        Some((first, rest)) if rest.iter().all(|a| a.relay_problem == first.relay_problem) => {
            first.relay_problem.clone()
        }
        _ => None,
    };
    for a in started {
        let _ = writeln!(s, "  {} ({}, {})", a.name, a.label, a.protocol);
        let _ = writeln!(s, "    NodeId:  {}  ({})", a.addr.id, node_id_base32(&a.addr.id));
        let _ = writeln!(s, "    Ticket:  {}", a.ticket());
        let _ = writeln!(s, "    Account: {}", a.account);
        if let Some(why) = a.relay_problem.as_ref().filter(|_| shared_problem.is_none()) {
            let _ = writeln!(
                s,
                "    Relay:   NOT reachable ({why}); browsers cannot reach this agent until it is"
            );
        }
    }
    if let Some(why) = &shared_problem {
        let _ = writeln!(
            s,
            "  Relay:   NOT reachable ({why}); browsers cannot reach {} until it is",
            if started.len() == 1 { "this agent" } else { "these agents" }
        );
    }
    for (file, why) in &loaded.refused {
        let _ = writeln!(s, "  Refused: {}: {why}", file.display());
    }
    let _ = writeln!(s, "  Notify:  {notify}");
    let _ = writeln!(s, "  Trust:   allow file {} (and each agent's accept_from)", allow_file.display());
    if !started.is_empty() {
        let _ = writeln!(
            s,
            "  Pair:    {}; one code is for every agent here that admits your own devices (--agent NAME for some)",
            crate::cli::banner::PAIR_HINT
        );
    }
    let _ = writeln!(s, "{}", crate::cli::banner::ALLOW_LINE);
    s
}

/// An offline address for an agent (its NodeId and the configured relays),
/// for `agents list` when no host runs.
pub fn offline_addr(id: iroh::EndpointId, net: &NetConfig) -> EndpointAddr {
    EndpointAddr::from_parts(id, net.relays.urls().into_iter().map(TransportAddr::Relay))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(n: u8, relay_problem: Option<&str>) -> Started {
        Started {
            name: format!("agent{n}"),
            label: format!("Agent {n}"),
            protocol: "acp".into(),
            addr: EndpointAddr::new(iroh::SecretKey::from_bytes(&[n; 32]).public()),
            account: "off".into(),
            relay_problem: relay_problem.map(str::to_string),
            new_identity: false,
        }
    }

    fn render(agents: &[Started]) -> String {
        let p = std::path::Path::new("/h");
        banner(p, agents, &folder::Loaded::default(), p, "off")
    }

    #[test]
    fn the_banner_says_a_shared_relay_problem_once_and_how_to_pair() {
        let why = "http://127.0.0.1:1/ nothing listens there (connection refused)";
        let all = render(&[started(1, Some(why)), started(2, Some(why)), started(3, Some(why))]);
        assert_eq!(all.matches("connection refused").count(), 1, "{all}");
        assert!(all.contains("browsers cannot reach these agents until it is"), "{all}");
        // Different causes are each the agent's own.
        let two = render(&[started(1, Some(why)), started(2, None)]);
        assert_eq!(two.matches("connection refused").count(), 1, "{two}");
        assert!(two.contains("    Relay:   NOT reachable"), "under its agent: {two}");
        assert!(!render(&[started(1, None), started(2, None)]).contains("NOT reachable"));
        // How to pair, and the last line scripts wait for.
        assert!(all.contains("Pair:    run `thunderbolt iroh pair` here"), "{all}");
        assert!(all.trim_end().lines().last().unwrap().trim_start().starts_with("Allow a peer:"), "{all}");
    }
}
