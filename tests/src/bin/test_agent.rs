//! A tiny stdio agent for the integration tests.
//!
//! `test-agent [--pid-file PATH] MODE`
//! - `cat`: copy stdin to stdout byte for byte until EOF.
//! - `final`: print one large JSON line (the "last response") and exit at once.
//! - `reply-once`: read one line, answer it with `{"echo":<line>}`, exit.
//! - `noise`: print a non-JSON banner, then behave like `cat`.
//! - `stderr`: print a line on stderr, then behave like `cat`.
//! - `hang`: ignore stdin and SIGTERM, sleep forever (tests SIGKILL after grace).
//! - `exit CODE`: exit with CODE immediately.
//! - `bulk-client BYTES`: a local client for `connect -- …`: write BYTES of
//!   ndjson (16 KiB lines) to stdout while reading as many back on stdin, then exit.
//! - `close-stdin`: close stdin, then sleep (the bridge's writes to it fail).
//! - `ask`: for every line read, send the client a request (`id` "q<N>",
//!   method `fs/read_text_file`) and log the answer to it on stderr
//!   (`answer: <line>`); answer lines are not asked about.
//! - `respond SIZE`: answer every request (a line with `id` and `method`) with a
//!   result; method `big` gets a result padded to SIZE bytes, any other `{"ok":true}`.
//! - `stream BYTES`: write BYTES of ndjson notifications (16 KiB lines, numbered
//!   by `n`) as fast as stdout takes them, then behave like `cat`.
//! - `exit-after N CODE`: read N lines without answering any, then exit with CODE.
//! - `count BYTES`: read stdin; once BYTES have arrived, write `{"got":N}` and
//!   keep reading (what an upload is measured against).
//! - `later`: for every request `later` (`params: {"ms": N, "send": [messages]}`)
//!   answer `{"ok":true}` at once, then write each message of `send` as a line
//!   after N ms (what an agent does that asks, or ends a turn, while the
//!   client is away); other lines are ignored.

use std::io::{BufRead, Read, Write};

