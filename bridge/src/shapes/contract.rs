//! The capture contract (version 1), what a contract program and a webhook
//! agent speak: one `{"type":"capture","cid",…,"text","parts"}` object per
//! turn in; zero or more `{"type":"reply","cid","text"}` then
//! `{"type":"done","cid"}` out. Lines for another cid, and lines that do not
//! parse, are ignored; fields a version does not know are ignored too.

use serde_json::{json, Value};

/// The contract versions this host speaks (a manifest's `contract`).
pub const VERSIONS: &[&str] = &["1"];

/// Longest line read from a program: a reply is text, not a file.
pub const MAX_LINE: usize = 1024 * 1024;

/// One file that goes with a capture.
#[derive(Debug, Clone)]
pub struct Part {
    pub mime: String,
    pub bytes: Vec<u8>,
    /// Where a program finds it (written for it); a webhook gets `data` instead.
    pub path: Option<String>,
}

/// The capture object of one turn.
pub fn capture(cid: &str, agent: &str, text: &str, parts: &[Part], inline: bool) -> Value {
    let parts: Vec<Value> = parts
        .iter()
        .enumerate()
        .map(|(idx, p)| {
            let mut v = json!({"idx": idx, "mime": p.mime, "size": p.bytes.len()});
            if inline {
                use base64::Engine as _;
                v["data"] = json!(base64::engine::general_purpose::STANDARD.encode(&p.bytes));
            } else if let Some(path) = &p.path {
                v["path"] = json!(path);
            }
            v
        })
        .collect();
    json!({
        "type": "capture",
        "cid": cid,
        "agent": agent,
        "strict": true,
        "from": {"self": true},
        "text": text,
        "parts": parts,
    })
}

/// What one object of the agent's says for turn `cid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Reply(String),
    Done,
    /// Another cid's, another type, or not an object of the contract.
    Ignored,
}

/// Reads one object of the agent's.
pub fn said(v: &Value, cid: &str) -> Said {
    if v.get("cid").and_then(Value::as_str) != Some(cid) {
        return Said::Ignored;
    }
    match (v.get("type").and_then(Value::as_str), v.get("text").and_then(Value::as_str)) {
        (Some("reply"), Some(t)) => Said::Reply(t.to_string()),
        (Some("done"), _) => Said::Done,
        _ => Said::Ignored,
    }
}

/// Reads a line of a program's: ignored unless it is a JSON object of the contract.
pub fn said_line(line: &[u8], cid: &str) -> Said {
    serde_json::from_slice::<Value>(line).map_or(Said::Ignored, |v| said(&v, cid))
}

/// A webhook's answer: the contract's objects as an array, one of them, or
/// `{"text": …}`; the replies in order (a `done` is implied by the answer's end).
pub fn webhook_answer(body: &[u8], cid: &str) -> Option<Vec<String>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let objects = match &v {
        Value::Array(a) => a.clone(),
        Value::Object(o) if !o.contains_key("type") && o.get("text").is_some_and(Value::is_string) => {
            return Some(vec![o["text"].as_str().unwrap_or_default().to_string()]);
        }
        Value::Object(_) => vec![v.clone()],
        _ => return None,
    };
    Some(
        objects
            .iter()
            .filter_map(|o| match said(o, cid) {
                Said::Reply(t) => Some(t),
                _ => None,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_another_cid_and_junk_are_ignored() {
        assert_eq!(said_line(br#"{"type":"reply","cid":"c1","text":"hi"}"#, "c1"), Said::Reply("hi".into()));
        assert_eq!(said_line(br#"{"type":"reply","cid":"c2","text":"hi"}"#, "c1"), Said::Ignored);
        assert_eq!(said_line(b"not json", "c1"), Said::Ignored);
        assert_eq!(said_line(br#"{"type":"done","cid":"c1","extra":1}"#, "c1"), Said::Done);
        assert_eq!(said_line(br#"{"type":"progress","cid":"c1"}"#, "c1"), Said::Ignored);
    }

    #[test]
    fn a_webhook_answers_in_any_of_its_shapes() {
        let one = br#"{"type":"reply","cid":"c1","text":"a"}"#;
        assert_eq!(webhook_answer(one, "c1"), Some(vec!["a".to_string()]));
        let many = br#"[{"type":"reply","cid":"c1","text":"a"},{"type":"reply","cid":"c9","text":"x"},{"type":"done","cid":"c1"}]"#;
        assert_eq!(webhook_answer(many, "c1"), Some(vec!["a".to_string()]));
        assert_eq!(webhook_answer(br#"{"text":"plain"}"#, "c1"), Some(vec!["plain".to_string()]));
        assert_eq!(webhook_answer(b"<html>", "c1"), None);
        let v = capture(
            "c1",
            "a",
            "hi",
            &[Part { mime: "image/png".into(), bytes: vec![1, 2], path: None }],
            true,
        );
        assert_eq!(v["parts"][0]["data"], "AQI=");
        assert_eq!(v["parts"][0]["size"], 2);
    }
}
