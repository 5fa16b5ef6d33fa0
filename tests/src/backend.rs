//! A stand-in for the account backend that speaks its contract exactly:
//! `POST /v1/devices/bridge` and `GET /v1/devices/allowlist`, with the status
//! codes and JSON shapes of the real one. A test changes the list or injects
//! failures while a bridge runs, and reads back every request (headers
//! included) that reached it.
//!
//! Plain HTTP/1.1 on 127.0.0.1, one request per connection, written by hand so
//! nothing about it is hidden.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
    sync::Notify,
};

/// How an endpoint answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The contract's success answer.
    Ok,
    /// This status with a small JSON error body.
    Status(u16),
    /// 200 with a body that is not the contract's JSON.
    Garbage,
    /// Wait this long, then answer normally.
    Slow(Duration),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: String,
}

#[derive(Debug)]
struct State {
    node_ids: Vec<Option<String>>,
    register: Reply,
    allowlist: Reply,
    requests: Vec<Request>,
}

/// The running contract server.
#[derive(Clone)]
pub struct ContractBackend {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    /// Base URL, ending in `/v1`.
    pub url: String,
}

impl ContractBackend {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind backend");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            node_ids: Vec::new(),
            register: Reply::Ok,
            allowlist: Reply::Ok,
            requests: Vec::new(),
        }));
        let me = Self { state, changed: Arc::new(Notify::new()), url: format!("http://{addr}/v1") };
        let server = me.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let _ = server.serve(sock).await;
                });
            }
        });
        me
    }

    /// Sets the account's devices (`None` is a device without a NodeId yet).
    pub fn set_node_ids(&self, ids: Vec<Option<String>>) {
        self.state.lock().unwrap().node_ids = ids;
    }

    pub fn set_register(&self, r: Reply) {
        self.state.lock().unwrap().register = r;
    }

    pub fn set_allowlist(&self, r: Reply) {
        self.state.lock().unwrap().allowlist = r;
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn count(&self, method: &str, path: &str) -> usize {
        self.state.lock().unwrap().requests.iter().filter(|r| r.method == method && r.path == path).count()
    }

    /// Waits until at least `n` requests to `path` have arrived (event-driven).
    pub async fn wait_requests(&self, method: &str, path: &str, n: usize) {
        let ok = tokio::time::timeout(crate::WAIT, async {
            loop {
                let notified = self.changed.notified();
                if self.count(method, path) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await;
        assert!(ok.is_ok(), "backend never got {n} × {method} {path}; got {:?}", self.requests());
    }

    async fn serve(&self, sock: tokio::net::TcpStream) -> std::io::Result<()> {
        let (r, mut w) = sock.into_split();
        let mut r = BufReader::new(r);
        let mut line = String::new();
        r.read_line(&mut line).await?;
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).await? == 0 || h == "\r\n" || h == "\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).await?;
        let req = Request { method, path, headers, body: String::from_utf8_lossy(&body).into_owned() };

        let (reply, node_ids) = {
            let mut s = self.state.lock().unwrap();
            s.requests.push(req.clone());
            let reply = match (req.method.as_str(), req.path.as_str()) {
                ("POST", "/v1/devices/bridge") => Some(s.register.clone()),
                ("GET", "/v1/devices/allowlist") => Some(s.allowlist.clone()),
                _ => None,
            };
            (reply, s.node_ids.clone())
        };
        self.changed.notify_waiters();
        let authed = req.headers.contains_key("x-api-key")
            || req.headers.get("authorization").is_some_and(|v| v.starts_with("Bearer "));
        let (status, body) = match reply {
            None => (404, r#"{"error":"not found"}"#.to_string()),
            Some(_) if !authed => (401, r#"{"error":"unauthorized"}"#.to_string()),
            Some(Reply::Status(code)) => (code, format!(r#"{{"error":"status {code}"}}"#)),
            Some(Reply::Garbage) => (200, "<html>definitely not json".to_string()),
            Some(reply) => {
                if let Reply::Slow(d) = reply {
                    tokio::time::sleep(d).await;
                }
                if req.path.ends_with("/bridge") {
                    (200, r#"{"id":"dev-1","deviceType":"bridge"}"#.to_string())
                } else {
                    let entries: Vec<serde_json::Value> = node_ids
                        .iter()
                        .map(|id| serde_json::json!({"nodeId": id, "deviceType": "browser"}))
                        .collect();
                    (200, serde_json::json!({ "nodeIds": entries }).to_string())
                }
            }
        };
        let reason = match status {
            200 => "OK",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            409 => "Conflict",
            422 => "Unprocessable Entity",
            _ => "Error",
        };
        let resp = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        w.write_all(resp.as_bytes()).await?;
        w.shutdown().await
    }
}
