//! The silence watch: a connection that heard nothing from the bridge, not even
//! an answer to a probe, is taken for lost.

use super::*;

impl Resumable {
    /// Resolves, saying why, once `conn` heard nothing from the bridge, not
    /// even an answer to a probe (`shared::silence`).
    pub(super) async fn silent(&self, conn: &Connection) -> String {
        use n0_future::time::Instant;
        let start = Instant::now();
        let heard = || conn.stats().udp_rx.datagrams;
        let rtt = || conn.paths().iter().find(|p| p.is_selected()).map(|p| p.rtt()).unwrap_or_default();
        let mut w = Silence::new(Duration::ZERO, heard());
        loop {
            n0_future::time::sleep(silence::TICK).await;
            match w.tick(start.elapsed(), heard(), rtt()) {
                Verdict::Probe => {
                    self.st.borrow_mut().probe();
                    let _ = self.poke.unbounded_send(());
                }
                Verdict::Suspect { silent_for } => {
                    // Its path went through a relay that may be dead (a
                    // browser's always does), holding this endpoint's sends.
                    self.st.borrow_mut().renew = true;
                    return format!(
                        "nothing heard from the bridge for {:.1} s, not even an answer to a probe",
                        silent_for.as_secs_f64()
                    );
                }
                Verdict::Fine => {}
            }
        }
    }
}
