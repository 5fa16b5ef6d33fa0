//! `--transport wss`: the loopback WebSocket bridge, with real processes and a
//! real WebSocket client (the browser test is in client-wasm/e2e).

use std::process::Stdio;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use thunderbolt_tests::*;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};
use tokio_websockets::{ClientBuilder, Message};

const ORIGIN: &str = "http://localhost:1420";

/// A wss bridge on a free port: its URL (with the token) and log.
struct Wss {
    _home: Tb,
    child: tokio::process::Child,
    url: String,
    port: u16,
    log: Log,
    _work: tempfile::TempDir,
    pid_file: String,
}

impl Wss {
    async fn start(extra: &[&str], agent_mode: &[&str]) -> Self {
        init_tracing();
        let home = Tb::new(None);
        let work = tempfile::tempdir().unwrap();
        let pid_file = work.path().join("agent.pid").display().to_string();
        let mut c = home.cmd();
        c.args(["acp", "--transport", "wss", "--port", "0"]).args(extra).arg("--");
        c.arg(test_agent_bin()).args(["--pid-file", &pid_file]).args(agent_mode);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let log = Log::default();
        log.capture_stderr(child.stderr.take().unwrap());
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(WAIT, async {
            while let Some(l) = out.next_line().await.unwrap() {
                if let Some(u) = l.trim().strip_prefix("Paste into the app: ") {
                    return u.to_string();
                }
            }
            panic!("no URL in the banner");
        })
        .await
        .expect("banner in time");
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        let port = url.split(':').nth(2).unwrap().split('/').next().unwrap().parse().unwrap();
        Self { _home: home, child, url, port, log, _work: work, pid_file }
    }

    async fn ws(
        &self,
        url: &str,
        origin: &str,
    ) -> tokio_websockets::WebSocketStream<tokio_websockets::MaybeTlsStream<TcpStream>> {
        let (ws, _) = ClientBuilder::new()
            .uri(url)
            .unwrap()
            .add_header(http::header::ORIGIN, http::HeaderValue::from_str(origin).unwrap())
            .unwrap()
            .connect()
            .await
            .expect("upgrade accepted");
        ws
    }

    /// The raw HTTP answer to `request`.
    async fn http(&self, request: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(WAIT, s.read_to_string(&mut out)).await.unwrap().unwrap();
        out
    }
}

fn upgrade(path: &str, origin: Option<&str>) -> String {
    let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{origin}\r\n"
    )
}

