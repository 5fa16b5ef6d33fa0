//! The serving core in-process: a real [`Bridge`] on a real iroh endpoint
//! (loopback only, no relay, no discovery), dialed by in-process clients,
//! with a trust policy and an agent the test controls. What needs a real
//! process (signals, orphans after SIGKILL, the CLI's words) is tested in
//! the `tests` crate; this covers admission, capacity, the stream-open
//! deadline, revocation at the heartbeat and shutdown ordering without one.
//!
//! These run on real time (QUIC's timers and the kernel's sockets do not mix
//! with a paused clock); every deadline is configured short and every wait is
//! on an event, bounded by [`WAIT`].

mod support;

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use iroh::{
    endpoint::{Connection, ConnectionError},
    Endpoint, EndpointAddr, EndpointId, SecretKey,
};
use support::{echo, Events, FakeLauncher, OnTerm};
use thunderbolt::{
    config::Config,
    net::{Discovery, NetConfig, OnOff, Relays},
    serve::{
        gate::{Gate, SystemClock},
        Bridge,
    },
    trust::{Grant, TrustPolicy},
};
use thunderbolt_shared::{close, Protocol};
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

/// Bound on every wait for an event.
const WAIT: Duration = Duration::from_secs(20);

/// Admits exactly the peers it lists; a test can take one back. Peers in
/// `.1` are admitted by one check only: denied right after their handshake.
/// Peers in `.2` are guests (named by a manifest, not your own devices).
#[derive(Debug, Default)]
struct Listed(
    std::sync::Mutex<Vec<EndpointId>>,
    std::sync::Mutex<Vec<EndpointId>>,
    std::sync::Mutex<Vec<EndpointId>>,
);

impl TrustPolicy for Listed {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        if self.0.lock().unwrap().contains(peer) {
            return Some(Grant::Manual);
        }
        if self.2.lock().unwrap().contains(peer) {
            return Some(Grant::Manifest);
        }
        let mut once = self.1.lock().unwrap();
        let i = once.iter().position(|p| p == peer)?;
        once.remove(i);
        Some(Grant::Manual)
    }
}

fn loopback() -> NetConfig {
    NetConfig {
        relays: Relays::Disabled,
        discovery: Discovery::Off,
        portmapper: OnOff::Off,
        bind: Some("127.0.0.1:0".parse().unwrap()),
        relay_ca: Vec::new(),
    }
}

struct Running {
    addr: EndpointAddr,
    trust: Arc<Listed>,
    launcher: FakeLauncher,
    events: Events,
    stop: CancellationToken,
    bridge: JoinHandle<()>,
}

async fn bridge(config: Config) -> Running {
    let net = loopback();
    let key = SecretKey::generate();
    let alpns = vec![thunderbolt_shared::resume::resume_alpn(&Protocol::acp()), Protocol::acp().alpn()];
    let ep = net.bind(key, alpns, config.idle_timeout).await.expect("bridge binds");
    let addr = ep.addr();
    let events = Events::default();
    let launcher = FakeLauncher::new(echo(), OnTerm::Exits, events.clone(), Instant::now(), None);
    let trust = Arc::new(Listed::default());
    let gate = Arc::new(Gate::new(config.gate.clone(), Arc::new(SystemClock)));
    let b = Bridge::new(
        ep,
        trust.clone(),
        gate,
        None,
        config.admission.clone(),
        config.session(launcher.clone()),
    );
    let stop = CancellationToken::new();
    let bridge = tokio::spawn(b.run(stop.clone()));
    Running { addr, trust, launcher, events, stop, bridge }
}

async fn client() -> Endpoint {
    loopback().bind(SecretKey::generate(), Vec::new(), Duration::from_secs(10)).await.expect("client binds")
}

impl Running {
    async fn dial(&self, ep: &Endpoint) -> Connection {
        tokio::time::timeout(WAIT, ep.connect(self.addr.clone(), &Protocol::acp().alpn()))
            .await
            .expect("dial in time")
            .expect("dial succeeds")
    }

    fn allow(&self, ep: &Endpoint) {
        self.trust.0.lock().unwrap().push(ep.id());
    }

