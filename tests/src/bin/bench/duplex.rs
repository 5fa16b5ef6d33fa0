//! The `duplex` section: the default path as users run it. ~1 KiB ndjson
//! lines echoed full duplex through a `cat` agent by `thunderbolt acp
//! connect`, resumable (the default) against `--no-resume`, taking turns in
//! one run; with relays disabled, and with the default relays configured but
//! unreachable (a laptop offline, a network that blocks them), each repeated
//! to show the spread; and the plain path against a second series of itself,
//! which says how much of a ratio between series is this machine's noise.
//! The unreachable case runs only in a loopback-only namespace, where the
//! public relays cannot be reached (nothing leaves).
//!
//! The lines are JSON strings (the path's own cost: the bridge reads nothing
//! of a string but its end), and once more, relays disabled, ACP
//! `session/update` notifications of the same size (what a session carries:
//! the bridge reads each message's head, and the resumable path its ACP
//! session and requests too).
//!
//! Both shapes run once more with the CPUs split ([`Split`]): the bridge and
//! its agent on one side, the bench's client and `connect` on the other, as
//! when the bridge is another machine. Then the bridge's core is what limits
//! a transfer, its own cost per MB shows in the throughput, and how the
//! scheduler shared the cores no longer does.

use super::{placement::Split, *};

/// Each line's size: a typical agent message, not a bulk block.
const DUPLEX_LINE: usize = 1024;

/// Transfers per client and relay setting (the minimum is what the budget is
/// on). Each moves the plan's `duplex_bytes`: at 64 MiB a transfer lasted a
/// fifth of a second, and how the two cores were shared in that moment swung
/// it by a third either way, for the plain path against itself as much as
/// for the two paths (its minimum ratio 0.93–1.36 in three runs). Longer
/// transfers narrow it: 0.85–1.09 at 256 MiB (`--quick`, two runs), 0.97–1.09
/// at 512 MiB (the full plan, five runs).
const DUPLEX_REPS: usize = 5;

/// What the lines are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// JSON strings.
    Strings,
    /// ACP `session/update` notifications (an agent's streamed reply).
    AcpUpdates,
}

/// `DUPLEX_LINE`-byte ndjson lines of `shape`, 64 of them.
fn duplex_block(shape: Shape) -> Vec<u8> {
    let line = match shape {
        Shape::Strings => {
            let mut line = vec![b'a'; DUPLEX_LINE - 1];
            line[0] = b'"';
            line[DUPLEX_LINE - 2] = b'"';
            line
        }
        Shape::AcpUpdates => {
            let head = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_9f2c4e1a","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""#;
            let tail = br#""}}}}"#;
            let text = DUPLEX_LINE - 1 - head.len() - tail.len();
            let words = b"the quick brown fox jumps over the lazy dog ".iter().cycle().take(text);
            head.iter().copied().chain(words.copied()).chain(tail.iter().copied()).collect()
        }
    };
    assert_eq!(line.len(), DUPLEX_LINE - 1, "a line and its newline are DUPLEX_LINE bytes");
    line.iter().copied().chain([b'\n']).cycle().take(DUPLEX_LINE * 64).collect()
}

/// One series of transfers in a repetition.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Series {
    Resumable,
    Plain,
    /// The plain path again: the spread two identical series show.
    PlainAgain,
}

/// How the relays are set for the bridge and the client.
#[derive(Clone, Copy)]
enum Relays {
    Disabled,
    /// The public default relays, which a loopback-only namespace cannot reach.
    Unreachable,
}

impl Relays {
    fn name(self) -> &'static str {
        match self {
            Relays::Disabled => "relays disabled",
            Relays::Unreachable => "default relays unreachable",
        }
    }

    fn apply(self, c: &mut tokio::process::Command) {
        match self {
            Relays::Disabled => c.env("THUNDERBOLT_IROH_RELAY_URL", "disabled"),
            Relays::Unreachable => c.env_remove("THUNDERBOLT_IROH_RELAY_URL"),
        };
    }
}

