//! Hostile clients for tests and the bench: what an attacker sends, made from
//! real iroh dials so the bridge cannot tell it from a client's first packet.

use std::collections::HashSet;

use iroh::{EndpointAddr, EndpointId, SecretKey};
use thunderbolt_shared::Protocol;
use tokio::net::UdpSocket;

use crate::{client_endpoint, WAIT};

/// The destination connection id of a QUIC v1 long-header Initial packet, if
/// `d` is one (type bits 00).
pub fn initial_dcid(d: &[u8]) -> Option<&[u8]> {
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
pub async fn capture_initials(n: usize, bridge: EndpointId) -> Vec<Vec<u8>> {
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
