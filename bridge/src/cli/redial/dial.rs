//! Dialing the bridge again after a loss: a bounded backoff with a few attempts in flight,
//! and a fresh endpoint (same key) when the old one may hold a dead relay's queue.

use super::*;

/// First pause between starting redials; doubled after each start.
pub(super) const REDIAL_FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest pause between starting redials: a path that comes back is found
/// within about this long (plus one handshake).
pub(super) const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One redial attempt's limit: covers a handshake over a slow relay path with
/// a retransmission or two.
pub(super) const REDIAL_ATTEMPT: Duration = Duration::from_secs(5);

/// Redial attempts in flight at once (each is one handshake's state): past
/// it, the oldest gives way to the next (a fresh attempt's Initial goes out
/// at once; an old one waits for QUIC's retransmission).
pub(super) const REDIAL_IN_FLIGHT: usize = 4;

/// A redial that has not got through from the current endpoint within this
/// goes on from a fresh one (once): whatever holds the old endpoint's sends
/// back (see [`ClientEndpoint`]) holds no fresh one.
pub(super) const REDIAL_RENEW_AFTER: Duration = Duration::from_secs(2);

/// A fresh endpoint for `ep` (see [`ClientEndpoint`]); whether it was made.
pub(super) async fn renew(ep: &ClientEndpoint, why: &str) -> bool {
    match ep.renew(why).await {
        Ok(_) => true,
        Err(e) => {
            warn!("could not make a fresh endpoint ({e:#}); redialing from the old one");
            false
        }
    }
}

/// Redials until a connection with the resumable protocol is made, or
/// `deadline`. Attempts are staggered and overlap: a handshake whose first
/// packet went out while the path was still down waits for QUIC's
/// retransmission (a second or more), while a fresh attempt started after
/// the path came back gets through in one round trip. Each attempt goes to
/// every address of the ticket at once (each of its relays, its direct
/// addresses). Not through after [`REDIAL_RENEW_AFTER`], it goes on from a
/// fresh endpoint, unless `renewed` already.
pub(super) async fn redial(
    ep: &ClientEndpoint,
    target: &Target,
    alpn: &[u8],
    deadline: Instant,
    mut renewed: bool,
) -> Result<Connection> {
    let mut attempts = tokio::task::JoinSet::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut gap = REDIAL_FIRST_BACKOFF;
    let started = Instant::now();
    let mut next_start = started;
    let mut last = String::from("no attempt made");
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!("could not reach the bridge again while it kept the session (last attempt: {last})");
        }
        if !renewed && now >= started + REDIAL_RENEW_AFTER {
            // Once, whether or not a fresh one could be made.
            renew(ep, &format!("no redial got through within {REDIAL_RENEW_AFTER:?}")).await;
            renewed = true;
            // The old endpoint's attempts went with it.
            attempts.abort_all();
            in_flight.clear();
            next_start = now;
        }
        if now >= next_start {
            in_flight.retain(|a: &tokio::task::AbortHandle| !a.is_finished());
            if in_flight.len() >= REDIAL_IN_FLIGHT {
                if let Some(oldest) = in_flight.pop_front() {
                    oldest.abort();
                }
            }
            let (ep, addr, alpn) = (ep.current(), target.endpoint_addr(), alpn.to_vec());
            in_flight.push_back(
                attempts.spawn(
                    async move { tokio::time::timeout(REDIAL_ATTEMPT, ep.connect(addr, &alpn)).await },
                ),
            );
            next_start = now + gap;
            gap = (gap * 2).min(REDIAL_MAX_BACKOFF);
        }
        let mut wake = next_start.min(deadline);
        if !renewed {
            wake = wake.min(started + REDIAL_RENEW_AFTER);
        }
        tokio::select! {
            Some(r) = attempts.join_next(), if !attempts.is_empty() => match r {
                Ok(Ok(Ok(c))) => return Ok(c),
                Ok(Ok(Err(e))) => {
                    let text = format!("{e:#}");
                    if close::is_alpn_refusal(&text) {
                        bail!("the bridge no longer offers resumable sessions (it was restarted with --no-resume?)");
                    }
                    debug!("redial failed: {text}");
                    last = text;
                }
                Ok(Err(_)) => last = "timed out".into(),
                Err(e) if e.is_cancelled() => {}
                Err(e) => last = e.to_string(),
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}
