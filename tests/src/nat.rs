//! Real network shapes, built by a test inside its own network namespace: an
//! "internet" with a relay on it, and two homes each behind its own NAT.
//!
//! ```text
//!   home 192.168.1.2 ── 192.168.1.1 [home NAT] 198.51.100.2 ──┐
//!                                                              ├── internet: relay 100.64.0.1
//!  phone 192.168.2.2 ── 192.168.2.1 [phone NAT] 203.0.113.2 ──┘  (routes between the two)
//! ```
//!
//! Each box is a network namespace (held by a `sleep` process made with
//! `unshare --net`, entered with `nsenter`), joined to its neighbours by veth
//! pairs. Every address exists only inside these namespaces, which are nested
//! in the test's own loopback-only namespace: nothing can route out. The NATs
//! are nftables `masquerade` with the filtering a home router has: replies to
//! what went out come in, nothing else does — neither forwarded to the LAN nor
//! delivered to the router itself (a router that answers unsolicited packets
//! itself records them in its connection table, which then blocks the very
//! mapping hole punching needs).
//!
//! The relay runs TLS with a CA the topology generates (clients trust it through
//! `THUNDERBOLT_IROH_RELAY_CA`) and answers QUIC address discovery, so each
//! endpoint learns the address its NAT gives it, as on a real network.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Stdio,
};

use iroh::RelayUrl;
use tokio::process::{Child, Command};

use crate::{bin_dir, private_ca, Log, Tb, WAIT};

/// The relay's address on the "internet" (a shared-address-space block: never
/// routed on the real internet either).
pub const RELAY_IP: &str = "100.64.0.1";
/// The home NAT's public address.
pub const HOME_PUBLIC_IP: &str = "198.51.100.2";
/// The phone NAT's public address.
pub const PHONE_PUBLIC_IP: &str = "203.0.113.2";

/// How a NAT maps a LAN socket to a public port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// The same public port for every destination (Linux keeps the source port
    /// when it can): hole punching can work.
    EndpointIndependent,
    /// A new random public port for every destination (`masquerade random`):
    /// the address the relay saw is useless to anyone else.
    EndpointDependent,
}

/// A network namespace, alive as long as this value.
pub struct Netns {
    holder: std::process::Child,
}

impl Netns {
    /// A fresh namespace with only `lo`, up.
    pub fn new() -> Self {
        let holder = std::process::Command::new("unshare")
            .args(["--net", "sleep", "100000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare runs (needs root)");
        let ns = Self { holder };
        // `unshare` has switched namespaces once its net link differs from ours.
        let ours = std::fs::read_link("/proc/self/ns/net").expect("our netns");
        let deadline = std::time::Instant::now() + WAIT;
        while std::fs::read_link(ns.path()).ok().as_ref() == Some(&ours) {
            assert!(std::time::Instant::now() < deadline, "unshare never made its namespace");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        ns.sh("ip link set lo up");
        ns
    }

    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.pid())
    }

