//! How long a session waits with nothing attached, and how much it keeps meanwhile.

use std::time::Duration;

/// How long sessions wait for their client and how much they keep meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct ResumeConfig {
    /// How long a session whose connection was lost waits for its client.
    pub grace: Duration,
    /// Most bytes of agent output held for the client (unacknowledged).
    pub buffer: usize,
}

/// One hub's waits: what [`ResumeConfig`] says, plus a warm agent's window
/// and the agent's `idle_stop`.
#[derive(Debug, Clone, Copy)]
pub struct HubTiming {
    /// How long a lost resumable connection's session waits for its client.
    pub grace: Duration,
    pub buffer: usize,
    /// A warm agent: how long it waits for the next connection of its peer.
    pub warm: Option<Duration>,
    /// The longest an agent runs with nothing attached, whatever the above say.
    pub idle_stop: Option<Duration>,
}

impl HubTiming {
    pub fn resume(r: ResumeConfig) -> Self {
        Self { grace: r.grace, buffer: r.buffer, warm: None, idle_stop: None }
    }

    /// How long a session waits with nothing attached: the grace while a
    /// resume may come, else the warm window; never past `idle_stop`.
    pub(super) fn wait(&self, resumable: bool) -> (Duration, &'static str) {
        let (d, why) = match (resumable, self.warm) {
            (true, Some(w)) => (self.grace.max(w), "grace"),
            (true, None) => (self.grace, "grace"),
            (false, Some(w)) => (w, "keep_warm"),
            (false, None) => (self.grace, "grace"),
        };
        match self.idle_stop {
            Some(i) if i < d => (i, "idle_stop"),
            _ => (d, why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_long_a_session_waits_with_nothing_attached() {
        let s = Duration::from_secs;
        let t = HubTiming { grace: s(300), buffer: 1, warm: None, idle_stop: None };
        assert_eq!(t.wait(true), (s(300), "grace"));
        let warm = HubTiming { warm: Some(s(120)), ..t };
        assert_eq!(warm.wait(false), (s(120), "keep_warm"), "a warm agent's next connection");
        assert_eq!(warm.wait(true), (s(300), "grace"), "a lost resumable connection may come back");
        let capped = HubTiming { idle_stop: Some(s(60)), ..warm };
        assert_eq!(capped.wait(true), (s(60), "idle_stop"));
        assert_eq!(capped.wait(false), (s(60), "idle_stop"));
        let loose = HubTiming { idle_stop: Some(s(900)), ..warm };
        assert_eq!(loose.wait(false), (s(120), "keep_warm"), "idle_stop only ever shortens");
    }
}
