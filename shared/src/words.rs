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

/// What a person is told when the bridge closed the connection with `code`
/// and `reason`: the same words from `connect` and on the page. A refusal
/// says what to do next; a pairing refusal says what went wrong with the
/// code; anything else names the code. `node_id` is this device's (the
/// line that lets it in names it).
pub fn closed(code: u64, reason: &str, node_id: &str) -> String {
    use crate::close::Refusal;
    if let Some(hint) = pairing_hint(reason) {
        return format!("pairing refused: {reason}{hint}");
    }
    match Refusal::from_close(code, reason.as_bytes()) {
        Some(Refusal::NotAllowlisted) => format!(
            "the bridge refused the connection: not allowlisted: on the bridge's machine run `thunderbolt iroh \
             allow {node_id}` (or `thunderbolt iroh pair` there, and pair this device with the code or link it \
             prints)"
        ),
        Some(Refusal::MembershipRevoked) => "the bridge ended the session: membership revoked (this device is \
                                             no longer one of the account's: `thunderbolt iroh pair` on the \
                                             bridge's machine pairs it again)"
            .into(),
        Some(r) => r.describe(),
        None => format!("the bridge closed the connection: {reason} (code {code})"),
    }
}

/// What to do after a refused pairing (`reason` one of the bridge's
/// `REASON_PAIR_*`); `None` for any other reason.
pub fn pairing_hint(reason: &str) -> Option<&'static str> {
    use crate::pairing::*;
    Some(match reason {
        REASON_PAIR_EXPIRED | REASON_PAIR_SPENT | REASON_PAIR_BURNED => {
            " (mint a new one with `thunderbolt iroh pair` on the bridge's machine)"
        }
        REASON_PAIR_WRONG => " (check the code, or mint a new one with `thunderbolt iroh pair`)",
        REASON_PAIR_OTHER_AGENT => " (use the ticket printed beside the code)",
        REASON_PAIR_BACKOFF => " (wait a minute, then check the code you type)",
        REASON_PAIR_BAD => "",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_is_said_the_same_everywhere_with_what_to_do() {
        let na = closed(1, "not allowlisted", "abc");
        assert!(na.starts_with("the bridge refused the connection: not allowlisted: "), "{na}");
        assert!(na.contains("`thunderbolt iroh allow abc`"), "{na}");
        assert_eq!(
            closed(1, crate::pairing::REASON_PAIR_WRONG, "abc"),
            "pairing refused: pairing code not recognised (check the code, or mint a new one with \
             `thunderbolt iroh pair`)"
        );
        assert_eq!(
            closed(1, "bridge shutting down", "abc"),
            "the bridge shut down: connect again once it runs"
        );
        assert!(closed(1, "unknown session", "abc").starts_with("the session is gone"));
        assert_eq!(closed(7, "odd", "abc"), "the bridge closed the connection: odd (code 7)");
    }

    #[test]
    fn handshake_words() {
        assert!(is_identity_mismatch(
            "the cryptographic handshake failed: error 48: invalid peer certificate: UnknownIssuer"
        ));
        assert!(!is_identity_mismatch("connection timed out"));
        assert!(not_a_peer("endpiont", 8).contains("(this is 8)"));
    }
}