    /// `program` to run inside this namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path())).arg("--").arg(program).kill_on_drop(true);
        c
    }

    /// `c` (program, arguments, environment, directory) run inside this
    /// namespace instead. Its stdio is to be set on the result.
    pub fn enter(&self, c: Command) -> Command {
        let std = c.as_std();
        let mut n = self.command(std.get_program());
        n.args(std.get_args());
        for (k, v) in std.get_envs() {
            match v {
                Some(v) => n.env(k, v),
                None => n.env_remove(k),
            };
        }
        if let Some(d) = std.get_current_dir() {
            n.current_dir(d);
        }
        n
    }

    /// Runs a shell script in this namespace; it must succeed.
    pub fn sh(&self, script: &str) {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", self.path()))
            .args(["--", "sh", "-ec", script])
            .output()
            .expect("nsenter runs");
        assert!(out.status.success(), "in netns: {script}\n{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Loads an nftables script in this namespace.
    pub fn nft(&self, script: &str) {
        self.sh(&format!("nft -f - <<'NFT'\n{script}\nNFT"));
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Joins `a` (interface `a_if`) and `b` (`b_if`) with a veth pair.
fn link(a: &Netns, a_if: &str, b: &Netns, b_if: &str) {
    let out = std::process::Command::new("ip")
        .args(["link", "add", a_if, "netns", &a.pid().to_string(), "type", "veth", "peer", "name", b_if])
        .args(["netns", &b.pid().to_string()])
        .output()
        .expect("ip runs");
    assert!(out.status.success(), "veth {a_if}-{b_if}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A home router: `lan` to the inside, `wan` to the internet, NAT on `wan`.
fn router(r: &Netns, lan: &str, wan: &str, wan_gw: &str, mapping: Mapping) {
    r.sh(&format!(
        "ip addr add {lan} dev lan; ip link set lan up; ip addr add {wan}/24 dev wan; ip link set wan up; \
         ip route add default via {wan_gw}; sysctl -qw net.ipv4.ip_forward=1"
    ));
    let random = match mapping {
        Mapping::EndpointIndependent => "",
        Mapping::EndpointDependent => " random",
    };
    r.nft(&format!(
        "table ip nat {{
            chain post {{ type nat hook postrouting priority 100; oifname \"wan\" masquerade{random}; }}
        }}
        table ip filter {{
            chain forward {{
                type filter hook forward priority 0; policy drop;
                ct state established,related accept
                iifname \"lan\" accept
            }}
            chain input {{
                type filter hook input priority 0; policy accept;
                iifname \"wan\" ct state established,related accept
                iifname \"wan\" drop
            }}
        }}"
    ));
}

/// Two NATed homes and a TLS relay with QUIC address discovery between them.
pub struct Topology {
    pub internet: Netns,
    pub home_nat: Netns,
    pub home: Netns,
    pub phone_nat: Netns,
    pub phone: Netns,
    pub relay_url: RelayUrl,
    /// The relay's CA, for `THUNDERBOLT_IROH_RELAY_CA`.
    pub ca: PathBuf,
    relay: Option<Child>,
    pub relay_log: Log,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Topology {
    /// Builds it all; the phone's NAT maps as `phone_mapping` says (the home's
    /// is endpoint-independent).
    pub async fn build(phone_mapping: Mapping) -> Self {
        let (internet, home_nat, home, phone_nat, phone) =
            (Netns::new(), Netns::new(), Netns::new(), Netns::new(), Netns::new());
        link(&home, "lan", &home_nat, "lan");
        link(&home_nat, "wan", &internet, "home");
        link(&phone, "lan", &phone_nat, "lan");
        link(&phone_nat, "wan", &internet, "phone");
        internet.sh(&format!(
            "ip addr add 198.51.100.1/24 dev home; ip link set home up; \
             ip addr add 203.0.113.1/24 dev phone; ip link set phone up; \
             ip addr add {RELAY_IP}/32 dev lo; sysctl -qw net.ipv4.ip_forward=1"
        ));
        router(&home_nat, "192.168.1.1/24", HOME_PUBLIC_IP, "198.51.100.1", Mapping::EndpointIndependent);
        router(&phone_nat, "192.168.2.1/24", PHONE_PUBLIC_IP, "203.0.113.1", phone_mapping);
        home.sh(
            "ip addr add 192.168.1.2/24 dev lan; ip link set lan up; ip route add default via 192.168.1.1",
        );
        phone.sh(
            "ip addr add 192.168.2.2/24 dev lan; ip link set lan up; ip route add default via 192.168.2.1",
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, cert, key) = private_ca(dir.path(), &[RELAY_IP]);
        let config = dir.path().join("relay.toml");
        std::fs::write(
            &config,
            format!(
                "http_bind_addr = \"{RELAY_IP}:80\"\nenable_quic_addr_discovery = true\n[tls]\n\
                 hostname = \"{RELAY_IP}\"\ncert_mode = \"Manual\"\nmanual_cert_path = \"{}\"\n\
                 manual_key_path = \"{}\"\nhttps_bind_addr = \"{RELAY_IP}:443\"\nquic_bind_addr = \"{RELAY_IP}:7842\"\n",
                cert.display(),
                key.display()
            ),
        )
        .expect("write relay config");
        let mut t = Self {
            internet,
            home_nat,
            home,
            phone_nat,
            phone,
            relay_url: format!("https://{RELAY_IP}/").parse().expect("relay url"),
            ca,
            relay: None,
            relay_log: Log::default(),
            config,
            _dir: dir,
        };
        t.start_relay().await;
        t
    }

    /// Starts the relay (again) and waits until it serves.
    pub async fn start_relay(&mut self) {
        let mut c = self.internet.command(bin_dir().join("thunderbolt-relay"));
        c.arg("--config").arg(&self.config).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("thunderbolt-relay runs");
        self.relay_log.capture_stderr(child.stderr.take().expect("stderr"));
        self.relay = Some(child);
        // Serving once a TLS connection to it is accepted.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let probe = self
                .internet
                .command("bash")
                .args(["-c", &format!("exec 3<>/dev/tcp/{RELAY_IP}/443")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            if probe.is_ok_and(|s| s.success()) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "relay never served:\n{}", self.relay_log.text());
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Kills the relay (SIGKILL, as a crash would).
    pub async fn kill_relay(&mut self) {
        if let Some(mut c) = self.relay.take() {
            let _ = c.kill().await;
        }
    }

    /// A thunderbolt home for a machine of this topology (relay and its CA set;
    /// binds every interface of its namespace, IPv4).
    pub fn tb(&self) -> Tb {
        Tb::with_relay_url(&self.relay_url)
            .with_env("THUNDERBOLT_IROH_RELAY_CA", self.ca.display().to_string())
            .with_env("THUNDERBOLT_IROH_BIND", "0.0.0.0:0")
    }

    /// Whether this machine can build topologies (root, `unshare`, `nsenter`, `nft`).
    pub fn available() -> bool {
        crate::Outage::available()
            && ["unshare", "nsenter", "ip"].iter().all(|p| {
                std::process::Command::new(p)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok()
            })
    }

    /// Where the relay's config lives (for a test that changes it).
    pub fn relay_config(&self) -> &Path {
        &self.config
    }
}
