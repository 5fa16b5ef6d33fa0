//! `thunderbolt acp serve`: a small but real ACP agent on stdin/stdout.
//!
//! It is what `thunderbolt acp --transport iroh` serves when no agent command is
//! given, so the bridge works out of the box and every client can be tested
//! against a known agent. It answers `initialize`, `session/new`,
//! `session/load`, `session/prompt` (streaming an echo of the prompt as
//! `agent_message_chunk` updates) and `session/cancel`.

use std::collections::HashMap;

use anyhow::Result;
use serde_json::{json, Value};
use thunderbolt_shared::{jsonrpc::PARSE_ERROR_CODE, ndjson::MAX_FRAME_LEN};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// ACP protocol version this agent speaks.
pub const ACP_PROTOCOL_VERSION: u64 = 1;

const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Words per streamed chunk: small enough that a client sees a real stream of
/// several updates, large enough not to be silly.
const WORDS_PER_CHUNK: usize = 1;

#[derive(Debug, Default)]
struct Session {
    /// (role, text) turns, replayed on `session/load`.
    history: Vec<(&'static str, String)>,
}

/// The agent's state for one stdio connection.
#[derive(Debug, Default)]
pub struct EchoAgent {
    sessions: HashMap<String, Session>,
    next_session: u64,
}

fn response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn update(session_id: &str, kind: &str, text: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
        }
    })
}

/// Concatenates the text blocks of a prompt (other block kinds are named, not echoed).
fn prompt_text(blocks: &[Value]) -> String {
    let mut parts = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(b.get("text").and_then(Value::as_str).unwrap_or("").to_string()),
            Some(other) => parts.push(format!("[{other}]")),
            None => {}
        }
    }
    parts.join(" ")
}

/// Splits `text` into chunks of [`WORDS_PER_CHUNK`] words that concatenate back to it.
fn chunks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut words = 0;
    for piece in text.split_inclusive(' ') {
        cur.push_str(piece);
        words += 1;
        if words == WORDS_PER_CHUNK {
            out.push(std::mem::take(&mut cur));
            words = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

impl EchoAgent {
    /// Handles one message; returns the lines to write (updates first, then the response).
    pub fn handle(&mut self, msg: &Value) -> Vec<Value> {
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str);
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let Some(method) = method else {
            // A response to something we never asked, or garbage: ignore responses,
            // reject requests without a method.
            return match id {
                Some(id) if msg.get("result").is_none() && msg.get("error").is_none() => {
                    vec![error(&id, -32600, "Invalid Request")]
                }
                _ => vec![],
            };
        };
        let Some(id) = id else {
            // Notifications: session/cancel needs no answer (prompts here finish
            // synchronously, so there is never one in flight to stop).
            return vec![];
        };
        match method {
            "initialize" => {
                let asked =
                    params.get("protocolVersion").and_then(Value::as_u64).unwrap_or(ACP_PROTOCOL_VERSION);
                vec![response(
                    &id,
                    json!({
                        "protocolVersion": asked.min(ACP_PROTOCOL_VERSION),
                        "agentCapabilities": {
                            "loadSession": true,
                            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false}
                        },
                        "authMethods": [],
                        "agentInfo": {"name": "thunderbolt-echo", "title": "Thunderbolt echo agent", "version": env!("CARGO_PKG_VERSION")}
                    }),
                )]
            }
            "session/new" => {
                self.next_session += 1;
                let sid = format!("sess-{}-{}", std::process::id(), self.next_session);
                self.sessions.insert(sid.clone(), Session::default());
                vec![response(&id, json!({"sessionId": sid}))]
            }
            "session/load" => {
                let Some(sid) = params.get("sessionId").and_then(Value::as_str) else {
                    return vec![error(&id, INVALID_PARAMS, "session/load needs sessionId")];
                };
                let Some(s) = self.sessions.get(sid) else {
                    return vec![error(&id, INVALID_PARAMS, &format!("unknown session '{sid}'"))];
                };
                let mut out: Vec<Value> = s
                    .history
                    .iter()
                    .map(|(role, text)| {
                        update(
                            sid,
                            if *role == "user" { "user_message_chunk" } else { "agent_message_chunk" },
                            text,
                        )
                    })
                    .collect();
                out.push(response(&id, Value::Null));
                out
            }
            "session/prompt" => {
                let Some(sid) = params.get("sessionId").and_then(Value::as_str).map(str::to_string) else {
                    return vec![error(&id, INVALID_PARAMS, "session/prompt needs sessionId")];
                };
                let Some(blocks) = params.get("prompt").and_then(Value::as_array) else {
                    return vec![error(&id, INVALID_PARAMS, "session/prompt needs a prompt array")];
                };
                let Some(session) = self.sessions.get_mut(&sid) else {
                    return vec![error(&id, INVALID_PARAMS, &format!("unknown session '{sid}'"))];
                };
                let text = prompt_text(blocks);
                let reply = format!("You said: {text}");
                session.history.push(("user", text));
                session.history.push(("agent", reply.clone()));
                let mut out: Vec<Value> =
                    chunks(&reply).iter().map(|c| update(&sid, "agent_message_chunk", c)).collect();
                out.push(response(&id, json!({"stopReason": "end_turn"})));
                out
            }
            "session/cancel" => vec![response(&id, Value::Null)],
            other => vec![error(&id, METHOD_NOT_FOUND, &format!("method not found: {other}"))],
        }
    }
}

/// Serves ACP on the given reader/writer until EOF.
pub async fn serve<R, W>(input: R, mut output: W) -> Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut agent = EchoAgent::default();
    let mut r = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut r).take(MAX_FRAME_LEN as u64 + 1).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_FRAME_LEN && !line.ends_with(b"\n") {
            anyhow::bail!("input line longer than {MAX_FRAME_LEN} bytes");
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let replies = match serde_json::from_slice::<Value>(&line) {
            Ok(msg) => agent.handle(&msg),
            Err(_) => vec![error(&Value::Null, PARSE_ERROR_CODE, "Parse error")],
        };
        let mut buf = Vec::new();
        for v in replies {
            serde_json::to_writer(&mut buf, &v)?;
            buf.push(b'\n');
        }
        output.write_all(&buf).await?;
        output.flush().await?;
    }
}

use tokio::io::AsyncReadExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_exchange() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}"#,
            "\n",
        );
        let mut out = Vec::new();
        serve(input.as_bytes(), &mut out).await.unwrap();
        let lines: Vec<Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines[0]["result"]["protocolVersion"], 1);
        let sid = lines[1]["result"]["sessionId"].as_str().unwrap().to_string();
        let mut agent = EchoAgent::default();
        agent.sessions.insert(sid.clone(), Session::default());
        let out = agent.handle(&json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"text","text":"hello big world"}]}}));
        let text: String = out[..out.len() - 1]
            .iter()
            .map(|u| u["params"]["update"]["content"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "You said: hello big world");
        assert!(out.len() > 2);
        assert_eq!(out.last().unwrap()["result"]["stopReason"], "end_turn");
        let load = agent.handle(&json!({"jsonrpc":"2.0","id":4,"method":"session/load","params":{"sessionId":sid,"cwd":"/","mcpServers":[]}}));
        assert_eq!(load.len(), 3);
        assert_eq!(
            agent.handle(&json!({"jsonrpc":"2.0","id":5,"method":"nope"}))[0]["error"]["code"],
            -32601
        );
    }
}
