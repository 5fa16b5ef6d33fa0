//! The control API's one HTTP/1.1 codec, for both ends: a request or a
//! response is one head and one JSON body with its `Content-Length`, and the
//! connection closes after it. Bytes in, bytes out: the daemon reads with
//! tokio, the CLI with a blocking socket.

/// Longest request read: the API's requests are a few hundred bytes.
pub const MAX_REQUEST: usize = 64 * 1024;

/// A request read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// Why a request cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request too large")]
    TooLarge,
    #[error("bad request: {0}")]
    Bad(String),
}

/// The request at the start of `buf`, once it is all there (`Ok(None)`: read more).
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, RequestError> {
    if buf.len() > MAX_REQUEST {
        return Err(RequestError::TooLarge);
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(RequestError::Bad(e.to_string())),
    };
    let len = content_length(req.headers);
    if len > MAX_REQUEST {
        return Err(RequestError::TooLarge);
    }
    if buf.len() < head + len {
        return Ok(None);
    }
    Ok(Some(Request {
        method: req.method.unwrap_or("").to_string(),
        path: req.path.unwrap_or("").to_string(),
        body: buf[head..head + len].to_vec(),
    }))
}

fn content_length(headers: &[httparse::Header<'_>]) -> usize {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(0)
}

/// `method path` with a JSON body (empty for none).
pub fn encode_request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

/// A response with a JSON body (a line).
pub fn encode_response(status: u16, body: &serde_json::Value) -> Vec<u8> {
    let text = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        _ => "Payload Too Large",
    };
    let body = format!("{body}\n");
    let mut v = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body.as_bytes());
    v
}

/// A whole response: its status and JSON body; `None` if it is not one.
pub fn parse_response(bytes: &[u8]) -> Option<(u16, serde_json::Value)> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let status = resp.code?;
    let body = serde_json::from_slice(&bytes[head..]).ok()?;
    Some((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_a_response_read_back_as_written() {
        let req = encode_request("POST", "/v1/kick", br#"{"target":"ab"}"#);
        assert_eq!(parse_request(&req[..req.len() - 3]), Ok(None), "a partial body waits for more");
        let got = parse_request(&req).unwrap().unwrap();
        assert_eq!((got.method.as_str(), got.path.as_str()), ("POST", "/v1/kick"));
        assert_eq!(got.body, br#"{"target":"ab"}"#);
        let resp = encode_response(409, &serde_json::json!({"error": "x"}));
        assert_eq!(parse_response(&resp), Some((409, serde_json::json!({"error": "x"}))));
        assert_eq!(parse_request(&vec![b'a'; MAX_REQUEST + 1]), Err(RequestError::TooLarge));
    }
}
