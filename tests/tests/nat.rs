//! Peer to peer through two NATs, on a topology each test builds inside its
//! own namespace ([`thunderbolt_tests::nat`]): the bridge at "home" behind one
//! NAT, `connect` on a "phone" behind another, a TLS relay with QUIC address
//! discovery on the "internet" between them.
//!
//! What is shown: a session over the ticket starts on the relay and moves to a
//! direct path (hole punching through both NATs) without the agent noticing;
//! a NAT that maps every destination to a new port keeps it on the relay, and
//! it works; the relay can die and come back while the path is direct; the
//! bridge's pre-handshake budget keys a relayed dial by the dialer's NodeId and
//! a direct one by its (public, NAT) IP address.

use std::time::Duration;

use iroh::EndpointId;

use thunderbolt_tests::{
    nat::{Mapping, Topology, PHONE_PUBLIC_IP, RELAY_IP},
    test_agent_bin, Log, RunningBridge, Tb, WAIT,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout},
};

/// Our log lines plus the gate's debug lines (which key a dial was counted under).
const BRIDGE_LOG: &str =
    "info,thunderbolt::serve::gate=debug,thunderbolt=debug,iroh=warn,noq=warn,noq_proto=warn,iroh_relay=warn";

/// How long a session is watched for a direct path that must not come: longer
/// than a hole-punching round (probes for ~4 s) started at connect and again
/// when the first address report comes in.
const NO_DIRECT_WATCH: Duration = Duration::from_secs(6);

macro_rules! require_topology {
    () => {
        if !Topology::available() {
            eprintln!(
                "skipped: needs root with unshare, nsenter, ip and nft (run inside a namespace of its own)"
            );
            return;
        }
    };
}

/// One test's world: the topology, the bridge at home admitting the phone's
/// NodeId, and `connect` on the phone dialing the bridge's ticket.
struct Scene {
    t: Topology,
    bridge: RunningBridge,
    phone_id: EndpointId,
    client: Client,
    /// The two machines' state directories, kept for the test's length.
    _homes: (Tb, Tb),
}

impl Scene {
    async fn start(mapping: Mapping, client_args: &[&str]) -> Self {
        let t = Topology::build(mapping).await;
        let (home, phone) = (t.tb(), t.tb());
        let phone_id = phone.node_id("acp").await;
        home.allow(&phone_id).await;
        let mut c = home.cmd();
        c.env("RUST_LOG", BRIDGE_LOG);
        c.args(["acp", "--transport", "iroh", "--"]).arg(test_agent_bin()).arg("cat");
        let mut c = t.home.enter(c);
        c.stdin(std::process::Stdio::null());
        let bridge = RunningBridge::start(c).await;
        let client = Client::start(&t, &phone, &bridge.ticket, client_args).await;
        Self { t, bridge, phone_id, client, _homes: (home, phone) }
    }
}

/// `thunderbolt acp connect <ticket>` on the phone, its stdio piped to the test.
struct Client {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    log: Log,
    n: u64,
}

impl Client {
    async fn start(t: &Topology, phone: &Tb, ticket: &str, extra: &[&str]) -> Self {
        let mut c = phone.cmd();
        c.args(["acp", "connect"]).args(extra).arg(ticket);
        let mut c = t.phone.enter(c);
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("connect runs");
        let log = Log::default();
        log.capture_stderr(child.stderr.take().expect("stderr"));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Self { _child: child, stdin, stdout, log, n: 0 }
    }

    /// One message through the agent and back, byte for byte.
    async fn echo(&mut self) {
        self.n += 1;
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}}", self.n);
        self.stdin.write_all(format!("{line}\n").as_bytes()).await.expect("write to connect");
        let got = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .unwrap_or_else(|_| panic!("echo {} in time; connect log:\n{}", self.n, self.log.text()))
            .expect("read connect stdout")
            .expect("connect still running");
        assert_eq!(got, line, "message {} came back changed", self.n);
    }

    /// Echoes until both sides log a direct path; how long that took.
    async fn until_direct(&mut self, bridge: &RunningBridge) -> Duration {
        let started = tokio::time::Instant::now();
        while !(self.log.contains("path changed: direct") && bridge.log.contains("path changed: direct")) {
            assert!(
                started.elapsed() < WAIT,
                "the path never became direct\nconnect:\n{}\nbridge:\n{}",
                self.log.text(),
                bridge.log.text()
            );
            self.echo().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        started.elapsed()
    }
}

