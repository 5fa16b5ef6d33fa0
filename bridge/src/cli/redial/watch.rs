//! Noticing a bridge that forgot the connection (killed and started again) from its
//! silence (`thunderbolt_shared::silence`), and dialing afresh beside the old connection.

use super::*;

/// Datagrams `conn` has received (relayed ones too): anything the bridge
/// sends on it, its acknowledgements included, counts.
pub(super) fn heard(conn: &Connection) -> u64 {
    conn.stats().udp_rx.datagrams
}

/// Resolves with a fresh connection to the bridge, and why, once `conn` is
/// dead while the bridge itself answers: a bridge killed (a crash, an OOM
/// kill, a power cut) and started again at once forgets the connection, and
/// cannot tell us (QUIC's stateless reset needs a key that outlives the
/// process; iroh makes a new one each run), so `conn` would wait for its idle
/// timeout. A bridge that stays silent is asked for a word first; only a
/// connection that hears nothing back is redialed beside, and one that hears
/// again before a fresh one gets through carries on (a path that came back).
pub(super) async fn bridge_forgot(
    conn: &Connection,
    st: &RefCell<State>,
    wake: &Notify,
    ep: &ClientEndpoint,
    target: &Target,
    alpn: &[u8],
) -> (Connection, String) {
    let start = Instant::now();
    let clock = move || Instant::now() - start;
    let mut w = Silence::new(clock(), heard(conn));
    loop {
        let silent_for = watch(conn, &mut w, start, st, wake, false).await;
        let silent_since = Instant::now() - silent_for;
        debug!("nothing heard from the bridge for {silent_for:?}: dialing it afresh beside");
        // Never a fresh endpoint here: that would close `conn` with the old one.
        let deadline = Instant::now() + st.borrow().grace().max(REDIAL_ATTEMPT);
        tokio::select! {
            biased;
            _ = watch(conn, &mut w, start, st, wake, true) => debug!("the bridge is heard again: carrying on"),
            r = redial(ep, target, alpn, deadline, true) => match r {
                Ok(fresh) => {
                    let why = format!(
                        "the bridge answers a new connection but nothing on this one for {:.1} s: it lost it (restarted?)",
                        silent_since.elapsed().as_secs_f64()
                    );
                    return (fresh, why);
                }
                // Unreachable as well: the loss, if it is one, is the idle timeout's to call.
                Err(e) => {
                    debug!("a fresh dial beside a silent connection failed: {e:#}");
                    std::future::pending::<()>().await;
                }
            },
        }
    }
}

/// The round-trip time of `conn`'s selected path (none yet: zero, the
/// least wait [`Silence`] gives a probe applies).
pub(super) fn selected_rtt(conn: &Connection) -> Duration {
    conn.paths().iter().find(|p| p.is_selected()).map(|p| p.rtt()).unwrap_or_default()
}

/// Watches `conn` ([`Silence`]): asks the bridge for a word when it is
/// silent, and returns once the connection is suspect, with how long it was
/// silent; `until_heard` instead returns once it is heard again.
/// Its clock counts from `start`.
pub(super) async fn watch(
    conn: &Connection,
    w: &mut Silence,
    start: Instant,
    st: &RefCell<State>,
    wake: &Notify,
    until_heard: bool,
) -> Duration {
    let clock = move || Instant::now() - start;
    loop {
        tokio::time::sleep(silence::TICK).await;
        match w.tick(clock(), heard(conn), selected_rtt(conn)) {
            Verdict::Probe => {
                st.borrow_mut().probe();
                wake.notify_one();
            }
            Verdict::Suspect { silent_for } if !until_heard => return silent_for,
            Verdict::Fine if until_heard => return Duration::ZERO,
            _ => {}
        }
    }
}
