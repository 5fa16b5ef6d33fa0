//! The session core in-process, on paused time.
//!
//! A fake agent (in-memory pipes, its behaviour scripted per test) and a fake
//! peer link stand in for the process and the connection; everything else is
//! the bridge's own code ([`session::run_on`], the pumps, the deadlines).
//! Time is paused: tokio jumps to the next timer whenever every task waits, so
//! a test of a 10 s deadline takes microseconds, and the time a session took
//! is exact — each test asserts it to the millisecond.

mod support;

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use support::{echo, hold_forever, script, AgentIo, Events, FakeLauncher, OnTerm, Script, PIPE};
use thunderbolt::{
    limits,
    serve::session::{self, End, Link, SessionConfig},
};
use thunderbolt_shared::close::{self, AgentEnd};
use tokio::{
    io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream},
    sync::Semaphore,
    task::JoinHandle,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

/// The peer's side of the session: what it was sent, how it was closed.
struct FakeLink {
    gone: CancellationToken,
    /// Resolves `delivered` (the peer took everything); pre-cancelled unless a
    /// test wants a peer that never acknowledges.
    took_all: CancellationToken,
    events: Events,
    start: Instant,
}

impl Link for FakeLink {
    type Out = PeerOut;

    fn gone(&self) -> impl std::future::Future<Output = String> + Send {
        let gone = self.gone.clone();
        async move {
            gone.cancelled().await;
            "connection lost".to_string()
        }
    }
    fn gone_reason(&self) -> Option<String> {
        self.gone.is_cancelled().then(|| "connection lost".to_string())
    }
    fn close(&self, code: u32, reason: &str) {
        self.events.push(self.start, format!("closed {code} {reason}"));
    }
    fn finish(&self, out: &mut PeerOut) {
        self.events.push(self.start, "finished");
        out.0 = None;
    }
    async fn delivered(&self, _out: &mut PeerOut, linger: Duration) -> bool {
        tokio::time::timeout(linger, self.took_all.cancelled()).await.is_ok()
    }
}

/// The agent's output on its way to the peer; `None` once finished (the peer
/// reads end of stream).
struct PeerOut(Option<DuplexStream>);

impl thunderbolt::serve::pump::RunSink for PeerOut {}

impl AsyncWrite for PeerOut {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(s) => Pin::new(s).poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(s) => Pin::new(s).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// One session under test and the handles a test drives it with.
struct Harness {
    start: Instant,
    events: Events,
    slots: Arc<Semaphore>,
    gone: CancellationToken,
    shutdown: CancellationToken,
    /// What the peer writes to the agent.
    to_agent: DuplexStream,
    /// What the peer reads from the agent.
    from_agent: BufReader<DuplexStream>,
    session: JoinHandle<End>,
}

impl Harness {
    fn new(script: Option<Script>, on_term: OnTerm) -> Self {
        Self::with(script, on_term, true)
    }

    /// `acks`: whether the peer acknowledges everything it is sent.
    fn with(script: Option<Script>, on_term: OnTerm, acks: bool) -> Self {
        let start = Instant::now();
        let events = Events::default();
        let slots = Arc::new(Semaphore::new(1));
        let launcher = FakeLauncher::new(script, on_term, events.clone(), start, Some(slots.clone()));
        let cfg = Arc::new(SessionConfig::new(launcher));
        let (gone, took_all, shutdown) =
            (CancellationToken::new(), CancellationToken::new(), CancellationToken::new());
        if acks {
            took_all.cancel();
        }
        let link = FakeLink { gone: gone.clone(), took_all: took_all.clone(), events: events.clone(), start };
        let (to_agent, input) = tokio::io::duplex(PIPE);
        let (out, from_agent) = tokio::io::duplex(PIPE);
        let permit = slots.clone().try_acquire_owned().expect("one slot");
        let input = thunderbolt::serve::pump::ByteSource::new(input, cfg.max_frame);
        let session = tokio::spawn(session::run_on(
            link,
            PeerOut(Some(out)),
            input,
            "peer",
            cfg,
            permit,
            shutdown.clone(),
        ));
        Self {
            start,
            events,
            slots,
            gone,
            shutdown,
            to_agent,
            from_agent: BufReader::new(from_agent),
            session,
        }
    }

