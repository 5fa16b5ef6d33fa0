//! The `host` section: what serving many agents from one process costs. Idle
//! RSS of a host with 1, 5 and 20 agents (against 20 single-agent bridges,
//! which is what one terminal per agent costs); dial → first response of the
//! 20th agent against a single-agent bridge; an allowed peer's dial to one
//! agent while fresh identities flood another.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// Agents in the largest host measured.
const MANY: usize = 20;

/// Between the flooded row's dials: well inside the per-device budget of a
/// one-second window (the dials measure latency, not a rate).
const DIAL_PACE: Duration = Duration::from_millis(50);

/// A running `thunderbolt host` and its agents' addresses, in banner order.
struct Host {
    proc: RunningBridge,
    addrs: Vec<EndpointAddr>,
    tickets: Vec<String>,
}

/// A host of `n` cat agents on the bench's relay, its client allowed (and
/// the devices `also`).
async fn host(b: &Bench, relay: &RelayUrl, n: usize, also: &[iroh::EndpointId]) -> Result<Host> {
    let tb = Tb::with_relay_url(relay);
    tb.allow(&b.client_id()).await;
    for id in also {
        tb.allow(id).await;
    }
    let dir = tb.home().join("agents.d");
    std::fs::create_dir(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    for i in 0..n {
        let p = dir.join(format!("a{i:02}.json"));
        std::fs::write(&p, format!(r#"{{"name":"a{i:02}","command":["{}","cat"]}}"#, b.agent))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
    }
    let mut c = tb.cmd();
    // A one-second window: the per-device budget (`limits::PER_DEVICE_MAX`
    // admitted per window) then holds a paced bench, full plan included.
    c.env("RUST_LOG", "warn").args(["host", "--per-remote-max", "1000000", "--per-remote-window", "1"]);
    let (child, banner, log) = start_with_banner(c).await;
    let tickets: Vec<String> = banner
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Ticket:").map(|t| t.trim().to_string()))
        .collect();
    if tickets.len() != n {
        bail!("the host serves {} of {n} agents:\n{banner}\n{}", tickets.len(), log.text());
    }
    let addrs = tickets
        .iter()
        .map(|t| Ok(t.parse::<EndpointTicket>()?.endpoint_addr().clone()))
        .collect::<Result<Vec<_>>>()?;
    // Keep the home alive as long as the host.
    std::mem::forget(tb);
    let node_id = addrs[0].id;
    let ticket = tickets[0].clone();
    Ok(Host { proc: RunningBridge { child, node_id, ticket, banner, log }, addrs, tickets })
}

/// Idle RSS (KiB) once the process has settled after start.
async fn idle_rss(pid: u32) -> Result<f64> {
    // Relay connections and address discovery settle within a second or two.
    tokio::time::sleep(Duration::from_secs(3)).await;
    rss_kib(pid)
}

pub async fn host_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let relay = b.relay_url.clone();
    let mut rss = Vec::new();
    // The flooded row's allowed peer: a device of its own, because the
    // bench's client spent its budget of dials on the rows before
    // (`limits::PER_DEVICE_MAX` admitted per window: past it a device is
    // refused `bridge at capacity`, as a script in a loop is).
    let calm_key = SecretKey::generate();
    for n in [1, 5, MANY] {
        let mut h = host(b, &relay, n, &[calm_key.public()]).await?;
        let kib = idle_rss(h.proc.pid()).await?;
        eprintln!("bench: host with {n} agent(s): idle RSS {kib:.0} KiB");
        rss.push((n, kib));
        if n == MANY {
            // Dial → first response, the 20th agent against a single-agent bridge, taking turns.
            let mut single = b.cat_bridge().await;
            let single_addr = p.addr_of(&single)?;
            let last = path_addr(h.addrs.last().context("agents")?, p.relay_only);
            let acp = Protocol::acp().alpn();
            first_response(&p.ep, &last, &acp, b"{}\n").await?;
            first_response(&p.ep, &single_addr, &acp, b"{}\n").await?;
            let (mut hosted, mut alone) = (Vec::new(), Vec::new());
            for _ in 0..b.plan.setup_reps {
                hosted.push(ms(first_response(&p.ep, &last, &acp, b"{}\n").await?));
                alone.push(ms(first_response(&p.ep, &single_addr, &acp, b"{}\n").await?));
            }
            let single_rss = rss_kib(single.pid())?;
            single.terminate().await;
            rows.push(row(
                &format!("dial → first response, the {MANY}th agent of a host (direct)"),
                "ms",
                hosted,
                "a single-agent bridge",
                alone,
                false,
            ));
            rows.push(
                row_stats(
                    &format!("host RSS idle, {MANY} agents"),
                    "KiB",
                    kib,
                    single_rss * MANY as f64,
                    false,
                )
                .named_baseline(&format!("{MANY} single-agent bridges")),
            );

            // A flood of fresh identities at the first agent (through the
            // relay); an allowed peer dials the last one meanwhile.
            let via_relay = path_addr(h.addrs.last().context("agents")?, true);
            let ep = client(&relay, calm_key.clone(), true).await?;
            first_response(&ep, &via_relay, &acp, b"{}\n").await?;
            let mut calm = Vec::new();
            for _ in 0..b.plan.setup_reps {
                calm.push(ms(first_response(&ep, &via_relay, &acp, b"{}\n").await?));
                tokio::time::sleep(DIAL_PACE).await;
            }
            let secs = (b.plan.setup_reps as f64 * 2.0 + 10.0).to_string();
            let mut flood = Command::new(std::env::current_exe()?)
                .args(["flood", &relay.to_string(), &h.tickets[0], &secs])
                .kill_on_drop(true)
                .spawn()?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut flooded = Vec::new();
            for _ in 0..b.plan.setup_reps {
                flooded.push(ms(first_response(&ep, &via_relay, &acp, b"{}\n").await?));
                tokio::time::sleep(DIAL_PACE).await;
            }
            let _ = flood.kill().await;
            ep.close().await;
            rows.push(row(
                "allowed peer dial → first response, one agent while another is flooded (relay)",
                "ms",
                flooded,
                "same, no flood",
                calm,
                false,
            ));
        }
        h.proc.terminate().await;
    }
    let one = rss[0].1;
    for (n, kib) in &rss[1..] {
        rows.push(
            row_stats(&format!("host RSS idle, {n} agents"), "KiB", *kib, one, false)
                .named_baseline("host with 1 agent"),
        );
    }
    Ok(rows)
}
