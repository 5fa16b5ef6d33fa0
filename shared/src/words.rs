//! What a client tells a person when a ticket, a NodeId or the way to a
//! bridge fails: the same words on the CLI and in the browser client's typed
//! errors, each saying what happened and what to do next.

/// A string that starts like a ticket but does not decode (cut short,
/// mistyped, or wrapped by a mail client). The decoder's own words (bit
/// offsets, buffer ends) mean nothing to the person holding it.
pub const TICKET_DAMAGED: &str = "this ticket is damaged: copy it again, whole (from the bridge's banner, \
                                  or `thunderbolt iroh id` on its machine)";

/// A ticket that decoded, but names a key the bridge at its address does not
/// hold: one character changed inside the NodeId still decodes, to another
/// NodeId with the same addresses, and only the handshake notices.
pub const OTHER_IDENTITY: &str = "the bridge at that address has another identity: the ticket is damaged \
                                  (copy it again) or the bridge's identity changed (get its new ticket)";

/// A ticket without a relay or a direct address: minted with relays
/// disabled while no bridge ran.
pub const NO_ADDRESS: &str = "this ticket carries no address (it was printed with relays disabled and no \
                              bridge running): use the ticket from the running bridge's banner";

/// Neither form: wrong length, or a ticket whose prefix was mistyped.
pub fn not_a_peer(shown: &str, len: usize) -> String {
    format!(
        "'{shown}' is neither a ticket nor a NodeId: a ticket starts with `endpoint`, a NodeId is 64 hex \
         or 52 base32 characters (this is {len}): copy it again"
    )
}

/// The handshake failed because the peer's key is not the one dialed (how
/// rustls and iroh word it: an invalid peer certificate, TLS alert 42/48/51).
pub fn is_identity_mismatch(error_text: &str) -> bool {
    let t = error_text.to_ascii_lowercase();
    t.contains("invalid peer certificate")
        || t.contains("bad certificate")
        || t.contains("error 42:")
        || t.contains("error 48:")
        || t.contains("error 51:")
}

/// The relay at `url` was never reached within a dial: the client could not
/// get out at all, so the bridge was never asked.
pub fn relay_unreachable(url: &str) -> String {
    format!(
        "could not reach the relay {url}: is it running, and does this device trust its certificate? \
         (opening {url} in a browser shows why)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_words() {
        assert!(is_identity_mismatch(
            "the cryptographic handshake failed: error 48: invalid peer certificate: UnknownIssuer"
        ));
        assert!(!is_identity_mismatch("connection timed out"));
        assert!(not_a_peer("endpiont", 8).contains("(this is 8)"));
    }
}
