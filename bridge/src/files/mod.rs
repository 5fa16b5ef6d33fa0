//! Files between devices and the workstation (`thunderbolt/<p>/files1`, the
//! wire in [`thunderbolt_shared::files`]): a device puts a photo or a log
//! into a files folder, or gets a file the agent wrote; every chunk group is
//! checked against the file's BLAKE3 hash as it arrives (bao-tree's verified
//! streaming), and a cut transfer resumes from what arrived.
//!
//! - [`stream`]: the verified encoding both ends send and check (the CLI and
//!   the bridge use the same two functions).
//! - [`store`]: where files land (`<home>/files/<agent>/<device>/<session>/`,
//!   0700 folders, 0600 files), partial transfers, what a device holds.
//! - [`reach`]: which files a device may get, resolved without following a
//!   link out of the agent's workspace or the files folders.
//! - [`inflight`]: transfers running now, per device.
//! - [`device`]: a device's side of one put or get (the CLI's and the bench's).
//!
//! The bridge's side of a connection is `serve::files` (admitted like every
//! connection); the CLI's is `cli::files_cmd`. Every limit below is what one
//! device may cost the workstation.

pub mod device;
pub mod inflight;
pub mod reach;
pub mod segments;
pub mod store;
pub mod stream;
pub mod trees;

/// Largest file a device may put: a phone's 4K video of a few minutes, a
/// day of logs; a claim over it is refused before a byte is read.
pub const MAX_FILE_SIZE: u64 = 4 << 30;

/// Files one device may keep in one session's folder (or among its files of
/// no session): a conversation's photos and logs, not a backup.
pub const MAX_FILES_PER_SESSION: usize = 256;

/// Files one device may keep on the workstation in all, across agents and
/// sessions: bounds the folder walk each put does to count them.
pub const MAX_FILES_PER_DEVICE: usize = 2048;

/// Bytes one device may keep on the workstation, files and partial
/// transfers together.
pub const MAX_BYTES_PER_DEVICE: u64 = 16 << 30;

/// Transfers one device may run at once: each holds a blocking thread and a
/// stream's window of bytes in flight (QUIC's flow control bounds that).
pub const MAX_TRANSFERS_PER_DEVICE: usize = 4;

/// Transfers all devices may run at once, workstation-wide.
pub const MAX_TRANSFERS: usize = 32;

/// Free space a put leaves on the workstation's disk: a full disk breaks
/// the agents, the journal and the log, not only the transfer.
pub const DISK_RESERVE: u64 = 512 << 20;

/// How long a device may take to send its request line once it opened a
/// stream (it has it ready when it opens one).
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a transfer may go without a byte moving before it is ended (a
/// device that opened a stream and went quiet holds a thread): a path lost
/// for longer is resumed by a new transfer.
pub const STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a `file://` URI names, as the receipt writes it: the path
/// percent-encoded where a URI needs it.
pub fn file_uri(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// The path a `file://` URI names (`None` if it is not one, or not absolute).
pub fn uri_path(uri: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let rest = uri.strip_prefix("file://")?;
    // `file://localhost/…` is the same file as `file:///…`.
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let mut bytes = Vec::with_capacity(rest.len());
    let mut it = rest.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = (it.next()? as char).to_digit(16)?;
            let lo = (it.next()? as char).to_digit(16)?;
            bytes.push((hi * 16 + lo) as u8);
        } else {
            bytes.push(b);
        }
    }
    if bytes.contains(&0) {
        return None;
    }
    Some(std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_with_what_a_path_may_hold() {
        for p in ["/home/me/a b/отчёт%.pdf", "/tmp/x", "/a/#?.txt"] {
            let uri = file_uri(std::path::Path::new(p));
            assert!(!uri.contains(' ') && !uri.contains('#') && !uri.contains('?'), "{uri}");
            assert_eq!(uri_path(&uri).unwrap(), std::path::Path::new(p));
        }
        assert_eq!(uri_path("file://localhost/etc/hosts").unwrap(), std::path::Path::new("/etc/hosts"));
        assert!(uri_path("https://x/y").is_none());
        assert!(uri_path("file://relative").is_none());
        assert!(uri_path("file:///a%00b").is_none());
        assert!(uri_path("file:///a%zz").is_none());
    }
}
