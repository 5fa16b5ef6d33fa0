//! Files between a device and the agent's workstation
//! (`thunderbolt/<p>/files1`): up (a device puts a photo, a log) and down (a
//! device gets a file the agent wrote), verified against their BLAKE3 hash as
//! the bytes arrive, and resumed from what already arrived.
//!
//! A device dials the agent's endpoint with its own identity (admitted by
//! the same trust as a session) and opens one bidirectional stream per file.
//! It writes one request line (JSON, at most [`MAX_REQUEST_LINE`] bytes):
//!
//! ```text
//! {"put":{"name":"photo.jpg","size":1048576,"hash":"<64 hex>","session":"ab12cd34","mime":"image/jpeg"}}
//! {"get":{"uri":"file:///home/me/project/report.md","hash":"<64 hex>","from":16384}}
//! ```
//!
//! (`session`, `mime` optional; a get's `hash` and `from` only when it
//! resumes a partial copy of that content).
//!
//! **Put.** The bridge answers `{"have":K}`: the bytes of this content it
//! already holds from an earlier, cut transfer (a multiple of [`BLOCK_SIZE`],
//! or the whole size). The device then sends the bao encoding
//! ([bao-tree]'s, pre-order, chunk groups of [`BLOCK_SIZE`]) of the bytes
//! from `K` to the end, and finishes its side. Every group is checked
//! against `hash` before it is written; a group that does not match ends
//! the transfer with `hash mismatch`. The bridge answers one last line:
//! `{"receipt":{"name","size","hash","uri","mime"}}` (`uri` the `file://`
//! URI on the workstation, for a prompt's `resource_link`).
//!
//! **Get.** The bridge answers `{"file":{"name","size","hash","from":K}}`
//! (`K` is the request's `from` when its `hash` is the file's, else 0),
//! then the bao encoding of the bytes from `K`, and finishes.
//!
//! Any refusal is one line `{"error":"<reason>"}` (the reasons below), after
//! which the bridge finishes the stream.
//!
//! [bao-tree]: https://docs.rs/bao-tree

use serde::{Deserialize, Serialize};

use crate::Protocol;

pub const FILES_ALPN_SUFFIX: &[u8] = b"/files1";

/// `thunderbolt/<p>/files1`.
pub fn files_alpn(protocol: &Protocol) -> Vec<u8> {
    protocol.alpn_with_suffix(FILES_ALPN_SUFFIX)
}

/// Longest request or reply line: a name of 255 bytes and a URI of a path
/// of 1024 bytes fit many times over.
pub const MAX_REQUEST_LINE: usize = 4 * 1024;

/// The chunk groups hashes are checked by, as log2 of 1 KiB BLAKE3 chunks:
/// 16 KiB groups cost 64 B of tree per group (0.4 %), and a resumed
/// transfer starts at a group's edge.
pub const BLOCK_CHUNK_LOG: u8 = 4;
/// [`BLOCK_CHUNK_LOG`] in bytes.
pub const BLOCK_SIZE: u64 = 1024 << BLOCK_CHUNK_LOG;

/// Longest file name, in bytes (what most file systems allow).
pub const MAX_NAME_BYTES: usize = 255;

/// One request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Request {
    Put(Put),
    Get(Get),
}

/// A device offers a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    pub name: String,
    pub size: u64,
    /// BLAKE3 of the whole file, 64 lowercase hex digits.
    pub hash: String,
    /// The session it belongs to: its files go with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

/// A device asks for a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Get {
    /// `file://` URI of a file in the agent's workspace or a files folder.
    pub uri: String,
    /// The content the device holds a part of (resuming).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// How much of it the device holds (resuming).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub from: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One reply line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    /// A put: send from here.
    Have(u64),
    /// A put arrived whole.
    Receipt(Receipt),
    /// A get: what follows.
    File(FileHeader),
    Error(String),
}

/// What arrived, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub name: String,
    pub size: u64,
    pub hash: String,
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

/// A get's file, before its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHeader {
    pub name: String,
    pub size: u64,
    pub hash: String,
    pub from: u64,
}

