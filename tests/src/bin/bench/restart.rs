//! The `restart` section: what journaling resumable sessions costs (bulk and
//! ~200 B round trips through `connect`, against a bridge run with
//! `--no-journal`, in the same run), and how long a session takes to come
//! back after the bridge restarts (the agent's start and `session/load`
//! included) against the same agent's cold start.

use super::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Restarts measured (each a few seconds: a bridge stopped and started, an agent loaded).
const RESTART_REPS: usize = 3;

/// Journaling's cost: a cat agent behind a journaling bridge and one with
/// `--no-journal`, both open at once, taking turns.
pub async fn journal_rows(b: &Bench) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    let plain_home = Tb::new(None);
    for home in [&b.tb, &plain_home] {
        home.allow(&client.node_id("acp").await).await;
    }
    let cat = || vec![b.agent.clone(), "cat".into()];
    let relay = b.relay_url.clone();
    let mut on = b.bridge_in(&b.tb, &relay, &[], cat(), "info").await;
    let mut off = b.bridge_in(&plain_home, &relay, &["--no-journal"], cat(), "info").await;
    let total = b.plan.bulk_bytes;
    let (mut j, mut nj) = (Vec::new(), Vec::new());
    for _ in 0..b.plan.bulk_reps {
        j.push(ConnectProc::start(&client, &on.ticket, &[]).await?.bulk(total).await?);
        nj.push(ConnectProc::start(&client, &off.ticket, &[]).await?.bulk(total).await?);
    }
    let mut rows = vec![row(
        &format!("bulk {} MiB through connect, resumable, journaled (direct)", total >> 20),
        "MB/s",
        j,
        "the same, --no-journal",
        nj,
        true,
    )];
    let (a, p) = p50_pair(&client, (&on.ticket, &[]), (&off.ticket, &[]), b.plan.rtts).await?;
    rows.push(row(
        &format!(
            "~200 B request/response p50 through connect, journaled (median of {ROUND_TRIP_BLOCKS} blocks)"
        ),
        "µs",
        a,
        "the same, --no-journal",
        p,
        false,
    ));
    on.terminate().await;
    off.terminate().await;
    Ok(rows)
}

/// The SDK agent that keeps its sessions on disk (`client-wasm/e2e`), when its
/// packages are installed.
fn sdk_agent() -> Option<String> {
    let dir = bin_dir().join("../../client-wasm/e2e");
    dir.join("node_modules/@agentclientprotocol/sdk")
        .is_dir()
        .then(|| dir.join("restart-agent.mjs").display().to_string())
}

/// Restart → the first frame the waiting client gets (the session taken back,
/// `session/load` included), against the same agent's cold start (bridge
/// started → `initialize` and `session/new` answered through a new `connect`).
pub async fn restart_rows(b: &Bench) -> Result<Vec<Row>> {
    let Some(script) = sdk_agent() else {
        eprintln!("bench: no restart rows (the ACP SDK is not installed: npm ci in client-wasm/e2e)");
        return Ok(Vec::new());
    };
    // On the relay: the restarted bridge has a new port, and the ticket's relay still reaches it.
    let client = Tb::with_relay_url(&b.relay_url);
    let relay = b.relay_url.clone();
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..RESTART_REPS {
        let home = Tb::new(None);
        home.allow(&client.node_id("acp").await).await;
        let store = tempfile::tempdir()?;
        let agent = vec![
            "node".to_string(),
            script.clone(),
            "--store".into(),
            store.path().display().to_string(),
            "--caps".into(),
            "load".into(),
        ];
        // Cold: the bridge and its agent started, a session opened.
        let t0 = Instant::now();
        let mut first = b.bridge_in(&home, &relay, &[], agent.clone(), "info").await;
        let mut c = Lines::start(&client, &first.ticket)?;
        c.call(0, "initialize", "{\"protocolVersion\":1}").await?;
        c.call(1, "session/new", "{\"cwd\":\"/tmp\",\"mcpServers\":[]}").await?;
        cold.push(ms(t0.elapsed()));
        let prompt = "{\"sessionId\":SID,\"prompt\":[{\"type\":\"text\",\"text\":\"hello\"}]}";
        let sid = c.last["result"]["sessionId"].to_string();
        c.call(2, "session/prompt", &prompt.replace("SID", &sid)).await?;
        // Restarted: stopped, started again; the same client waits for its session.
        first.terminate().await;
        c.log.wait_for("keeps the session").await;
        let t0 = Instant::now();
        let mut again = b.bridge_in(&home, &relay, &[], agent, "info").await;
        c.next().await?;
        warm.push(ms(t0.elapsed()));
        drop(c.stdin);
        let _ = tokio::time::timeout(WAIT, c.child.wait()).await;
        again.terminate().await;
    }
    Ok(vec![row(
        "restart → first frame of the session taken back (agent start and session/load included)",
        "ms",
        warm,
        "the same agent's cold start (bridge start → session/new answered)",
        cold,
        false,
    )])
}

/// A `connect` read line by line.
struct Lines {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    log: Log,
    last: serde_json::Value,
}

impl Lines {
    fn start(tb: &Tb, ticket: &str) -> Result<Self> {
        let ConnectProc { child, stdin, stdout, log } =
            ConnectProc::spawn(ConnectProc::command(tb, ticket, &[]))?;
        Ok(Self { child, stdin, out: BufReader::new(stdout).lines(), log, last: serde_json::Value::Null })
    }

    async fn next(&mut self) -> Result<serde_json::Value> {
        let line =
            tokio::time::timeout(WAIT * 2, self.out.next_line()).await??.context("connect's output ended")?;
        self.last = serde_json::from_str(&line)?;
        Ok(self.last.clone())
    }

    /// Sends a request and reads until its answer.
    async fn call(&mut self, id: u64, method: &str, params: &str) -> Result<()> {
        let line =
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n");
        self.stdin.write_all(line.as_bytes()).await?;
        loop {
            let v = self.next().await?;
            if v["id"] == id && v.get("method").is_none() {
                if v.get("error").is_some() {
                    bail!("{method} failed: {v}");
                }
                return Ok(());
            }
        }
    }
}
