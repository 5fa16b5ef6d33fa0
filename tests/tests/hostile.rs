//! Hostile peers against a real bridge: stalled handshakes from many source
//! addresses must not lock an allowed peer out. Everything on loopback; every
//! loop is bounded.

use std::{collections::HashSet, net::SocketAddr, time::Duration};

use iroh::{EndpointAddr, EndpointId, SecretKey};
use thunderbolt_shared::{EndpointTicket, Protocol};
use thunderbolt_tests::*;
use tokio::net::UdpSocket;

/// The destination connection id of a QUIC v1 long-header Initial packet, if
/// `d` is one (type bits 00).
fn initial_dcid(d: &[u8]) -> Option<&[u8]> {
    if d.len() < 6 || d[0] & 0xf0 != 0xc0 || d[1..5] != [0, 0, 0, 1] {
        return None;
    }
    let len = d[5] as usize;
    d.get(6..6 + len)
}

/// The first packet of `n` real dial attempts to `bridge`, each a QUIC Initial
/// with its own connection id: what a client that stalls after its first
/// packet sends. A UDP trap stands in for the bridge; each attempt is dropped
/// once its first packet was caught.
async fn capture_initials(n: usize, bridge: EndpointId) -> Vec<Vec<u8>> {
    let trap = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dialer = client_endpoint(SecretKey::generate(), None, false).await;
    let addr = EndpointAddr::new(bridge).with_ip_addr(trap.local_addr().unwrap());
    let alpn = Protocol::acp().alpn();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    for _ in 0..n * 4 {
        if out.len() == n {
            break;
        }
        let dial = dialer.connect(addr.clone(), &alpn);
        tokio::pin!(dial);
        let got = tokio::time::timeout(WAIT, async {
            loop {
                tokio::select! {
                    r = trap.recv_from(&mut buf) => {
                        let len = r.unwrap().0;
                        // Retransmissions and closes of earlier attempts reuse their id.
                        if let Some(dcid) = initial_dcid(&buf[..len]) {
                            if seen.insert(dcid.to_vec()) {
                                return buf[..len].to_vec();
                            }
                        }
                    }
                    _ = &mut dial => panic!("a dial to the trap cannot complete"),
                }
            }
        })
        .await
        .expect("a dial sends its first packet");
        out.push(got);
    }
    assert_eq!(out.len(), n, "captured {} distinct initials", out.len());
    dialer.close().await;
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn stalled_handshakes_from_many_addresses_do_not_lock_out_an_allowed_peer() {
    init_tracing();
    let bridge_home = Tb::new(None);
    let client_home = Tb::new(None);
    bridge_home.allow(&client_home.node_id("acp").await).await;
    let agent = test_agent_bin().display().to_string();
    let mut c = bridge_home.cmd();
    c.args(["acp", "--transport", "iroh", "--", &agent, "cat"])
        .env("RUST_LOG", std::env::var("BRIDGE_LOG").unwrap_or("info".into()));
    let bridge = RunningBridge::start(c).await;
    let ticket: EndpointTicket = bridge.ticket.parse().unwrap();
    let bridge_addr: SocketAddr = *ticket.endpoint_addr().ip_addrs().next().expect("a direct address");

    // The attack of the report: 20 stalled dials a second from 16 source
    // addresses (127.0.0.2–17, all loopback), each a fresh connection id.
    let initials = capture_initials(120, bridge.node_id).await;
    // The peer starts once the attack has had time to take every slot.
    let (filled_tx, filled_rx) = tokio::sync::oneshot::channel::<()>();
    let mut attackers = Vec::new();
    for n in 2..18u8 {
        attackers.push(UdpSocket::bind(SocketAddr::from(([127, 0, 0, n], 0))).await.unwrap());
    }
    let attack = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut filled_tx = Some(filled_tx);
        for (i, packet) in initials.iter().enumerate() {
            tick.tick().await;
            attackers[i % attackers.len()].send_to(packet, bridge_addr).await.unwrap();
            if i == 24 {
                let _ = filled_tx.take().map(|tx| tx.send(()));
            }
        }
    };

    // Meanwhile an allowed peer dials again and again; every dial must work
    // (before the fix: 6–10 s each, or failures, for the whole attack).
    let key = client_home.secret_key("acp").await;
    let peer = async {
        let ep = client_endpoint(key, None, false).await;
        let mut took = Vec::new();
        filled_rx.await.unwrap();
        for i in 0..8 {
            // Spread over the attack (pacing, not synchronisation).
            tokio::time::sleep(Duration::from_millis(250)).await;
            let started = std::time::Instant::now();
            let conn = tokio::time::timeout(
                WAIT,
                ep.connect(ticket.endpoint_addr().clone(), &Protocol::acp().alpn()),
            )
            .await
            .unwrap_or_else(|_| panic!("dial {i} never finished"))
            .unwrap_or_else(|e| panic!("dial {i} failed under the attack: {e}"));
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(b"{\"n\":1}\n").await.unwrap();
            send.finish().unwrap();
            let echoed = tokio::time::timeout(WAIT, recv.read_to_end(1024)).await.unwrap().unwrap();
            assert_eq!(echoed, b"{\"n\":1}\n");
            took.push(started.elapsed());
            conn.close(0u32.into(), b"client closed");
        }
        ep.close().await;
        took
    };
    let ((), took) = tokio::join!(attack, peer);

    // The replayed packets were real handshakes to the bridge: it answered them.
    let mut answered = 0;
    let mut buf = vec![0u8; 4096];
    for s in &attackers {
        while let Ok(Ok(_)) = tokio::time::timeout(Duration::ZERO, s.recv_from(&mut buf)).await {
            answered += 1;
        }
    }
    assert!(answered > 0, "the bridge never answered the replayed initials: the attack did not happen");
    if std::env::var("BRIDGE_LOG").is_ok() {
        eprintln!("BRIDGE LOG:\n{}", bridge.log.text());
    }
    let slowest = took.iter().max().unwrap();
    assert!(*slowest < Duration::from_secs(5), "an allowed dial took {slowest:?} under the attack: {took:?}");
}
