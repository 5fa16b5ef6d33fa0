//! A relay map that fails over: a bridge configured with two relays (real
//! `thunderbolt-relay` processes), a client whose only path is through a
//! relay (direct UDP dropped by nftables), and the relay the bridge is homed
//! on killed mid-stream.

use std::time::{Duration, Instant};

use serde_json::Value;
use thunderbolt_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Messages in the stream.
const MESSAGES: u64 = 3000;

/// A home whose processes use both relays (`a` first).
fn home(a: &iroh::RelayUrl, b: &iroh::RelayUrl) -> Tb {
    Tb::new(None).with_env("THUNDERBOLT_IROH_RELAY_URL", format!("{a},{b}"))
}

/// The relay in `status`'s view of the bridge's (first) agent that is its home.
async fn home_relay(tb: &Tb) -> Option<String> {
    let out = tb.run(&["status", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["bridges"][0]["agents"][0]["relay"]["url"].as_str().map(str::to_string)
}

/// One relay-only `connect` of `client` to `ticket`, one line there and back.
async fn one_line(client: &Tb, ticket: &str) {
    let (mut child, log) = client.connect(&[ticket]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin.write_all(b"{\"one\":1}\n").await.unwrap();
    let l = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("a new connect with the old ticket got nothing back:\n{}", log.text()))
        .unwrap()
        .unwrap();
    assert_eq!(l, "{\"one\":1}");
    drop(stdin);
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", log.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_relay_killed_mid_stream_the_stream_completes_through_the_other_exactly_once() {
    if !Outage::available() {
        eprintln!("skipped: nftables is not usable here (run in a network namespace of your own as root)");
        return;
    }
    init_tracing();
    let (relay_a, url_a) = relay_process("127.0.0.1:0").await;
    let (relay_b, url_b) = relay_process("127.0.0.1:0").await;
    let mut children = vec![(url_a.clone(), relay_a), (url_b.clone(), relay_b)];
    let bridge_home = home(&url_a, &url_b);
    let client_home = home(&url_a, &url_b);
    bridge_home.allow(&client_home.node_id("acp").await).await;
    // Another device, with the ticket printed before the outage.
    let later_home = home(&url_a, &url_b);
    bridge_home.allow(&later_home.node_id("acp").await).await;
    let agent = test_agent_bin();
    let bridge = bridge_home.bridge("acp", &[], &[agent.to_str().unwrap(), "cat"]).await;
    // The ticket carries both relays.
    let ticket: thunderbolt_shared::EndpointTicket = bridge.ticket.parse().unwrap();
    let relays: Vec<String> = ticket.endpoint_addr().relay_urls().map(|u| u.to_string()).collect();
    assert!(relays.contains(&url_a.to_string()) && relays.contains(&url_b.to_string()), "{relays:?}");
    // Only relays: no UDP between the client and the bridge.
    let _direct_off = Outage::udp_port(banner_port(&bridge.banner));

    let (mut child, log) = client_home.connect(&[&bridge.ticket]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect = 0u64;
    let mut gaps = Vec::new();
    let mut n = 0u64;
    while n < MESSAGES {
        // A relay killed mid-stream: the next chunk goes out while it is dead.
        let killed = match n {
            1000 | 2000 => {
                // The one the bridge is homed on now (iroh picks the nearest).
                let homed = home_relay(&bridge_home).await.expect("the bridge has a home relay");
                let at = children.iter().position(|(u, _)| u.as_str() == homed).expect("a relay of ours");
                let (url, mut c) = children.remove(at);
                c.start_kill().unwrap();
                let _ = c.wait().await;
                eprintln!("killed {url}, the bridge's home");
                Some((Instant::now(), url))
            }
            _ => None,
        };
        let mut chunk = String::new();
        for k in n..n + 100 {
            chunk.push_str(&format!("{{\"n\":{k}}}\n"));
        }
        stdin.write_all(chunk.as_bytes()).await.unwrap();
        n += 100;
        let mut last = killed.as_ref().map_or_else(Instant::now, |(at, _)| *at);
        let mut gap = Duration::ZERO;
        while expect < n {
            let l = tokio::time::timeout(WAIT, lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("stalled at {expect}; connect:\n{}\nbridge:\n{}", log.text(), bridge.log.text())
                })
                .unwrap()
                .unwrap();
            assert_eq!(serde_json::from_str::<Value>(&l).unwrap()["n"], expect, "in order, once");
            gap = gap.max(last.elapsed());
            last = Instant::now();
            expect += 1;
        }
        if let Some((_, url)) = killed {
            eprintln!("relay {url} killed → the longest wait for a message after it: {gap:?}");
            if gap > Duration::from_secs(2) {
                eprintln!("slow: connect:\n{}\nbridge:\n{}", log.text(), bridge.log.text());
            }
            gaps.push(gap);
            // `status` says which relay is home and which one is not reachable.
            let relays = loop {
                let out = bridge_home.run(&["status", "--json"]).await;
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                let relays = v["bridges"][0]["agents"][0]["relay"]["relays"].clone();
                let dead =
                    relays.as_array().and_then(|a| a.iter().find(|r| r["url"] == url.as_str()).cloned());
                if dead.as_ref().is_some_and(|d| d["reachable"] == false) {
                    break relays;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let home = relays.as_array().unwrap().iter().find(|r| r["home"] == true).expect("a home relay");
            assert_ne!(home["url"], url.as_str(), "{relays}");
            assert_eq!(home["reachable"], true, "{relays}");
            bridge.log.wait_for(&format!("relay {url} lost: re-homed on")).await;
            if n == 1100 {
                // A ticket printed while it was home still reaches the bridge (through the other).
                let t0 = Instant::now();
                one_line(&later_home, &bridge.ticket).await;
                eprintln!(
                    "a new connect with the old ticket during the outage: {:?} to its first answer",
                    t0.elapsed()
                );
                // It comes back, at its address: nothing breaks.
                let bind = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
                let (c, again) = relay_process(&bind).await;
                assert_eq!(again, url);
                children.push((url, c));
            }
        }
    }
    assert_eq!(gaps.len(), 2, "both relays died once, in turn");
    drop(stdin);
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", log.text());
    assert_eq!(
        bridge.log.text().matches("agent started").count(),
        2,
        "the same agent (and the one line's): {}",
        bridge.log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_banner_says_when_one_relay_is_all_a_browser_has() {
    let relay = LocalRelay::start().await;
    let one = Tb::new(Some(&relay));
    let agent = test_agent_bin();
    let b = one.bridge("acp", &[], &[agent.to_str().unwrap(), "cat"]).await;
    assert!(b.banner.contains("is the only relay"), "{}", b.banner);
    let (_a, url_a) = relay_process("127.0.0.1:0").await;
    let two = home(&url_a, &relay.url);
    let b2 = two.bridge("acp", &[], &[agent.to_str().unwrap(), "cat"]).await;
    assert!(!b2.banner.contains("is the only relay"), "{}", b2.banner);
    assert!(b2.banner.contains(url_a.as_str()) && b2.banner.contains(relay.url.as_str()), "{}", b2.banner);
}