pub async fn duplex_rows(b: &Bench) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    b.tb.allow(&client.node_id("acp").await).await;
    let total = b.plan.duplex_bytes;
    let mut rows = Vec::new();
    // Each setting: the relays, the lines, and the CPUs split or shared.
    let split = Split::new()?;
    let mut settings = vec![(Relays::Disabled, Shape::Strings, None)];
    if loopback_only() {
        settings.push((Relays::Unreachable, Shape::Strings, None));
    } else {
        eprintln!(
            "bench: duplex with unreachable default relays needs a loopback-only namespace (tests/bench.sh)"
        );
    }
    settings.push((Relays::Disabled, Shape::AcpUpdates, None));
    match &split {
        Some(s) => settings.extend([
            (Relays::Disabled, Shape::Strings, Some(s)),
            (Relays::Disabled, Shape::AcpUpdates, Some(s)),
        ]),
        None => {
            eprintln!("bench: duplex with the CPUs split between the bridge and the client needs two CPUs")
        }
    }
    for (relays, shape, split) in settings {
        let block = duplex_block(shape);
        // The rows of JSON strings keep the names earlier runs were recorded under.
        let (lines, mut case) = match shape {
            Shape::Strings => ("~1 KiB lines", relays.name().to_string()),
            Shape::AcpUpdates => (
                "~1 KiB ACP session/update messages",
                format!("{}, ACP session/update messages", relays.name()),
            ),
        };
        // How the CPUs were shared, for the row names.
        let placed = split.map_or(String::new(), |s| {
            let (client_cpus, bridge_cpus) = s.sides();
            format!(", CPUs split: bridge and agent on {bridge_cpus}, client and connect on {client_cpus}")
        });
        case.push_str(&placed);
        let mut c = b.tb.cmd();
        relays.apply(&mut c);
        c.env("RUST_LOG", "warn").args(["acp", "--transport", "iroh", "--per-remote-max", "1000000"]);
        c.args(["--", &b.agent, "cat"]);
        if let Some(s) = split {
            s.bridge_side(&mut c);
        }
        let cat = RunningBridge::start(c).await;
        // This process's threads go to the client's side for the setting's transfers.
        let client_side = split.map(Split::enter).transpose()?;
        let (mut r1, mut plain, mut plain_again) = (Vec::new(), Vec::new(), Vec::new());
        let (mut r1_wait, mut plain_wait) = (Vec::new(), Vec::new());
        // The machine's busy CPU per MB (every process): what each path costs,
        // apart from how the two cores happened to be shared in one run.
        let (mut r1_cpu, mut plain_cpu) = (CpuPerMb::default(), CpuPerMb::default());
        // ... and, of it, the two processes of ours: the bridge and `connect`.
        let (mut r1_bridge, mut plain_bridge) = (Vec::new(), Vec::new());
        let (mut r1_connect, mut plain_connect) = (Vec::new(), Vec::new());
        let mb = total as f64 / 1e6;
        for rep in 0..DUPLEX_REPS {
            // The plain path twice: how far two series of the very same path
            // fall apart here is the floor under any budget on these rows.
            // The order turns each repetition, so no series always goes first.
            let mut series = [Series::Resumable, Series::Plain, Series::PlainAgain];
            series.rotate_left(rep % 3);
            for s in series {
                let extra: &[&str] = if s == Series::Resumable { &[] } else { &["--no-resume"] };
                let mut cmd = ConnectProc::command(&client, &cat.ticket, extra);
                relays.apply(&mut cmd);
                if let Some(s) = split {
                    s.client_side(&mut cmd);
                }
                let mut p = ConnectProc::spawn(cmd)?;
                let connect_pid = p.child.id().context("connect's pid")?;
                let ours = || (process_cpu_ms(cat.pid()), process_cpu_ms(connect_pid));
                let (cpu0, ours0) = (MachineCpu::now(), ours());
                let (mbs, longest) = transfer_block_timed(&mut p.stdin, &mut p.stdout, &block, total).await?;
                // Read before `connect` exits (its /proc entry goes with it).
                let ours1 = ours();
                p.finish().await?;
                let per_mb = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / mb);
                let (bridge_ms, connect_ms) = (per_mb(ours0.0, ours1.0), per_mb(ours0.1, ours1.1));
                let (out, compared) = match s {
                    Series::Resumable => {
                        (&mut r1, Some((&mut r1_cpu, &mut r1_wait, &mut r1_bridge, &mut r1_connect)))
                    }
                    Series::Plain => (
                        &mut plain,
                        Some((&mut plain_cpu, &mut plain_wait, &mut plain_bridge, &mut plain_connect)),
                    ),
                    Series::PlainAgain => (&mut plain_again, None),
                };
                if let Some((cpu, wait, bridge, connect)) = compared {
                    cpu.add(cpu0, mb);
                    wait.push(longest.as_secs_f64() * 1e3);
                    bridge.extend(bridge_ms);
                    connect.extend(connect_ms);
                }
                out.push(mbs);
            }
        }
        drop(client_side);
        let name =
            format!("{lines} echoed full duplex through connect, resumable ({}{placed})", relays.name());
        rows.push(row(&name, "MB/s", r1, "connect --no-resume (plain ALPN)", plain.clone(), true));
        let name = format!(
            "the plain path against itself ({case}): a second series of connect --no-resume, the comparison's own spread"
        );
        rows.push(row(&name, "MB/s", plain_again, "connect --no-resume (plain ALPN)", plain, true));
        let what = format!("the same, resumable, {case}");
        rows.extend(r1_cpu.row(&what, "connect --no-resume (plain ALPN)", plain_cpu));
        // Split by process: which side of the path a difference is on. A
        // transfer too small to take a clock tick (10 ms) of a process (the
        // smoke plan) gives no row.
        let measured = |v: &Vec<f64>| !v.is_empty() && v.iter().all(|&ms| ms > 0.0);
        for (who, r1, plain) in
            [("the bridge", r1_bridge, plain_bridge), ("connect", r1_connect, plain_connect)]
        {
            if measured(&r1) && measured(&plain) {
                let name = format!("CPU ms per MB, {who}'s process alone: {what}");
                rows.push(row(&name, "ms/MB", r1, "connect --no-resume (plain ALPN)", plain, false));
            }
        }
        // A stall anywhere (an acknowledgement QUIC delays, a full buffer)
        // shows as the reader's longest wait; it is what spreads the runs.
        let name = format!("the same, resumable, {case}: the reader's longest wait in a transfer");
        rows.push(row(&name, "ms", r1_wait, "connect --no-resume (plain ALPN)", plain_wait, false));
        let _ = cat.stop().await;
    }
    Ok(rows)
}