    async fn line(&mut self) -> String {
        let mut l = String::new();
        self.from_agent.read_line(&mut l).await.expect("read");
        l
    }

    /// Waits for the session's end; returns it and how long the session took.
    async fn end(self) -> (End, Duration, Events, Arc<Semaphore>) {
        let end = self.session.await.expect("session task");
        (end, self.start.elapsed(), self.events, self.slots)
    }
}

#[tokio::test(start_paused = true)]
async fn agent_exit_ends_the_session_with_code_2_after_everything_is_delivered() {
    let mut h = Harness::new(echo(), OnTerm::Exits);
    h.to_agent.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}\n").await.unwrap();
    assert_eq!(h.line().await, "{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}\n");
    // The peer is done sending: the agent sees end of input and exits 0.
    h.to_agent.shutdown().await.unwrap();
    assert_eq!(h.line().await, "", "the peer reads end of stream once the agent's output is all sent");
    let (end, took, events, slots) = h.end().await;
    assert!(matches!(end, End::AgentEnded(Some(e)) if e == AgentEnd::exited(0)), "{end}");
    assert_eq!(took, Duration::ZERO, "no deadline was waited on");
    assert_eq!(
        events.names(),
        ["agent exited 0", "finished", "closed 2 agent exited (code 0)", "group cleaned up"],
    );
    assert_eq!(slots.available_permits(), 1, "the agent slot is free again");
}

#[tokio::test(start_paused = true)]
async fn requests_the_agent_left_unanswered_are_answered_with_how_it_ended_before_the_close() {
    let mut h = Harness::new(
        script(|mut io: AgentIo| async move {
            let mut line = String::new();
            // Answers the first request, takes the second and third, then crashes.
            io.stdin.read_line(&mut line).await.unwrap();
            io.stdout.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n").await.unwrap();
            io.stdin.read_line(&mut line).await.unwrap();
            io.stdin.read_line(&mut line).await.unwrap();
            drop(io.stdout);
            (io.exit)(3);
        }),
        OnTerm::Exits,
    );
    h.to_agent.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n").await.unwrap();
    assert_eq!(h.line().await, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
    h.to_agent
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"p-2\",\"method\":\"session/prompt\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n")
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&h.line().await).unwrap();
    assert_eq!(answer["id"], "p-2", "the unanswered request, and only it: {answer}");
    assert_eq!(answer["error"]["code"], thunderbolt_shared::jsonrpc::AGENT_ENDED_CODE);
    assert_eq!(answer["error"]["data"]["agentEnd"], "agent exited (code 3)");
    assert_eq!(h.line().await, "", "then the end of the stream");
    let (end, took, events, _) = h.end().await;
    assert!(matches!(end, End::AgentEnded(Some(e)) if e == AgentEnd::exited(3)), "{end}");
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        events.names(),
        ["agent exited 3", "finished", "closed 2 agent exited (code 3)", "group cleaned up"]
    );
}

#[tokio::test(start_paused = true)]
async fn agent_that_exits_while_its_stdout_is_held_is_cut_off_after_the_drain_window() {
    let mut h = Harness::new(
        script(|mut io: AgentIo| async move {
            io.stdout.write_all(b"{\"last\":true}\n").await.unwrap();
            (io.exit)(3);
            hold_forever(io).await;
        }),
        OnTerm::Exits,
    );
    assert_eq!(h.line().await, "{\"last\":true}\n");
    assert_eq!(h.line().await, "");
    let (end, took, events, _) = h.end().await;
    assert!(matches!(end, End::AgentEnded(Some(e)) if e == AgentEnd::exited(3)), "{end}");
    assert_eq!(took, limits::STDOUT_DRAIN_AFTER_EXIT);
    assert_eq!(events.at("closed 2 agent exited (code 3)"), limits::STDOUT_DRAIN_AFTER_EXIT);
}

