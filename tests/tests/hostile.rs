//! Hostile peers against a real bridge: stalled handshakes from many source
//! addresses must not lock an allowed peer out. Everything on loopback; every
//! loop is bounded.

use std::{net::SocketAddr, time::Duration};

use thunderbolt_shared::{EndpointTicket, Protocol};
use thunderbolt_tests::{hostile::capture_initials, *};
use tokio::net::UdpSocket;

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
