//! The `failover` section: a bridge with two relays of its own (relay
//! processes), a `connect` whose only path is through them (direct UDP
//! dropped), and the bridge's home relay killed: the time to the next
//! message of a steady stream, with the failover (re-home at once, redial
//! when the path's relay is gone) and with iroh left to itself
//! (`THUNDERBOLT_RELAY_FAILOVER=off`) in the same run; and a new dial with the
//! ticket printed before the outage.

use super::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Relay deaths measured with the failover (each a second or so).
const FAILOVER_REPS: usize = 3;

/// How long the unaided figure may take before it is given up (iroh re-checks
/// every 20–26 s; the client's idle timeout is 10 s).
const UNAIDED_LIMIT: Duration = Duration::from_secs(60);

/// One relay death: `(kill → next message, new dial → first answer)`.
async fn one_death(failover: bool) -> Result<(Duration, Duration)> {
    let (relay_a, url_a) = relay_process("127.0.0.1:0").await;
    let (relay_b, url_b) = relay_process("127.0.0.1:0").await;
    let mut relays = vec![(url_a.clone(), relay_a), (url_b.clone(), relay_b)];
    let env = format!("{url_a},{url_b}");
    let switch = if failover { "on" } else { "off" };
    let home = || {
        Tb::new(None)
            .with_env("THUNDERBOLT_IROH_RELAY_URL", env.clone())
            .with_env("THUNDERBOLT_RELAY_FAILOVER", switch)
    };
    let (bridge_home, client, later) = (home(), home(), home());
    for c in [&client, &later] {
        bridge_home.allow(&c.node_id("acp").await).await;
    }
    let agent = test_agent_bin().display().to_string();
    let mut bridge = bridge_home.bridge("acp", &[], &[&agent, "cat"]).await;
    let _direct_off = Outage::udp_port(banner_port(&bridge.banner));
    let mut c = ConnectProc::start(&client, &bridge.ticket, &[]).await?;
    let mut lines = BufReader::new(std::mem::replace(&mut c.stdout, dummy_stdout()?)).lines();
    let mut next = 0u64;
    let echo = |n: u64| format!("{{\"n\":{n}}}\n");
    c.stdin.write_all(echo(next).as_bytes()).await?;
    lines.next_line().await?.context("first echo")?;
    next += 1;
    let out = bridge_home.run(&["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let homed = v["bridges"][0]["agents"][0]["relay"]["url"].as_str().context("a home relay")?.to_string();
    let at = relays.iter().position(|(u, _)| u.as_str() == homed).context("a relay of ours")?;
    let (_, mut dead) = relays.remove(at);
    dead.start_kill()?;
    let _ = dead.wait().await;
    let killed = Instant::now();
    // A steady stream: a message every 10 ms until one comes back.
    // Nothing was on its way at the kill: the first line back is the first after it.
    let back = async {
        lines.next_line().await?.context("connect's output ended")?;
        anyhow::Ok(killed.elapsed())
    };
    let send = async {
        loop {
            c.stdin.write_all(echo(next).as_bytes()).await?;
            next += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        #[allow(unreachable_code)]
        anyhow::Ok(())
    };
    // Past the limit the figure is the limit (a lower bound of iroh's own).
    let gap = tokio::select! {
        r = tokio::time::timeout(UNAIDED_LIMIT, back) => match r {
            Ok(r) => r?,
            Err(_) => {
                eprintln!("bench: failover ({switch}): no message within {UNAIDED_LIMIT:?}; connect:\n{}", c.log.text());
                UNAIDED_LIMIT
            }
        },
        r = send => { r?; unreachable!() }
    };
    eprintln!("bench: failover {switch}: kill → next message {gap:?}");
    // A new device with the ticket printed before the outage.
    let t0 = Instant::now();
    let mut d = ConnectProc::start(&later, &bridge.ticket, &[]).await?;
    let dial = match tokio::time::timeout(UNAIDED_LIMIT, d.round_trips(1)).await {
        Ok(r) => {
            r?;
            t0.elapsed()
        }
        Err(_) => UNAIDED_LIMIT,
    };
    drop(d);
    drop(c);
    bridge.terminate().await;
    Ok((gap, dial))
}

pub async fn failover_rows() -> Result<Vec<Row>> {
    if !Outage::available() {
        eprintln!("bench: failover skipped (nftables is not usable: run tests/bench.sh as root)");
        return Ok(Vec::new());
    }
    let (mut gaps, mut dials) = (Vec::new(), Vec::new());
    for _ in 0..FAILOVER_REPS {
        let (g, d) = one_death(true).await?;
        gaps.push(g.as_secs_f64() * 1e3);
        dials.push(d.as_secs_f64() * 1e3);
    }
    let (g, d) = one_death(false).await?;
    Ok(vec![
        row(
            "home relay killed → next message of a resumable session, relay-only path (goal ≤ 2000 ms)",
            "ms",
            gaps,
            "iroh unaided (THUNDERBOLT_RELAY_FAILOVER=off)",
            vec![g.as_secs_f64() * 1e3],
            false,
        ),
        row(
            "a new connect with the ticket printed before the outage → first answer",
            "ms",
            dials,
            "iroh unaided",
            vec![d.as_secs_f64() * 1e3],
            false,
        ),
    ])
}
