//! Random identifiers: session tokens, pairing codes, the WebSocket bridge's
//! token, session ids for `status` and `kick`. One source (the OS's), hex.

/// `n` random bytes from the OS, hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the OS random source works");
    hex::encode(b)
}

/// An unguessable resumable-session token (128 random bits).
pub fn token() -> String {
    random_hex(16)
}

/// A plain session's id for `status` and `kick` (32 bits: unique among the
/// few dozen sessions a bridge holds, and typed by people).
pub fn session_id() -> String {
    random_hex(4)
}
