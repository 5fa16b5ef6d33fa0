//! The few JSON-RPC messages the bridge itself writes.

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR_CODE: i64 = -32700;

/// The line (with its `\n`) the bridge answers a non-JSON line from the peer with.
/// The id is `null` because an unparsable request has no id we could echo.
pub const PARSE_ERROR_LINE: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}\n";

/// Whether `line` is exactly one JSON value (surrounding whitespace allowed).
pub fn is_json(line: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_error_is_valid_jsonrpc() {
        let v: serde_json::Value = serde_json::from_slice(PARSE_ERROR_LINE).unwrap();
        assert_eq!(v["error"]["code"], PARSE_ERROR_CODE);
        assert!(v["id"].is_null());
        assert!(PARSE_ERROR_LINE.ends_with(b"\n"));
    }

    #[test]
    fn json_detection() {
        assert!(is_json(br#"{"a":1}"#));
        assert!(is_json(b" [1,2] "));
        assert!(!is_json(b"hello"));
        assert!(!is_json(br#"{"a":1} {"b":2}"#));
        assert!(!is_json(b""));
    }
}