/// `capture`: a contract program of the capture contract (version 1). Reads
/// its one capture; writes a line that is not JSON, a reply for another cid,
/// its reply (the text, and each part's mime, size and whether its file
/// holds that many bytes), then `done`. A text with `hang` in it is never
/// answered: the program waits, SIGTERM ignored, for its turn's timeout.
fn capture() {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
    let cid = v["cid"].as_str().unwrap_or_default();
    let text = v["text"].as_str().unwrap_or_default();
    if text.contains("hang") {
        // SAFETY: plain libc call.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let parts: Vec<String> = v["parts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let on_disk = p["path"].as_str().and_then(|f| std::fs::metadata(f).ok()).map(|m| m.len());
            format!("{} {} on disk {:?}", p["mime"].as_str().unwrap_or("?"), p["size"], on_disk)
        })
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "starting (this line is not JSON)").unwrap();
    writeln!(out, "{}", serde_json::json!({"type": "reply", "cid": "c_other", "text": "not yours"})).unwrap();
    let reply = format!("got: {text}; parts: [{}]", parts.join(", "));
    writeln!(out, "{}", serde_json::json!({"type": "reply", "cid": cid, "text": reply})).unwrap();
    writeln!(out, "{}", serde_json::json!({"type": "done", "cid": cid})).unwrap();
    out.flush().unwrap();
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--pid-file") {
        let path = args.get(1).expect("--pid-file PATH").clone();
        std::fs::write(&path, std::process::id().to_string()).expect("write pid file");
        args.drain(..2);
    }
    let mode = args.first().map(String::as_str).unwrap_or("cat");
    let stdout = std::io::stdout();
    match mode {
        "cat" => cat(),
        "final" => {
            let payload = "x".repeat(256 * 1024);
            let mut out = stdout.lock();
            writeln!(out, "{{\"final\":true,\"payload\":\"{payload}\"}}").unwrap();
            out.flush().unwrap();
        }
        "reply-once" => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).unwrap();
            let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or(serde_json::Value::Null);
            let mut out = stdout.lock();
            writeln!(out, "{}", serde_json::json!({ "echo": v })).unwrap();
            out.flush().unwrap();
        }
        "noise" => {
            println!("Starting test agent v0 (this line is not JSON)");
            cat();
        }
        "stderr" => {
            eprintln!("test-agent says hello on stderr");
            cat();
        }
        "hang" => {
            // SAFETY: plain libc call.
            unsafe {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        "capture" => capture(),
        "exit" => std::process::exit(args.get(1).and_then(|c| c.parse().ok()).unwrap_or(0)),
        "ask" => ask(),
        "later" => later(),
        "count" => count(args.get(1).and_then(|c| c.parse().ok()).unwrap_or(1 << 20)),
        "bulk-client" => bulk_client(args.get(1).and_then(|c| c.parse().ok()).unwrap_or(1 << 20)),
        "close-stdin" => {
            // SAFETY: plain libc call on our own stdin.
            unsafe {
                libc::close(0);
            }
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        "respond" => respond(args.get(1).and_then(|c| c.parse().ok()).unwrap_or(1 << 20)),
        "stream" => {
            stream(args.get(1).and_then(|c| c.parse().ok()).unwrap_or(1 << 20));
            cat();
        }
        "exit-after" => {
            let n: usize = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(1);
            let mut line = String::new();
            for _ in 0..n {
                line.clear();
                if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
            }
            std::process::exit(args.get(2).and_then(|c| c.parse().ok()).unwrap_or(1));
        }
        other => {
            eprintln!("test-agent: unknown mode {other}");
            std::process::exit(2);
        }
    }
}

fn bulk_client(total: usize) {
    let reader = std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0;
        while got < total {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    let mut line = vec![b'a'; 16 * 1024];
    line[0] = b'"';
    line[16 * 1024 - 2] = b'"';
    line[16 * 1024 - 1] = b'\n';
    let mut out = std::io::stdout().lock();
    let mut sent = 0;
    while sent < total {
        let n = line.len().min(total - sent);
        if out.write_all(&line[..n]).is_err() {
            break;
        }
        sent += n;
    }
    let _ = out.flush();
    let got = reader.join().unwrap_or(0);
    if got < total {
        eprintln!("bulk-client: got {got} of {total} bytes back");
        std::process::exit(1);
    }
}

fn ask() {
    let mut out = std::io::stdout().lock();
    let mut n = 0;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if v.get("result").is_some() || v.get("error").is_some() {
            eprintln!("answer: {line}");
            continue;
        }
        n += 1;
        let q = serde_json::json!({"jsonrpc": "2.0", "id": format!("q{n}"), "method": "fs/read_text_file", "params": {"path": "/x"}});
        if writeln!(out, "{q}").and_then(|_| out.flush()).is_err() {
            return;
        }
    }
}

fn count(total: usize) {
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0usize;
    let mut told = false;
    loop {
        match stdin.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got += n,
        }
        if !told && got >= total {
            told = true;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{{\"got\":{got}}}");
            let _ = out.flush();
        }
    }
}

fn later() {
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if v["method"] != "later" {
            continue;
        }
        if let Some(id) = v.get("id") {
            let mut out = std::io::stdout().lock();
            let _ =
                writeln!(out, "{}", serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {"ok": true}}));
            let _ = out.flush();
        }
        let ms = v["params"]["ms"].as_u64().unwrap_or(0);
        let send = v["params"]["send"].as_array().cloned().unwrap_or_default();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            let mut out = std::io::stdout().lock();
            for m in send {
                let _ = writeln!(out, "{m}");
            }
            let _ = out.flush();
        });
    }
    // Input ended: let what is scheduled go out before exiting.
    std::thread::sleep(std::time::Duration::from_secs(2));
}

fn respond(size: usize) {
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let (Some(id), Some(method)) = (v.get("id"), v.get("method").and_then(|m| m.as_str())) else {
            continue;
        };
        let result = if method == "big" {
            serde_json::json!({ "pad": "p".repeat(size) })
        } else if method == "session/prompt" {
            serde_json::json!({ "stopReason": "end_turn" })
        } else {
            serde_json::json!({ "ok": true })
        };
        let reply = serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result });
        if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
            return;
        }
    }
}

fn stream(total: usize) {
    let mut out = std::io::stdout().lock();
    let pad = "s".repeat(16 * 1024 - 64);
    let (mut sent, mut n) = (0, 0u64);
    while sent < total {
        let line =
            format!("{{\"jsonrpc\":\"2.0\",\"method\":\"s\",\"params\":{{\"n\":{n},\"d\":\"{pad}\"}}}}\n");
        if out.write_all(line.as_bytes()).is_err() {
            return;
        }
        sent += line.len();
        n += 1;
    }
    let _ = out.flush();
}

fn cat() {
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stdout.write_all(&buf[..n]).and_then(|_| stdout.flush()).is_err() {
            return;
        }
    }
}
