//! The `nat` section: the bridge at "home" behind one NAT, `connect` on a
//! "phone" behind another, a TLS relay with QUIC address discovery between them
//! (the NAT tests' topology, [`thunderbolt_tests::nat`]). How long until the
//! path is direct, and what direct buys against the relay on the same
//! topology shape (the relay figures come from a phone NAT that maps every
//! destination to a new port, so its sessions stay on the relay).

use thunderbolt_tests::nat::{Mapping, Topology};

use super::*;

/// Fresh `connect` processes timed from start to a direct path.
const DIRECT_REPS: usize = 5;

/// One topology with its bridge, and a phone whose `connect` the bridge admits.
struct Nat {
    t: Topology,
    phone: Tb,
    bridge: RunningBridge,
    _home: Tb,
}

impl Nat {
    async fn build(b: &Bench, mapping: Mapping) -> Result<Self> {
        let t = Topology::build(mapping).await;
        let (home, phone) = (t.tb(), t.tb());
        home.allow(&phone.node_id("acp").await).await;
        let mut c = home.cmd();
        c.args(["acp", "--transport", "iroh", "--"]).arg(&b.agent).arg("cat");
        let mut c = t.home.enter(c);
        c.stdin(Stdio::null());
        let bridge = RunningBridge::start(c).await;
        Ok(Self { t, phone, bridge, _home: home })
    }

    /// A `connect` on the phone, past its first echo.
    async fn connect(&self) -> Result<ConnectProc> {
        let c = self.t.phone.enter(ConnectProc::command(&self.phone, &self.bridge.ticket, &[]));
        let mut p = ConnectProc::spawn(c)?;
        p.round_trips(1).await?;
        Ok(p)
    }

    /// A `connect` whose path is direct, how long after its start its first
    /// response came (on the relay) and how long until the path was direct.
    async fn direct(&self) -> Result<(ConnectProc, Duration, Duration)> {
        let t0 = Instant::now();
        let p = self.connect().await?;
        let first = t0.elapsed();
        tokio::time::timeout(WAIT, p.log.wait_for("path changed: direct"))
            .await
            .with_context(|| format!("the path never became direct: {}", p.log.text()))?;
        Ok((p, first, t0.elapsed()))
    }
}

pub async fn nat_rows(b: &Bench) -> Result<Vec<Row>> {
    if !Topology::available() {
        eprintln!("bench: skipping nat: needs root with unshare, nsenter, ip and nft");
        return Ok(Vec::new());
    }
    let direct = Nat::build(b, Mapping::EndpointIndependent).await?;
    let relay = Nat::build(b, Mapping::EndpointDependent).await?;
    let total = b.plan.bulk_bytes;

    let (mut to_first, mut to_direct) = (Vec::new(), Vec::new());
    for _ in 0..DIRECT_REPS {
        let (p, first, took) = direct.direct().await?;
        to_first.push(ms(first));
        to_direct.push(ms(took));
        p.finish().await?;
    }

    let (mut dbulk, mut rbulk) = (Vec::new(), Vec::new());
    for _ in 0..b.plan.bulk_reps {
        let (p, _, _) = direct.direct().await?;
        dbulk.push(p.bulk(total).await?);
        rbulk.push(relay.connect().await?.bulk(total).await?);
    }

    let (mut dp, _, _) = direct.direct().await?;
    let mut rp = relay.connect().await?;
    let (d50, r50) = dp.alternating_p50(&mut rp, b.plan.rtts).await?;
    dp.finish().await?;
    rp.finish().await?;
    if relay.bridge.log.contains("path changed") {
        bail!("the relay-only topology went direct: its figures are not the relay's");
    }

    let relay_name = "relay (phone NAT maps per destination)";
    Ok(vec![
        row(
            "two NATs: connect start → path direct",
            "ms",
            to_direct,
            "connect start → first response (on the relay)",
            to_first,
            false,
        ),
        row(
            &format!("two NATs: bulk {} MiB through connect, direct", total >> 20),
            "MB/s",
            dbulk,
            relay_name,
            rbulk,
            true,
        ),
        row("two NATs: ~200 B round trip p50 through connect, direct", "µs", d50, relay_name, r50, false),
    ])
}
