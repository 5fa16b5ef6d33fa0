//! Log budgets: a flood of identical events (a chatty agent's stderr, a
//! stranger dialing in a loop) costs a few log lines and a count, not a log
//! line each.

use std::time::Instant;

/// A token bucket for log lines: up to `burst` at once, refilled at `per_sec`.
/// Lines over the budget are counted, and the count is reported with the next
/// line that gets through (or by whoever calls [`LogBudget::take_suppressed`]).
#[derive(Debug)]
pub struct LogBudget {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    last: Instant,
    suppressed: u64,
}

impl LogBudget {
    pub fn new(burst: u32, per_sec: f64, now: Instant) -> Self {
        Self { tokens: burst as f64, burst: burst as f64, per_sec, last: now, suppressed: 0 }
    }

    /// `Some(n)` when this line may be logged, `n` being how many were
    /// suppressed since the last one that was; `None` when it is over budget.
    pub fn take(&mut self, now: Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    /// Lines suppressed and not yet reported; resets the count.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bursts_then_refills_and_counts_what_it_dropped() {
        let t0 = Instant::now();
        let mut b = LogBudget::new(3, 2.0, t0);
        assert_eq!((0..3).map(|_| b.take(t0)).collect::<Vec<_>>(), vec![Some(0); 3]);
        assert_eq!(b.take(t0), None);
        assert_eq!(b.take(t0), None);
        // Half a second at 2/s buys one line, which reports the two dropped.
        assert_eq!(b.take(t0 + Duration::from_millis(500)), Some(2));
        assert_eq!(b.take(t0 + Duration::from_millis(500)), None);
        assert_eq!(b.take_suppressed(), 1);
        // Never more than the burst, however long the pause.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..4).filter(|_| b.take(later).is_some()).count(), 3);
    }
}