/// The one agent of this bridge was started once and nothing reconnected:
/// the stream the agent sees was never broken.
fn one_unbroken_session(bridge: &RunningBridge, client: &Client) {
    assert_eq!(bridge.log.text().matches("agent started").count(), 1, "{}", bridge.log.text());
    assert!(!client.log.contains("connection lost"), "{}", client.log.text());
    assert!(!bridge.log.contains("session ended"), "{}", bridge.log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_over_the_ticket_goes_direct_through_two_nats_without_the_agent_noticing() {
    require_topology!();
    let Scene { t: _t, bridge, phone_id, mut client, _homes } =
        Scene::start(Mapping::EndpointIndependent, &[]).await;
    client.echo().await;
    client.log.wait_for("path: relay").await;
    let took = client.until_direct(&bridge).await;
    eprintln!("path direct after {took:?}");
    for _ in 0..20 {
        client.echo().await;
    }
    // Admitted by its NodeId (the allow file), whatever path it took.
    bridge.log.wait_for(&format!("admitted {phone_id} (allow file)")).await;
    // The direct path goes through the phone's NAT: the bridge sees its public address.
    assert!(
        bridge.log.contains(&format!("path changed: direct (ip:{PHONE_PUBLIC_IP}:")),
        "{}",
        bridge.log.text()
    );
    one_unbroken_session(&bridge, &client);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nat_that_maps_each_destination_to_a_new_port_keeps_the_session_on_the_relay() {
    require_topology!();
    let Scene { t: _t, bridge, phone_id: _, mut client, _homes } =
        Scene::start(Mapping::EndpointDependent, &[]).await;
    let started = tokio::time::Instant::now();
    while started.elapsed() < NO_DIRECT_WATCH {
        client.echo().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(client.n > 20, "too few messages went through: {}", client.n);
    client.log.wait_for("path: relay").await;
    assert!(!client.log.contains("direct"), "{}", client.log.text());
    assert!(!bridge.log.contains("path changed"), "{}", bridge.log.text());
    one_unbroken_session(&bridge, &client);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relay_can_die_and_come_back_while_the_path_is_direct() {
    require_topology!();
    let Scene { mut t, bridge, phone_id: _, mut client, _homes } =
        Scene::start(Mapping::EndpointIndependent, &[]).await;
    client.until_direct(&bridge).await;
    t.kill_relay().await;
    // Longer than the client's idle timeout (10 s would be the default; the
    // point is that the session never depended on the relay any more).
    let down = tokio::time::Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        client.echo().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.start_relay().await;
    for _ in 0..20 {
        client.echo().await;
    }
    one_unbroken_session(&bridge, &client);
    assert!(!client.log.contains("path changed: relay"), "{}", client.log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_budget_keys_a_relayed_dial_by_node_id_and_a_direct_one_by_the_nat_address() {
    require_topology!();
    // A short idle timeout so the loss below is noticed at once.
    let Scene { t, bridge, phone_id, mut client, _homes } =
        Scene::start(Mapping::EndpointIndependent, &["--idle-timeout", "1"]).await;
    let relayed = format!("key=endpoint {}", phone_id.fmt_short());
    let direct = format!("key=ip {PHONE_PUBLIC_IP}");

    // The first dial can only come through the relay: the home NAT lets in
    // nothing the bridge did not send out to first, and the bridge has not
    // heard of the phone yet.
    client.echo().await;
    bridge.log.wait_for(&relayed).await;
    client.until_direct(&bridge).await;

    // Cut the phone off until its connection is declared lost. Then give it
    // everything back but the relay: its redial (from the same endpoint, which
    // knows the bridge's direct address from the path it had) can only come
    // direct, through both NATs. With the relay open too, iroh sends a dial's
    // first packet down every path it knows and the bridge keys it by
    // whichever arrives first: then this would test a race.
    t.phone.nft(
        "table inet cut {
            chain o { type filter hook output priority 0; policy drop; }
            chain i { type filter hook input priority 0; policy drop; }
        }",
    );
    client.log.wait_for("connection lost").await;
    // One transaction: the phone is never open to the relay in between.
    t.phone.nft(&format!(
        "delete table inet cut
        table inet norelay {{
            chain o {{ type filter hook output priority 0; ip daddr {RELAY_IP} drop; }}
            chain i {{ type filter hook input priority 0; ip saddr {RELAY_IP} drop; }}
        }}"
    ));
    client.log.wait_for("session resumed").await;
    client.echo().await;
    bridge.log.wait_for(&direct).await;

    // Every handshake the bridge started was the phone's (nobody else dials
    // it here), keyed for the path it came by: its NodeId through the relay,
    // its NAT's public address direct (never the relay's address, the phone's
    // private one, or a catch-all).
    let log = bridge.log.text();
    let handshakes: Vec<&str> = log.lines().filter(|l| l.contains("handshake started")).collect();
    assert!(handshakes.len() >= 2, "a relayed and a direct handshake at least:\n{log}");
    for line in &handshakes {
        assert!(
            keyed(line, &relayed) || keyed(line, &direct),
            "a handshake keyed neither by the phone's NodeId nor by its NAT's address: {line}\n{log}"
        );
    }
    assert_eq!(log.matches("agent started").count(), 1, "the session resumed, same agent:\n{log}");
}

/// Whether a log line carries `key` as a whole field value (`ip 10.0.0.1`
/// does not match `ip 10.0.0.12`).
fn keyed(line: &str, key: &str) -> bool {
    line.match_indices(key).any(|(at, _)| {
        !line[at + key.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':')
    })
}
