//! When the agent's output is written to the journal while a client is
//! attached: once it is [`WRITE_BEHIND`] old and still unacknowledged.
//! Most output is acknowledged before (a round trip and the ack delay), and
//! never written. Written through at each turn instead (everything
//! unacknowledged, a few milliseconds old or not), a bulk transfer wrote a
//! tenth of its output to the disk, only for its acknowledgement to free it
//! right after (`bench --only duplex`: 4–13 MB of every 64 MiB echoed).

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

use super::WRITE_BEHIND;

/// How finely output is told apart by age: runs this close together are
/// written (or not) together, so output is written at most this much later
/// than [`WRITE_BEHIND`] says, and the session's writer wakes for the
/// journal at most once per this.
pub const AGE_GRAIN: Duration = Duration::from_millis(50);

/// The agent's output by age, while a client is attached.
#[derive(Debug, Default)]
pub struct WriteBehind {
    /// When runs came, and the frames pushed by then (oldest first; runs
    /// within [`AGE_GRAIN`] of each other share an entry).
    ages: VecDeque<(Instant, u64)>,
}

impl WriteBehind {
    /// The agent's output reached `total` frames at `now`.
    pub fn output(&mut self, now: Instant, total: u64) {
        match self.ages.back_mut() {
            Some((at, upto)) if now.saturating_duration_since(*at) < AGE_GRAIN => *upto = total,
            _ => self.ages.push_back((now, total)),
        }
    }

    /// When the oldest output not yet due becomes due, if any waits.
    pub fn due(&self) -> Option<Instant> {
        self.ages.front().map(|(at, _)| *at + WRITE_BEHIND)
    }

    /// The frames before which output is [`WRITE_BEHIND`] old at `now`
    /// (`None`: none became due since the last turn).
    pub fn turn(&mut self, now: Instant) -> Option<u64> {
        let mut upto = None;
        while let Some(&(at, n)) = self.ages.front() {
            if at + WRITE_BEHIND > now {
                break;
            }
            upto = Some(n);
            self.ages.pop_front();
        }
        upto
    }

    /// Everything was written (or is not to be): nothing waits.
    pub fn clear(&mut self) {
        self.ages.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_due_once_it_is_old_enough_and_only_that_output() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut w = WriteBehind::default();
        assert_eq!(w.due(), None);
        w.output(ms(0), 10);
        w.output(ms(20), 15); // within the grain: one entry
        w.output(ms(100), 30);
        w.output(ms(300), 40);
        assert_eq!(w.due(), Some(ms(0) + WRITE_BEHIND));
        assert_eq!(w.turn(ms(200)), None, "nothing is old enough yet");
        // At 250 ms only what came in the first grain is due: frames before 15.
        assert_eq!(w.turn(ms(250)), Some(15));
        assert_eq!(w.due(), Some(ms(100) + WRITE_BEHIND));
        assert_eq!(w.turn(ms(300)), None);
        // Late turns take everything that aged meanwhile at once.
        assert_eq!(w.turn(ms(900)), Some(40));
        assert_eq!(w.due(), None);
        w.output(ms(1000), 41);
        w.clear();
        assert_eq!((w.due(), w.turn(ms(5000))), (None, None));
    }
}