async fn next_text(
    ws: &mut (impl futures::Stream<Item = Result<Message, tokio_websockets::Error>> + Unpin),
) -> Value {
    loop {
        let m =
            tokio::time::timeout(WAIT, ws.next()).await.expect("frame in time").expect("open").expect("ok");
        if let Some(t) = m.as_text() {
            return serde_json::from_str(t).expect("one JSON value per frame");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_plain_http_and_spawn_nothing() {
    let b = Wss::start(&[], &["cat"]).await;
    let token = b.url.split("token=").nth(1).unwrap().to_string();
    assert_eq!(token.len(), 64, "32 random bytes, hex");
    let ok_path = format!("/?token={token}");
    let cases = [
        (upgrade(&format!("/other?token={token}"), Some(ORIGIN)), "404"),
        (format!("GET {ok_path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), "426"),
        (upgrade(&ok_path, Some("http://evil.example")), "403"),
        (upgrade(&ok_path, None), "403"),
        (upgrade("/?token=0000", Some(ORIGIN)), "401"),
        (upgrade("/", Some(ORIGIN)), "401"),
    ];
    for (req, status) in cases {
        let answer = b.http(&req).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{status} expected for {req:?}, got {answer:?}"
        );
    }
    assert!(
        b.http(&upgrade(&ok_path, Some("http://evil.example"))).await.contains("http://evil.example"),
        "403 names the origin"
    );
    assert!(!std::path::Path::new(&b.pid_file).exists(), "nothing spawned for a refusal");
    assert!(!b.log.contains(&token), "the token is never logged");
    // Bound to 127.0.0.1 itself, not every address: another loopback address is refused.
    assert!(TcpStream::connect(("127.0.0.1", b.port)).await.is_ok());
    assert!(TcpStream::connect(("127.0.0.2", b.port)).await.is_err(), "reachable beyond 127.0.0.1");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_carries_one_message_per_frame_and_ends_with_the_agent() {
    let b = Wss::start(&[], &["cat"]).await;
    let mut ws = b.ws(&b.url, ORIGIN).await;
    // A pretty-printed message still reaches the agent as one line.
    ws.send(Message::text("{\"jsonrpc\":\"2.0\",\n \"id\":1,\"method\":\"ping\"}".to_string()))
        .await
        .unwrap();
    let echoed = next_text(&mut ws).await;
    assert_eq!(echoed["id"], 1);
    ws.send(Message::text("not json".to_string())).await.unwrap();
    let err = next_text(&mut ws).await;
    assert_eq!(err["error"]["code"], -32700, "non-JSON frames get a parse error");
    let pid: u32 = wait_file(b.pid_file.as_ref()).await.trim().parse().unwrap();
    // The client goes: the agent goes.
    ws.close().await.unwrap();
    assert!(wait_pid_gone(pid).await, "the agent outlived its socket");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_exit_codes_map_to_close_codes() {
    for (mode, code, reason) in [
        (vec!["exit", "0"], 1000u16, "agent exited (code 0)"),
        (vec!["exit", "3"], 1011, "agent exited (code 3)"),
        // It says why on stderr: that line is not in a WebSocket reason (the
        // reference's reason exactly; at most 123 bytes).
        (vec!["no-such-mode"], 1011, "agent exited (code 2)"),
        (vec!["close-stdin"], 1011, "agent stdin closed"),
    ] {
        let b = Wss::start(&[], &mode).await;
        let mut ws = b.ws(&b.url, ORIGIN).await;
        let m = if mode[0] == "close-stdin" {
            // A write lands in the pipe until the agent has closed it: keep writing
            // (bounded) until the bridge's write fails and the close comes.
            wait_file(b.pid_file.as_ref()).await;
            let mut close = None;
            for _ in 0..100 {
                let _ = ws.send(Message::text("{\"a\":1}".to_string())).await;
                if let Ok(Some(Ok(m))) =
                    tokio::time::timeout(std::time::Duration::from_millis(100), ws.next()).await
                {
                    if m.is_close() {
                        close = Some(m);
                        break;
                    }
                }
            }
            close.expect("a close after the agent's stdin went")
        } else {
            loop {
                let m = tokio::time::timeout(WAIT, ws.next()).await.unwrap().unwrap().unwrap();
                if m.is_close() {
                    break m;
                }
            }
        };
        let (c, r) = m.as_close().unwrap();
        assert_eq!((u16::from(c), r), (code, reason));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_left_waiting_by_a_dying_agent_are_answered_before_the_close() {
    let b = Wss::start(&[], &["exit-after", "2", "4"]).await;
    let mut ws = b.ws(&b.url, ORIGIN).await;
    ws.send(Message::text("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}".to_string()))
        .await
        .unwrap();
    ws.send(Message::text("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/new\"}".to_string()))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let v = next_text(&mut ws).await;
        assert_eq!(v["error"]["code"], thunderbolt_shared::jsonrpc::AGENT_ENDED_CODE, "{v}");
        assert_eq!(v["error"]["data"]["agentEnd"], "agent exited (code 4)");
        ids.push(v["id"].as_i64().unwrap());
    }
    ids.sort();
    assert_eq!(ids, [1, 2]);
    let m = loop {
        let m = tokio::time::timeout(WAIT, ws.next()).await.unwrap().unwrap().unwrap();
        if m.is_close() {
            break m;
        }
    };
    let (c, r) = m.as_close().unwrap();
    assert_eq!((u16::from(c), r), (1011, "agent exited (code 4)"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seventeenth_socket_is_closed_with_1013() {
    let b = Wss::start(&[], &["cat"]).await;
    let mut open = Vec::new();
    for i in 0..16 {
        let mut ws = b.ws(&b.url, ORIGIN).await;
        ws.send(Message::text(format!("{{\"n\":{i}}}"))).await.unwrap();
        assert_eq!(next_text(&mut ws).await["n"], i);
        open.push(ws);
    }
    let mut second = b.ws(&b.url, ORIGIN).await;
    let m = tokio::time::timeout(WAIT, second.next()).await.unwrap().unwrap().unwrap();
    let (c, r) = m.as_close().expect("a close frame");
    assert_eq!((u16::from(c), r), (1013, "bridge at capacity"));
    drop(open);
    let mut child = b.child;
    signal(child.id().unwrap(), libc::SIGTERM);
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", b.log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frame_over_the_cap_is_answered_and_the_session_goes_on() {
    let b = Wss::start(&["--max-frame", "4K"], &["cat"]).await;
    let mut ws = b.ws(&b.url, ORIGIN).await;
    let big =
        format!("{{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"x\",\"params\":\"{}\"}}", "p".repeat(6000));
    ws.send(Message::text(big)).await.unwrap();
    let err = next_text(&mut ws).await;
    assert_eq!((err["id"].as_i64(), err["error"]["code"].as_i64()), (Some(77), Some(-32600)), "{err}");
    ws.send(Message::text("{\"after\":1}".to_string())).await.unwrap();
    assert_eq!(next_text(&mut ws).await["after"], 1, "the session goes on");
}

/// `serve::wss::MAX_WAITING_UPGRADES`: connections waiting for their upgrade at once.
const MAX_WAITING_UPGRADES: usize = 64;

/// Whether the bridge has closed `s` (at this instant, without waiting).
fn closed_now(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: a peek of at most one byte into a buffer of ours, on a descriptor `s` owns.
    let n =
        unsafe { libc::recv(s.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    let e = std::io::Error::last_os_error();
    n == 0 || (n < 0 && e.kind() != std::io::ErrorKind::WouldBlock)
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_that_never_send_a_byte_are_capped_and_the_app_still_gets_in() {
    // A deadline far beyond the test's: whatever is closed here, the cap closed.
    let b = Wss::start(&["--handshake-timeout", "600"], &["cat"]).await;
    // Another local user's connections that never send anything (the report had 1100).
    let extra = 16;
    let mut idle = Vec::new();
    for _ in 0..MAX_WAITING_UPGRADES + extra {
        idle.push(TcpStream::connect(("127.0.0.1", b.port)).await.unwrap());
    }
    // The app, after them all, still upgrades and talks.
    let mut ws = b.ws(&b.url, ORIGIN).await;
    ws.send(Message::text("{\"after\":\"the flood\"}".to_string())).await.unwrap();
    assert_eq!(next_text(&mut ws).await["after"], "the flood");
    // The oldest were closed for the newer ones (the app's connection the last of
    // them), each at once: none waits for its deadline.
    for (i, s) in idle[..=extra].iter_mut().enumerate() {
        let mut buf = [0u8; 1];
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            other => panic!("idle connection {i} still open past the cap: {other:?}"),
        }
    }
    // The cap is the cap: the newer ones still wait (with the app's, 64 in all).
    let open = idle[extra + 1..].iter().filter(|s| !closed_now(s)).count();
    assert_eq!(open, MAX_WAITING_UPGRADES - 1);
    b.log.wait_for("connections wait for their WebSocket upgrade, the most: closed the oldest").await;
    // And no upgrade is lost to the slots: the app gets in again while they are held.
    let mut again = b.ws(&b.url, ORIGIN).await;
    again.send(Message::text("{\"again\":1}".to_string())).await.unwrap();
    assert_eq!(next_text(&mut again).await["again"], 1);
}