/// The line is not a request (not JSON, a field missing or over its bound).
pub const REASON_BAD_REQUEST: &str = "bad request";
/// The name is not one a file may have here (see [`check_name`]).
pub const REASON_BAD_NAME: &str = "bad name";
/// The hash is not 64 hex digits.
pub const REASON_BAD_HASH: &str = "bad hash";
/// A chunk group did not match the hash the device gave.
pub const REASON_HASH_MISMATCH: &str = "hash mismatch";
/// The device sent fewer bytes than it said, or a malformed encoding.
pub const REASON_TRUNCATED: &str = "transfer cut short";
/// Over the size one file may have.
pub const REASON_TOO_LARGE: &str = "file too large";
/// Over the files a device may keep in one session.
pub const REASON_TOO_MANY_FILES: &str = "too many files";
/// Over the bytes a device may keep on the workstation.
pub const REASON_QUOTA: &str = "device over its disk quota";
/// The workstation's disk has no room for it.
pub const REASON_DISK_FULL: &str = "the workstation's disk is full";
/// Over the transfers a device may run at once.
pub const REASON_BUSY: &str = "too many transfers at once";
/// A get named something outside the agent's workspace and the files folders
/// (or reached by a link out of them, or a secret's place).
pub const REASON_OUTSIDE: &str = "outside the agent's workspace";
/// A get named nothing readable there.
pub const REASON_NOT_FOUND: &str = "no such file";
/// The workstation could not store or read it (the log says why).
pub const REASON_IO: &str = "the workstation could not store the file";
/// The device's scope does not include `files`.
pub const REASON_NOT_PERMITTED: &str = "this device may not send or fetch files";

/// Why a name is refused: one path component a file system takes as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    Empty,
    TooLong,
    /// `/` or `\`: a path, not a name.
    Separator,
    /// `.` or `..`.
    Dots,
    /// NUL, a control character (a line break in a log), or a byte-order or
    /// direction mark that disguises the name.
    Control,
    /// A leading `.`: hidden, and the store's own partials start so.
    Hidden,
}

impl std::fmt::Display for BadName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "empty",
            Self::TooLong => "longer than 255 bytes",
            Self::Separator => "has a path separator",
            Self::Dots => "is . or ..",
            Self::Control => "has a control character",
            Self::Hidden => "starts with a dot",
        })
    }
}

/// Whether `name` may name a file in a files folder: a single component,
/// visible, printable, at most [`MAX_NAME_BYTES`]. Refused rather than
/// rewritten, so a sender learns why.
pub fn check_name(name: &str) -> Result<(), BadName> {
    if name.is_empty() {
        return Err(BadName::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(BadName::TooLong);
    }
    if name == "." || name == ".." {
        return Err(BadName::Dots);
    }
    if name.contains(['/', '\\']) {
        return Err(BadName::Separator);
    }
    let disguising = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
    if name.chars().any(|c| c.is_control() || disguising(c)) {
        return Err(BadName::Control);
    }
    if name.starts_with('.') {
        return Err(BadName::Hidden);
    }
    Ok(())
}

/// Whether `hash` is a BLAKE3 hash as the wire writes it.
pub fn is_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused_with_the_reason() {
        assert_eq!(check_name("../../.ssh/authorized_keys"), Err(BadName::Separator));
        assert_eq!(check_name("/etc/passwd"), Err(BadName::Separator));
        assert_eq!(check_name("a\\b"), Err(BadName::Separator));
        assert_eq!(check_name(".."), Err(BadName::Dots));
        assert_eq!(check_name("a\0b"), Err(BadName::Control));
        assert_eq!(check_name("line\nbreak"), Err(BadName::Control));
        assert_eq!(check_name("gpj.\u{202e}exe"), Err(BadName::Control));
        assert_eq!(check_name(".bashrc"), Err(BadName::Hidden));
        assert_eq!(check_name(""), Err(BadName::Empty));
        assert_eq!(check_name(&"a".repeat(256)), Err(BadName::TooLong));
        assert_eq!(check_name("photo 2026-12-05 (1).jpg"), Ok(()));
        assert_eq!(check_name("отчёт.pdf"), Ok(()));
    }

    #[test]
    fn lines_read_as_the_module_says() {
        let put: Request =
            serde_json::from_str(r#"{"put":{"name":"a.txt","size":3,"hash":"00","session":"ab12cd34"}}"#)
                .unwrap();
        assert!(matches!(put, Request::Put(Put { size: 3, .. })));
        let get: Request = serde_json::from_str(r#"{"get":{"uri":"file:///tmp/x"}}"#).unwrap();
        assert!(matches!(get, Request::Get(Get { from: 0, hash: None, .. })));
        assert_eq!(serde_json::to_string(&Reply::Have(16384)).unwrap(), r#"{"have":16384}"#);
        assert_eq!(serde_json::to_string(&Reply::Error("x".into())).unwrap(), r#"{"error":"x"}"#);
    }
}