#[tokio::test(start_paused = true)]
async fn agent_that_closes_stdin_but_keeps_running_is_ended_after_its_window() {
    let mut h = Harness::new(
        script(|io: AgentIo| async move {
            drop(io.stdin);
            hold_forever((io.stdout, io.exit)).await;
        }),
        OnTerm::Exits,
    );
    // Only a write notices the closed stdin.
    h.to_agent.write_all(b"{\"id\":1}\n").await.unwrap();
    let (end, took, events, _) = h.end().await;
    // Cut off after the window; then the bridge waits the same window for an
    // exit that does not come, and terminates it.
    assert!(matches!(end, End::AgentEnded(Some(e)) if e == AgentEnd::signaled(15)), "{end}");
    assert_eq!(took, limits::AGENT_EXIT_AFTER_EOF * 2);
    assert_eq!(events.at("finished"), limits::AGENT_EXIT_AFTER_EOF);
    assert_eq!(
        events.names(),
        [
            "finished",
            "SIGTERM (slot held)",
            "closed 2 agent killed by signal 15 (SIGTERM)",
            "group cleaned up"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn peer_loss_ends_the_agent_before_its_slot_is_freed() {
    let h = Harness::new(script(hold_forever), OnTerm::Ignores);
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.gone.cancel();
    let (end, took, events, slots) = h.end().await;
    assert!(matches!(&end, End::PeerGone(why) if why == "connection lost"), "{end}");
    // It ignored SIGTERM: SIGKILL after the grace.
    assert_eq!(took, Duration::from_secs(1) + limits::AGENT_TERM_GRACE);
    assert_eq!(
        events.names(),
        ["SIGTERM (slot held)", "SIGKILL", "group cleaned up"],
        "no close sent to a gone peer"
    );
    assert_eq!(slots.available_permits(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_tells_the_peer_first_then_ends_the_agent() {
    let mut h = Harness::new(echo(), OnTerm::Exits);
    h.to_agent.write_all(b"{\"id\":7}\n").await.unwrap();
    assert_eq!(h.line().await, "{\"id\":7}\n");
    h.shutdown.cancel();
    let (end, took, events, slots) = h.end().await;
    assert!(matches!(end, End::Shutdown), "{end}");
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        events.names(),
        [
            format!("closed 1 {}", close::REASON_SHUTTING_DOWN).as_str(),
            "SIGTERM (slot held)",
            "group cleaned up"
        ]
    );
    assert_eq!(slots.available_permits(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_cannot_start_is_a_refusal_with_the_contract_reason() {
    let h = Harness::new(None, OnTerm::Exits);
    let (end, _, events, slots) = h.end().await;
    let reason = close::failed_to_spawn("fake-agent");
    assert!(matches!(&end, End::Refused(r) if *r == reason), "{end}");
    assert_eq!(events.names(), [format!("closed 1 {reason}")]);
    assert_eq!(slots.available_permits(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_takes_the_last_output_is_closed_after_the_linger() {
    let mut h = Harness::with(
        script(|mut io: AgentIo| async move {
            io.stdout.write_all(b"{\"bye\":1}\n").await.unwrap();
            (io.exit)(0);
        }),
        OnTerm::Exits,
        false,
    );
    assert_eq!(h.line().await, "{\"bye\":1}\n");
    let (end, took, events, _) = h.end().await;
    assert!(matches!(end, End::AgentEnded(Some(e)) if e == AgentEnd::exited(0)), "{end}");
    assert_eq!(took, limits::FINISH_LINGER);
    assert_eq!(events.at("closed 2 agent exited (code 0)"), limits::FINISH_LINGER);
}
