//! When a connection's silence means the bridge lost it.
//!
//! A bridge killed (a crash, an OOM kill, a power cut) and started again at
//! once no longer knows the connections of the process before it, and cannot
//! say so: QUIC's stateless reset needs a key that outlives the process, and
//! iroh makes a new one each run. Left alone, a client finds out only at its
//! idle timeout. A live bridge is never silent for long (it streams; idle,
//! keep-alives and their acknowledgements cross every few seconds), and it
//! acknowledges anything we send within a round trip. So: silent for
//! [`SILENCE_BEFORE_PROBE`], the client sends one frame that asks nothing
//! (an ack it already sent), and a connection that hears nothing back within
//! [`probe_answer`] is suspect: the client dials afresh (beside it, or in its
//! place), and a bridge that answers the fresh dial lost the old connection.
//!
//! Sans-IO: the caller says what the connection has heard so far (its count
//! of received datagrams) and the time, every [`TICK`]; [`Silence`] says what
//! to do. Time is the caller's (a [`Duration`] since any fixed instant), so
//! the same code runs natively, in the browser and under a test's clock.

use std::time::Duration;

/// Silence after which the bridge is asked for a word: a little over the
/// time a busy relay path may hold a packet, far under any idle timeout.
pub const SILENCE_BEFORE_PROBE: Duration = Duration::from_secs(1);

/// Least time the answer to a probe is given (a slow path gets four round
/// trips: see [`probe_answer`]).
pub const PROBE_ANSWER_MIN: Duration = Duration::from_millis(500);

/// How often the caller is expected to call [`Silence::tick`]: the bound on
/// how late a silence is noticed.
pub const TICK: Duration = Duration::from_millis(100);

/// How long a probe's answer may take on a path with round-trip time `rtt`.
pub fn probe_answer(rtt: Duration) -> Duration {
    PROBE_ANSWER_MIN.max(rtt.saturating_mul(4))
}

/// What the caller does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do: the bridge was heard lately, or a probe is awaited.
    Fine,
    /// Send the probe (once per silence).
    Probe,
    /// Nothing came back: the connection is suspect, silent this long. Said
    /// at every tick until the connection is heard again.
    Suspect { silent_for: Duration },
}

/// The silence watch of one connection.
#[derive(Debug, Clone)]
pub struct Silence {
    heard: u64,
    since: Duration,
    asked: Option<Duration>,
}

impl Silence {
    /// Starts watching at `now`, the connection having heard `heard` so far.
    pub fn new(now: Duration, heard: u64) -> Self {
        Self { heard, since: now, asked: None }
    }

    /// One look at the connection: it has heard `heard` in all; `rtt` is its
    /// round-trip estimate.
    pub fn tick(&mut self, now: Duration, heard: u64, rtt: Duration) -> Verdict {
        if heard != self.heard {
            *self = Self::new(now, heard);
            return Verdict::Fine;
        }
        let silent_for = now.saturating_sub(self.since);
        match self.asked {
            None if silent_for >= SILENCE_BEFORE_PROBE => {
                self.asked = Some(now);
                Verdict::Probe
            }
            Some(at) if now.saturating_sub(at) >= probe_answer(rtt) => Verdict::Suspect { silent_for },
            _ => Verdict::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(non_snake_case)]
    fn MS(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    const RTT: Duration = Duration::from_millis(20);

    /// Ticks every [`TICK`] from `from` to `to` (inclusive) with `heard`
    /// unchanged: the verdicts that were not [`Verdict::Fine`], with when.
    fn run(w: &mut Silence, from: u64, to: u64, heard: u64, rtt: Duration) -> Vec<(u64, Verdict)> {
        (from..=to)
            .step_by(TICK.as_millis() as usize)
            .map(|t| (t, w.tick(MS(t), heard, rtt)))
            .filter(|(_, v)| *v != Verdict::Fine)
            .collect()
    }

    #[test]
    fn a_silent_connection_is_probed_once_then_suspect_until_heard_again() {
        let mut w = Silence::new(MS(0), 7);
        let got = run(&mut w, 100, 1700, 7, RTT);
        assert_eq!(got[0], (1000, Verdict::Probe));
        assert_eq!(got[1], (1500, Verdict::Suspect { silent_for: MS(1500) }));
        assert_eq!(got[2], (1600, Verdict::Suspect { silent_for: MS(1600) }));
        assert_eq!(got.len(), 4, "{got:?}");
        // Heard again: fine, and a new silence starts from there.
        assert_eq!(w.tick(MS(1800), 8, RTT), Verdict::Fine);
        assert_eq!(run(&mut w, 1900, 2700, 8, RTT), vec![]);
        assert_eq!(w.tick(MS(2800), 8, RTT), Verdict::Probe);
    }

    #[test]
    fn a_connection_that_keeps_hearing_is_never_probed() {
        let mut w = Silence::new(MS(0), 0);
        for (i, t) in (100..60_000).step_by(100).enumerate() {
            // Heard something every 900 ms: under the probe's silence.
            let heard = (i as u64 + 1) / 9;
            assert_eq!(w.tick(MS(t), heard, RTT), Verdict::Fine, "at {t} ms");
        }
    }

    #[test]
    fn an_answered_probe_ends_the_suspicion_before_it_starts() {
        let mut w = Silence::new(MS(0), 1);
        assert_eq!(run(&mut w, 100, 1000, 1, RTT), vec![(1000, Verdict::Probe)]);
        // The probe's acknowledgement came back.
        assert_eq!(w.tick(MS(1100), 2, RTT), Verdict::Fine);
        assert_eq!(run(&mut w, 1200, 2000, 2, RTT), vec![]);
    }

    #[test]
    fn a_slow_path_gives_the_probe_four_round_trips() {
        let rtt = MS(400);
        assert_eq!(probe_answer(rtt), MS(1600));
        assert_eq!(probe_answer(MS(1)), PROBE_ANSWER_MIN);
        let mut w = Silence::new(MS(0), 0);
        let got = run(&mut w, 100, 2600, 0, rtt);
        assert_eq!(got[0], (1000, Verdict::Probe));
        assert_eq!(got[1], (2600, Verdict::Suspect { silent_for: MS(2600) }));
    }

    #[test]
    fn time_going_backwards_is_no_silence() {
        let mut w = Silence::new(MS(5000), 0);
        assert_eq!(w.tick(MS(100), 0, RTT), Verdict::Fine);
    }
}
