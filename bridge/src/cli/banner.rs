//! What the bridge prints on stdout when it is ready.

use std::fmt::Write;

use iroh::EndpointAddr;
use thunderbolt_shared::{EndpointTicket, Protocol};

/// Where the app lists a protocol's bridges, for the pairing hint.
pub fn pairing_url(app_url: Option<&str>, protocol: &Protocol) -> Option<String> {
    let base = app_url?.trim().trim_end_matches('/');
    if base.is_empty() {
        return None;
    }
    let page = if *protocol == Protocol::acp() { "settings/agents" } else { "settings/mcp-servers" };
    Some(format!("{base}/{page}"))
}

pub struct Banner<'a> {
    pub protocol: &'a Protocol,
    pub addr: &'a EndpointAddr,
    pub new_identity: bool,
    pub command: &'a str,
    pub allow_file: &'a std::path::Path,
    pub manual_peers: usize,
    pub account_trust: &'a str,
    pub app_url: Option<&'a str>,
    /// Resumable sessions: grace and buffer, or `None` when off.
    pub resume: Option<crate::serve::sessions::ResumeConfig>,
    /// Resumable sessions are journaled (they survive a restart of the bridge).
    pub journal: bool,
    /// `--keep-warm`, when on.
    pub keep_warm: Option<std::time::Duration>,
    /// Why the relay was not reached at start, when it was not.
    pub relay_problem: Option<String>,
    /// The one relay configured, when there is only one.
    pub only_relay: Option<String>,
    /// What notifies the owner ([`crate::notify::Notifier::describe`]).
    pub notify: String,
}

impl Banner<'_> {
    pub fn render(&self) -> String {
        let ticket = EndpointTicket::new(self.addr.clone());
        let mut s = String::new();
        let p = self.protocol;
        let _ = writeln!(s, "thunderbolt {p} bridge is listening on iroh (ALPN thunderbolt/{p}/0)");
        let _ = writeln!(
            s,
            "  NodeId:  {}{}",
            self.addr.id,
            if self.new_identity { "  (new identity)" } else { "" }
        );
        let _ = writeln!(s, "  Ticket:  {ticket}");
        let direct: Vec<String> = self.addr.ip_addrs().map(|a| a.to_string()).collect();
        let relays: Vec<String> = self.addr.relay_urls().map(|u| u.to_string()).collect();
        let _ = writeln!(
            s,
            "  Reach:   direct {} · relay {}",
            if direct.is_empty() { "none".into() } else { direct.join(", ") },
            if relays.is_empty() { "none".into() } else { relays.join(", ") }
        );
        if let Some(why) = &self.relay_problem {
            let _ = writeln!(
                s,
                "  Relay:   NOT reachable ({why}); browsers cannot reach this bridge until it is"
            );
        }
        if let Some(url) = &self.only_relay {
            let _ = writeln!(
                s,
                "  Relay:   {url} is the only relay: when it is down, no browser reaches this bridge \
                 (give a second, --relay-url {url},<another>, and either may die)"
            );
        }
        let app = match pairing_url(self.app_url, p) {
            Some(url) => format!("; or open {url} and add this bridge with the ticket above"),
            None => String::new(),
        };
        let _ = writeln!(s, "  Pair:    {PAIR_HINT}{app}");
        let _ = writeln!(s, "  Agent:   {}", self.command);
        match &self.resume {
            Some(r) => {
                let _ = writeln!(
                    s,
                    "  Resume:  a lost connection{} keeps its session {}s (ALPN thunderbolt/{p}/r1, buffer {} MiB)",
                    if self.journal { " or a restart of the bridge" } else { "" },
                    r.grace.as_secs(),
                    r.buffer >> 20
                );
            }
            None => {
                let _ = writeln!(s, "  Resume:  off (a session ends with its connection)");
            }
        }
        if let Some(w) = self.keep_warm {
            let _ = writeln!(
                s,
                "  Warm:    an agent whose client left (plain /0, or resumable and closed) waits {}s for the same peer's next connection",
                w.as_secs()
            );
        }
        let _ = writeln!(s, "  Notify:  {}", self.notify);
        let _ = writeln!(
            s,
            "  Trust:   allow file {} ({} peer{}); same-account auto-trust: {}",
            self.allow_file.display(),
            self.manual_peers,
            if self.manual_peers == 1 { "" } else { "s" },
            self.account_trust
        );
        let _ = writeln!(s, "{ALLOW_LINE}");
        s
    }
}

/// How a device is paired, for every banner: one command here, one scan or
/// command on the device.
pub const PAIR_HINT: &str =
    "run `thunderbolt iroh pair` here: it prints a one-time code, a command line and a QR code for the device";

/// A banner's last line (scripts wait for its `Allow a peer:`): both ways in.
pub const ALLOW_LINE: &str =
    "  Allow a peer: thunderbolt iroh pair (one code, one scan), or thunderbolt iroh allow <its-nodeid>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_urls() {
        assert_eq!(
            pairing_url(Some("https://app.example/"), &Protocol::acp()).unwrap(),
            "https://app.example/settings/agents"
        );
        assert_eq!(
            pairing_url(Some("https://app.example"), &Protocol::mcp()).unwrap(),
            "https://app.example/settings/mcp-servers"
        );
        assert_eq!(pairing_url(None, &Protocol::acp()), None);
    }
}
