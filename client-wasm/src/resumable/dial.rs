//! Reaching the bridge again: the QUIC transport a resumable session dials
//! with, and the bounded redial after a loss (the policy; what to say on the
//! new connection is the protocol's, in `thunderbolt_shared::resume_client`).

use super::*;

/// First pause between starting redials; doubled after each start.
const REDIAL_FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between starting redials.
const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// One redial attempt's limit (a relay handshake with a retransmission or two).
const REDIAL_ATTEMPT: Duration = Duration::from_secs(10);
/// The first redial attempt's limit; doubled per attempt up to [`REDIAL_ATTEMPT`].
/// Short: after a relay was lost the bridge is homed on another within a few
/// hundred ms, and a handshake started before that waits for QUIC's
/// retransmission (~1 s).
const REDIAL_FIRST_ATTEMPT: Duration = Duration::from_millis(500);
/// How long a resumable connection may be silent before it is taken for lost
/// (and redialed), unless `options.idleTimeoutMs` says otherwise: as the bridge.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A redial not through within this from the endpoint the lost connection
/// went out from goes on from a fresh one (once; see `ClientInner::renew`).
const REDIAL_RENEW_AFTER: Duration = Duration::from_secs(2);

/// Why a connection was lost when this page's own endpoint closed it.
pub(super) const LOCALLY_CLOSED: &str = "closed by this page's endpoint";
/// Shortest idle timeout accepted: a few round trips through a relay.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_millis(300);
/// Keep-alive period (a third of the idle timeout when that is shorter).
const KEEP_ALIVE: Duration = Duration::from_secs(3);

/// The transport of resumable connections: keep-alives and an idle timeout
/// so a dead path is noticed in seconds.
pub fn transport(idle: Duration) -> Result<QuicTransportConfig, String> {
    let idle_t = idle.try_into().map_err(|_| "the idle timeout is too long".to_string())?;
    Ok(QuicTransportConfig::builder()
        .keep_alive_interval(KEEP_ALIVE.min(idle / 3))
        .max_idle_timeout(Some(idle_t))
        .build())
}

/// Redials until a connection with the resumable protocol is made, or the
/// grace is over. The first attempts are cut short (1 s, then doubling): a
/// handshake started while the path was down waits for QUIC's
/// retransmission, while a fresh one after the path came back goes through
/// in one round trip. (Overlapping attempts, as `connect` makes, cost the
/// browser module more code than they win here.)
pub(super) async fn redial(
    client: &Rc<ClientInner>,
    addr: &EndpointAddr,
    alpn: &[u8],
    grace: Duration,
    transport: &QuicTransportConfig,
    mut renewed: bool,
) -> Result<(Connection, u32), String> {
    use n0_future::time::Instant;
    let start = Instant::now();
    let deadline = start + grace;
    let renew_at = start + REDIAL_RENEW_AFTER;
    let mut backoff = REDIAL_FIRST_BACKOFF;
    let mut attempt_limit = REDIAL_FIRST_ATTEMPT;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        if !renewed && Instant::now() >= renew_at {
            // Once: whatever holds the old endpoint's sends back holds no fresh one.
            crate::relays::renew(client, client.generation()).await;
            renewed = true;
        }
        let (generation, ep) = (client.generation(), client.ep());
        let mut limit = attempt_limit;
        if !renewed {
            limit = limit.min(renew_at.saturating_duration_since(Instant::now())).max(REDIAL_FIRST_BACKOFF);
        }
        let opts = ConnectOptions::new().with_transport_config(transport.clone());
        let dial = async {
            let connecting =
                ep.connect_with_opts(addr.clone(), alpn, opts).await.map_err(|e| e.to_string())?;
            connecting.await.map_err(|e| e.to_string())
        };
        match n0_future::time::timeout(limit, dial).await {
            Ok(Ok(c)) => return Ok((c, generation)),
            Ok(Err(e)) => {
                last = e;
                n0_future::time::sleep(backoff).await;
                backoff = (backoff * 2).min(REDIAL_MAX_BACKOFF);
            }
            Err(_) => last = "timed out".into(),
        }
        attempt_limit = (attempt_limit * 2).min(REDIAL_ATTEMPT);
    }
    Err(last)
}

/// Dials with the resumable ALPN first and the plain one (if any) as a fallback.
pub async fn connect_either(
    client: &ClientInner,
    addr: EndpointAddr,
    resume_alpn: &[u8],
    plain_alpn: Option<Vec<u8>>,
    transport: QuicTransportConfig,
) -> Result<Connection, String> {
    let opts = ConnectOptions::new()
        .with_additional_alpns(plain_alpn.into_iter().collect())
        .with_transport_config(transport);
    let connecting =
        client.ep().connect_with_opts(addr, resume_alpn, opts).await.map_err(|e| e.to_string())?;
    connecting.await.map_err(|e| e.to_string())
}