    /// A client with an echoing session open.
    async fn session(
        &self,
    ) -> (Endpoint, Connection, iroh::endpoint::SendStream, iroh::endpoint::RecvStream) {
        let ep = client().await;
        self.allow(&ep);
        let conn = self.dial(&ep).await;
        let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
        send.write_all(b"{\"id\":1}\n").await.expect("write");
        let mut buf = [0u8; 9];
        tokio::time::timeout(WAIT, recv.read_exact(&mut buf)).await.expect("echo in time").expect("echo");
        assert_eq!(&buf, b"{\"id\":1}\n");
        (ep, conn, send, recv)
    }
}

async fn closed_with(conn: &Connection) -> (u64, String) {
    match tokio::time::timeout(WAIT, conn.closed()).await.expect("closed in time") {
        ConnectionError::ApplicationClosed(ac) => {
            (ac.error_code.into_inner(), String::from_utf8_lossy(&ac.reason).into_owned())
        }
        e => panic!("expected an application close, got {e:?}"),
    }
}

fn refused(reason: &str) -> (u64, String) {
    (close::CLOSE_CODE_REFUSED as u64, reason.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_is_refused_and_no_agent_is_started() {
    let b = bridge(Config::default()).await;
    let ep = client().await;
    let conn = b.dial(&ep).await;
    assert_eq!(closed_with(&conn).await, refused(close::REASON_NOT_ALLOWLISTED));
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_capacity_the_next_peer_is_refused_until_a_slot_is_free() {
    let mut config = Config::default();
    config.admission.max_agents = 1;
    let b = bridge(config).await;
    let (_ep, first, mut send, _recv) = b.session().await;

    let ep2 = client().await;
    b.allow(&ep2);
    let second = b.dial(&ep2).await;
    let (mut s, _r) = second.open_bi().await.expect("open stream");
    // The bridge sees the stream once something is sent on it.
    s.write_all(b"{}\n").await.expect("write");
    assert_eq!(closed_with(&second).await, refused(close::REASON_AT_CAPACITY));
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 1);

    // The first session ends (its agent exits on end of input): the slot frees.
    send.finish().expect("finish");
    let (code, _) = closed_with(&first).await;
    assert_eq!(code, close::CLOSE_CODE_AGENT_ENDED as u64);
    let (_ep3, _third, _, _) = b.session().await;
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 2);
}

/// Opens a session on `conn` and waits for its echo.
async fn echoed(conn: &Connection) -> (iroh::endpoint::SendStream, iroh::endpoint::RecvStream) {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    send.write_all(b"{\"id\":1}\n").await.expect("write");
    let mut buf = [0u8; 9];
    tokio::time::timeout(WAIT, recv.read_exact(&mut buf)).await.expect("echo in time").expect("echo");
    (send, recv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_cannot_take_every_slot_and_the_owners_device_gets_in() {
    let mut config = Config::default();
    config.admission.max_agents = 4;
    config.admission.max_per_device = thunderbolt::limits::per_device_cap(4);
    config.admission.max_guests = thunderbolt::limits::guests_cap(4);
    assert_eq!((config.admission.max_per_device, config.admission.max_guests), (3, 3));
    let b = bridge(config).await;
    let guest = client().await;
    b.trust.2.lock().unwrap().push(guest.id());
    let mut held = Vec::new();
    for _ in 0..3 {
        let conn = b.dial(&guest).await;
        let streams = echoed(&conn).await;
        held.push((conn, streams));
    }
    // A fourth from the guest is refused although a slot is free...
    let refused_one = |conn: Connection| async move {
        let (mut s, _r) = conn.open_bi().await.expect("open stream");
        s.write_all(b"{}\n").await.expect("write");
        closed_with(&conn).await
    };
    assert_eq!(refused_one(b.dial(&guest).await).await, refused(close::REASON_AT_CAPACITY));
    // ...and so is another guest's (the guests together hold all they may)...
    let other_guest = client().await;
    b.trust.2.lock().unwrap().push(other_guest.id());
    assert_eq!(refused_one(b.dial(&other_guest).await).await, refused(close::REASON_AT_CAPACITY));
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 3);
    // ...while the owner's own device gets the slot.
    let (_ep, _owner, _s, _r) = b.session().await;
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 4);
    // A session of the guest's ends: it may open one again.
    let (conn, (send, _recv)) = held.pop().unwrap();
    drop(send);
    conn.close(0u32.into(), b"done");
    tokio::time::timeout(WAIT, b.events.wait_for_count("group cleaned up", 1))
        .await
        .expect("the guest's session ended");
    // Its count goes as the session's task ends, just after the agent's group:
    // a dial in between is refused, the next one gets in (a few tries at most).
    for tries in 1.. {
        let conn = b.dial(&guest).await;
        let (mut s, mut r) = conn.open_bi().await.expect("open stream");
        s.write_all(b"{\"id\":1}\n").await.expect("write");
        let mut buf = [0u8; 9];
        if tokio::time::timeout(WAIT, r.read_exact(&mut buf)).await.expect("an answer or a close").is_ok() {
            break;
        }
        assert!(tries < 20, "the guest never got a session again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_while_a_session_is_being_admitted_ends_it() {
    let b = bridge(Config::default()).await;
    let r1 = thunderbolt_shared::resume::resume_alpn(&Protocol::acp());
    let hello = thunderbolt_shared::resume::Control::Hello { session: None, received: 0 }.encode().to_vec();
    for (alpn, first) in [(Protocol::acp().alpn(), b"{}\n".to_vec()), (r1, hello)] {
        let ep = client().await;
        // Admitted by the handshake's check, denied before its session runs.
        b.trust.1.lock().unwrap().push(ep.id());
        let conn = tokio::time::timeout(WAIT, ep.connect(b.addr.clone(), &alpn)).await.unwrap().unwrap();
        // The close may come before the stream is open (the plain path checks
        // before taking the stream): then opening or writing fails, and that is fine.
        if let Ok((mut s, _r)) = conn.open_bi().await {
            let _ = s.write_all(&first).await;
        }
        assert_eq!(
            closed_with(&conn).await,
            refused(close::REASON_MEMBERSHIP_REVOKED),
            "{}",
            String::from_utf8_lossy(&alpn)
        );
    }
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 0, "no agent for a denied device");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_opens_no_stream_is_closed_at_the_deadline() {
    let mut config = Config::default();
    config.admission.stream_open_timeout = Duration::from_millis(300);
    let b = bridge(config).await;
    let ep = client().await;
    b.allow(&ep);
    let started = std::time::Instant::now();
    let conn = b.dial(&ep).await;
    assert_eq!(closed_with(&conn).await, refused(close::REASON_IDLE));
    assert!(started.elapsed() >= Duration::from_millis(300), "closed before its deadline");
    assert_eq!(b.launcher.starts.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_taken_off_the_list_is_closed_at_the_next_heartbeat_and_its_agent_ended() {
    let mut config = Config::default();
    config.admission.heartbeat = Duration::from_millis(100);
    let b = bridge(config).await;
    let (ep, conn, _send, _recv) = b.session().await;
    let (_other_ep, other, _s, _r) = b.session().await;
    b.trust.0.lock().unwrap().retain(|id| *id != ep.id());
    assert_eq!(closed_with(&conn).await, refused(close::REASON_MEMBERSHIP_REVOKED));
    // Its agent goes (the fake records each termination), the other session stays.
    tokio::time::timeout(WAIT, b.events.wait_for_count("group cleaned up", 1))
        .await
        .expect("the revoked session's agent was ended");
    assert!(other.close_reason().is_none(), "the other session was closed too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_every_peer_and_ends_every_agent_before_run_returns() {
    let b = bridge(Config::default()).await;
    let (_e1, c1, _s1, _r1) = b.session().await;
    let (_e2, c2, _s2, _r2) = b.session().await;
    b.stop.cancel();
    tokio::time::timeout(WAIT, b.bridge).await.expect("run returns in time").expect("no panic");
    // Both agents were ended before `run` returned.
    assert_eq!(
        b.events.names().iter().filter(|e| *e == "group cleaned up").count(),
        2,
        "{:?}",
        b.events.names()
    );
    assert_eq!(closed_with(&c1).await, refused(close::REASON_SHUTTING_DOWN));
    assert_eq!(closed_with(&c2).await, refused(close::REASON_SHUTTING_DOWN));
}
