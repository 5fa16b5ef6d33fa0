//! One agent to serve, whoever described it: a manifest in `agents.d` (the
//! host) or the single-agent bridge's flags (`thunderbolt acp --transport
//! iroh -- <agent>`, a host of one agent made in memory). Both are started
//! by [`super::HostContext::start_plan`], the one builder of a served agent:
//! its identity and endpoint, its account registration, its trust layers,
//! its notices and its sessions' settings.

use std::{collections::HashSet, time::Duration};

use anyhow::{Context, Result};
use iroh::EndpointId;
use thunderbolt_shared::Protocol;

use super::manifest::AgentSpec;
use crate::{
    config::Config,
    serve::{agent::AgentCommand, sessions::ResumeConfig, AgentName},
    trust::account,
};

/// Everything that differs between served agents.
#[derive(Debug, Clone)]
pub struct AgentPlan {
    pub name: AgentName,
    /// What `status` calls it.
    pub label: String,
    pub protocol: Protocol,
    pub command: AgentCommand,
    /// Its identity's file in `$THUNDERBOLT_HOME/iroh/`.
    pub identity_file: String,
    /// What notices call it, and the agent they name.
    pub notice_label: String,
    pub notice_agent: String,
    /// The name it registers under with the account.
    pub account_name: String,
    /// Whether your own devices (the allow file, the account) reach it.
    pub own_devices: bool,
    /// Peers a manifest lets in by NodeId.
    pub ids: HashSet<EndpointId>,
    /// Whether devices paired with exactly this agent (`devices.json`) reach it.
    pub paired: bool,
    pub resume: Option<ResumeConfig>,
    pub keep_warm: Option<Duration>,
    pub idle_stop: Option<Duration>,
    pub max_sessions: Option<usize>,
}

/// Where a hosted agent finds the home's reach socket.
pub const REACH_SOCK_ENV: &str = "THUNDERBOLT_REACH_SOCK";

impl AgentPlan {
    /// A manifest's agent, with the host's defaults where it says nothing.
    /// Every agent is told where the home's reach socket is
    /// (`THUNDERBOLT_REACH_SOCK`, a path and no secret): a relay agent's
    /// adapter watches its turns there, and any agent may send the owner a note.
    pub fn from_spec(spec: &AgentSpec, config: &Config, home: &crate::home::Home) -> Result<Self> {
        let mut env: Vec<(String, String)> = spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if !spec.env.contains_key(REACH_SOCK_ENV) {
            let sock = crate::reach::socket::socket_path(home);
            env.push((REACH_SOCK_ENV.to_string(), sock.display().to_string()));
        }
        let command = AgentCommand::new(spec.argv.clone())
            .context("a manifest's command is never empty")?
            .with(env, spec.cwd.clone())
            .files_in(spec.files.clone());
        Ok(Self {
            name: AgentName::hosted(&spec.name),
            label: spec.label.clone(),
            protocol: spec.protocol.clone(),
            command,
            identity_file: spec.identity.file_name(&spec.name),
            notice_label: spec.label.clone(),
            notice_agent: spec.name.clone(),
            account_name: format!("{} ({})", account::device_name(), spec.label),
            own_devices: spec.accept_from.own_devices,
            ids: spec.accept_from.ids.iter().copied().collect(),
            paired: true,
            resume: spec.resume.apply(config.resume),
            keep_warm: spec.keep_warm,
            idle_stop: Some(spec.idle_stop),
            max_sessions: spec.max_sessions,
        })
    }

    /// The single-agent bridge's agent, from its flags: on the protocol's
    /// identity, for your own devices, with the bridge's settings.
    pub fn single(protocol: &Protocol, command: AgentCommand, config: &Config) -> Self {
        // Notices call the agent by its program's name ("claude-code-acp finished").
        let program = command.argv0();
        let program = std::path::Path::new(&program)
            .file_name()
            .map_or(program.clone(), |f| f.to_string_lossy().into_owned());
        Self {
            name: AgentName::Single,
            label: protocol.to_string(),
            protocol: protocol.clone(),
            command,
            identity_file: protocol.identity_file_name(),
            notice_label: program,
            notice_agent: protocol.to_string(),
            account_name: account::device_name(),
            own_devices: true,
            ids: HashSet::new(),
            paired: false,
            resume: config.resume,
            keep_warm: config.keep_warm,
            idle_stop: None,
            max_sessions: None,
        }
    }

    /// Whether it is on its protocol's single-agent bridge identity (codes
    /// `iroh pair` mints for that bridge pair with it too).
    pub fn on_bridge_identity(&self) -> bool {
        self.name != AgentName::Single && self.identity_file == self.protocol.identity_file_name()
    }
}
