//! Who a device is to the owner, at one agent: decided here, once, for what
//! it may hold ([`super::slots`]) and which sessions it may see and join
//! ([`super::joining`]). docs/security.md has the table.
//!
//! - **Own**: one of the owner's own devices: listed by the account, or
//!   paired by a one-time code the owner minted (into the allow file, or
//!   with this agent of the host: the owner chose it for that agent). It
//!   holds what `--max-agents` allows, and sees the sessions the owner's
//!   other own devices started at this agent.
//! - **Listed**: a line of the allow file with no pairing behind it (an
//!   `iroh allow`, or a line from the original tool): the owner let it in,
//!   but it may be someone else's device. It holds what `--max-agents`
//!   allows, as the reference bridge's peers do, and sees its own sessions
//!   only.
//! - **Guest**: let in only by the agent's `accept_from` NodeIds: its own
//!   sessions only, within the guests' caps, so the owner's devices always
//!   get in.

use iroh::EndpointId;

use super::{admit::Admitted, bridge::Shared, served::AgentConfig};
use crate::{devices::How, trust::Grant};

/// A device's standing with the owner at one agent (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Own,
    Listed,
    Guest,
}

impl Standing {
    /// Whether it holds a guest's share of the slots only.
    pub fn is_guest(self) -> bool {
        self == Standing::Guest
    }
}

/// `node`'s standing at the agent `a` was admitted to (`None`: not admitted
/// there at all, e.g. revoked since).
pub(super) fn of(a: &Admitted, node: &EndpointId) -> Option<Standing> {
    let grant = if *node == a.peer { Some(a.grant) } else { a.cfg.trust.check(node) }?;
    Some(from_grant(&a.shared, grant, node))
}

/// `node`'s standing at another agent of the host (`None`: that agent does
/// not admit it).
pub(super) fn at(shared: &Shared, cfg: &AgentConfig, node: &EndpointId) -> Option<Standing> {
    Some(from_grant(shared, cfg.trust.check(node)?, node))
}

fn from_grant(shared: &Shared, grant: Grant, node: &EndpointId) -> Standing {
    match grant {
        Grant::Account | Grant::Paired => Standing::Own,
        Grant::Manual => {
            let paired = shared
                .stores()
                .and_then(|s| s.devices.get(node))
                .is_some_and(|d| matches!(d.how, How::Pairing | How::Account));
            if paired {
                Standing::Own
            } else {
                Standing::Listed
            }
        }
        // A share's guest sees its one session only (`joining`), and holds a guest's share.
        Grant::Manifest | Grant::Shared => Standing::Guest,
    }
}
