//! `thunderbolt iroh list`: every device that may connect, how it was let
//! in, its name and the agents it may reach.
//!
//! A device may connect because it is in the allow file (paired with a code
//! for your own devices, `iroh allow`, or a line written by hand or by the
//! reference tool), because the account lists it, or because it paired with
//! some agents of the host by a code (`devices.json` only). Which agents it
//! reaches follows from the host's manifests: your own devices reach every
//! agent whose `accept_from` takes them, a device paired with some agents
//! those, and a manifest may name a device by its NodeId.

use std::collections::{BTreeMap, BTreeSet};

use iroh::EndpointId;

use crate::{
    devices::{Device, How},
    host::manifest::AgentSpec,
};

/// How a device came to be let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A one-time pairing code (`iroh pair`).
    Code,
    /// `iroh allow`.
    Allow,
    /// A line of the allow file with nothing known of it (by hand, or the
    /// reference tool).
    AllowFile,
    /// The account lists it.
    Account,
    /// A share of one session (`thunderbolt share`): someone else's device.
    Share,
}

impl Via {
    /// For `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Code => "pairing",
            Via::Allow => "allow",
            Via::AllowFile => "allow file",
            Via::Account => "account",
            Via::Share => "share",
        }
    }

    /// For people: "paired with a code", …
    pub fn words(self) -> &'static str {
        match self {
            Via::Code => "paired with a code",
            Via::Allow => "allowed with iroh allow",
            Via::AllowFile => "in the allow file",
            Via::Account => "an account device",
            Via::Share => "a guest of one shared session",
        }
    }
}

/// One device that may connect.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: EndpointId,
    /// What `devices.json` knows of it.
    pub device: Option<Device>,
    pub in_allow_file: bool,
    pub via: Via,
    /// The host's agents it may reach, by name (empty when no manifest loads).
    pub agents: Vec<String>,
    /// One of your own devices (the allow file, the account): it reaches a
    /// single-agent bridge too.
    pub own: bool,
}

/// Every device that may connect: the allow file's, the account's seen
/// here, and those paired with some agents; by NodeId.
pub fn list(
    allow_file: &[EndpointId],
    known: &BTreeMap<EndpointId, Device>,
    agents: &BTreeMap<String, AgentSpec>,
) -> Vec<Listed> {
    let allowed: BTreeSet<&EndpointId> = allow_file.iter().collect();
    let ids: BTreeSet<&EndpointId> = allowed
        .iter()
        .copied()
        .chain(
            known
                .iter()
                .filter(|(_, d)| !d.agents.is_empty() || matches!(d.how, How::Account | How::Share))
                .map(|(id, _)| id),
        )
        .collect();
    ids.into_iter()
        .map(|id| {
            let device = known.get(id).cloned();
            let in_allow_file = allowed.contains(id);
            let via = match device.as_ref().map(|d| d.how) {
                Some(How::Pairing) => Via::Code,
                Some(How::Allow) => Via::Allow,
                Some(How::Account) => Via::Account,
                Some(How::Share) => Via::Share,
                None => Via::AllowFile,
            };
            let own = in_allow_file || via == Via::Account;
            let shared: Vec<String> = device
                .as_ref()
                .and_then(|d| d.scope.as_ref())
                .filter(|s| s.session.is_some())
                .and_then(|s| s.agents.clone())
                .unwrap_or_default();
            let granted = device.as_ref().map(|d| d.agents.as_slice()).unwrap_or_default();
            let granted = if shared.is_empty() { granted } else { shared.as_slice() };
            let reach: Vec<String> = if agents.is_empty() {
                granted.to_vec()
            } else {
                agents
                    .values()
                    .filter(|s| {
                        (own && s.accept_from.own_devices)
                            || s.accept_from.ids.contains(id)
                            || granted.contains(&s.name)
                    })
                    .map(|s| s.name.clone())
                    .collect()
            };
            Listed { id: *id, device, in_allow_file, via, agents: reach, own }
        })
        .collect()
}

/// What a device reaches, in words: "echo, claude", "the single-agent bridges", "no agent".
pub fn reach_words(l: &Listed, hosted: bool) -> String {
    match (&l.agents[..], hosted, l.own) {
        ([], false, true) => "this machine's single-agent bridges".into(),
        ([], _, _) => "no agent now (no manifest admits it)".into(),
        (names, _, _) => names.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    fn device(how: How, agents: &[&str]) -> Device {
        Device {
            name: None,
            how,
            added_ms: 0,
            last_seen_ms: None,
            agents: agents.iter().map(|a| a.to_string()).collect(),
            scope: None,
        }
    }

    fn spec(name: &str, own_devices: bool, ids: Vec<EndpointId>) -> AgentSpec {
        let mut s = crate::host::manifest::parse(
            format!(r#"{{"name":"{name}","command":["/bin/cat"]}}"#).as_bytes(),
            std::path::Path::new("/x.json"),
            &crate::host::manifest::Machine::this(),
        )
        .unwrap();
        s.accept_from.own_devices = own_devices;
        s.accept_from.ids = ids;
        s
    }

    #[test]
    fn each_device_with_how_it_came_and_what_it_reaches() {
        let (code, allowed, by_hand, account, guest, stale) = (id(1), id(2), id(3), id(4), id(5), id(6));
        let known = BTreeMap::from([
            (code, device(How::Pairing, &["b"])),
            (allowed, device(How::Allow, &[])),
            (account, device(How::Account, &[])),
            // Named once, since removed from the allow file: it may not connect.
            (stale, device(How::Allow, &[])),
        ]);
        let agents = BTreeMap::from([
            ("a".to_string(), spec("a", true, vec![])),
            ("b".to_string(), spec("b", false, vec![guest])),
            ("c".to_string(), spec("c", true, vec![])),
        ]);
        let listed = list(&[allowed, by_hand], &known, &agents);
        let got: Vec<(EndpointId, Via, Vec<String>)> =
            listed.iter().map(|l| (l.id, l.via, l.agents.clone())).collect();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut want = vec![
            (code, Via::Code, names(&["b"])),
            (allowed, Via::Allow, names(&["a", "c"])),
            (by_hand, Via::AllowFile, names(&["a", "c"])),
            (account, Via::Account, names(&["a", "c"])),
        ];
        want.sort_by_key(|(i, _, _)| *i);
        assert_eq!(
            got, want,
            "by NodeId; the guest named by `b` was never seen here, the stale one may not connect"
        );
        // Without a host, your own devices reach the single-agent bridges.
        let bare = list(&[allowed], &known, &BTreeMap::new());
        let l = bare.iter().find(|l| l.id == allowed).unwrap();
        assert_eq!(reach_words(l, false), "this machine's single-agent bridges");
    }
}
