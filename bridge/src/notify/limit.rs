//! How often one session may notify: a burst, then one per interval.
//!
//! A token bucket: [`BURST`] notices at once, then one more each [`EVERY`].
//! Notices over it are not sent but counted, and the next one that goes says
//! how many were held back, so a flood of an agent's requests costs the owner
//! a few notices, never a hundred.

use std::time::Duration;

use tokio::time::Instant;

/// Notices one session may send at once: a permission prompt, the turn's end
/// and one more get through before the limit bites.
pub const BURST: u32 = 3;

/// After the burst, one notice per this: often enough to hear that an agent
/// still waits, rarely enough that a looping agent is not a pager.
pub const EVERY: Duration = Duration::from_secs(30);

/// One session's bucket. Time comes from tokio's clock (paused in tests).
#[derive(Debug)]
pub struct Limiter {
    burst: u32,
    every: Duration,
    tokens: u32,
    /// When the last token was added (or the bucket was made).
    refilled: Instant,
    held: u64,
}

impl Limiter {
    pub fn new(burst: u32, every: Duration) -> Self {
        Self { burst, every, tokens: burst, refilled: Instant::now(), held: 0 }
    }

    /// Whether a notice may go now; if so, how many were held back before it.
    pub fn take(&mut self) -> Option<u64> {
        let now = Instant::now();
        if !self.every.is_zero() {
            let gained = (now - self.refilled).as_nanos() / self.every.as_nanos();
            if gained > 0 {
                self.tokens = self.burst.min(self.tokens.saturating_add(gained.min(u32::MAX as u128) as u32));
                self.refilled += self.every * gained.min(u32::MAX as u128) as u32;
            }
        }
        if self.tokens == 0 {
            self.held += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.held))
    }

    /// Notices held back since the last one that went.
    pub fn held(&self) -> u64 {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_one_per_interval() {
        let mut l = Limiter::new(BURST, EVERY);
        for _ in 0..BURST {
            assert_eq!(l.take(), Some(0));
        }
        for _ in 0..97 {
            assert_eq!(l.take(), None);
        }
        tokio::time::advance(EVERY - Duration::from_millis(1)).await;
        assert_eq!(l.take(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(l.take(), Some(98), "the next notice says how many were held back");
        assert_eq!(l.take(), None);
        // A long quiet refills the burst, never more.
        tokio::time::advance(EVERY * 100).await;
        for _ in 0..BURST {
            assert!(l.take().is_some());
        }
        assert_eq!(l.take(), None);
    }
}
