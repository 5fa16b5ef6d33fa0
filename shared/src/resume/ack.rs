//! When a receiver acknowledges what it took: the counts ([`AckPolicy`]) and
//! their timing ([`Acks`]), with time passed in by the caller. The native
//! client, the browser client and the bridge's side of each session all ack
//! by these rules; none keeps a timer of its own beyond sleeping until
//! [`Acks::poll_timeout`].

use std::{ops::Add, time::Duration};

use super::{Control, ACK_DELAY_MS, ACK_EVERY_BYTES, ACK_EVERY_FRAMES};

/// An instant of the caller's clock (tokio's, the browser's, or a test's
/// `Duration` since zero): the protocol's state machines take time as an
/// input, never read a clock.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> {}
impl<T: Copy + Ord + Add<Duration, Output = T>> Moment for T {}

/// When a receiver should acknowledge (see [`ACK_EVERY_FRAMES`],
/// [`ACK_EVERY_BYTES`], [`ACK_DELAY_MS`]), by counts alone: [`Acks`] adds
/// the timing.
#[derive(Debug, Default)]
pub struct AckPolicy {
    received: u64,
    acked: u64,
    bytes_since: u64,
}

impl AckPolicy {
    /// Starts at a resume point (what the welcome or hello said was held).
    pub fn at(received: u64) -> Self {
        Self { received, acked: received, bytes_since: 0 }
    }

    /// Records frames taken; true when an ack is due now.
    pub fn took(&mut self, frames: u64, bytes: usize) -> bool {
        self.received += frames;
        self.bytes_since += bytes as u64;
        self.received - self.acked >= ACK_EVERY_FRAMES || self.bytes_since >= ACK_EVERY_BYTES
    }

    /// Frames held.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Whether anything is unacknowledged (then ack within [`ACK_DELAY_MS`]).
    pub fn pending(&self) -> bool {
        self.received > self.acked
    }

    /// The ack to send now, if any.
    pub fn ack(&mut self) -> Option<Control> {
        self.bytes_since = 0;
        if self.received > self.acked {
            self.acked = self.received;
            Some(Control::Ack(self.received))
        } else {
            None
        }
    }

    /// After a reconnect everything held is acknowledged again by the hello or welcome.
    pub fn resumed(&mut self) {
        self.acked = self.received;
        self.bytes_since = 0;
    }
}

/// A receiver's acknowledgements with their timing: due at once past
/// [`ACK_EVERY_FRAMES`] or [`ACK_EVERY_BYTES`] (or when asked, say at the
/// sender's end), else [`ACK_DELAY_MS`] after the first frame not yet
/// acknowledged (so a quiet session's replay buffer empties too), and a
/// probe repeats the last one when the other side went silent
/// (`crate::silence`). Sans-IO: the driver passes `now` in, sleeps until
/// [`Self::poll_timeout`], and writes what [`Self::poll_transmit`] hands out.
#[derive(Debug)]
pub struct Acks<T> {
    counts: AckPolicy,
    /// An ack is to go out now.
    due: bool,
    /// The last ack is to go out again even if nothing is new.
    probe: bool,
    /// When the pending ack is due at the latest (set while one is pending).
    deadline: Option<T>,
}

impl<T> Default for Acks<T> {
    fn default() -> Self {
        Self { counts: AckPolicy::default(), due: false, probe: false, deadline: None }
    }
}

impl<T: Moment> Acks<T> {
    /// Starts at a resume point (what the welcome or hello said was held).
    pub fn at(received: u64) -> Self {
        Self { counts: AckPolicy::at(received), ..Self::default() }
    }

    /// Frames held.
    pub fn received(&self) -> u64 {
        self.counts.received()
    }

    /// Whether anything taken is not acknowledged yet.
    pub fn pending(&self) -> bool {
        self.counts.pending()
    }

    /// Frames taken at `now`: an ack is due at once past the counts, else by
    /// [`ACK_DELAY_MS`] after the first frame it covers. True when the
    /// driver's writer must look again: an ack became due, or a deadline was
    /// set (a writer asleep without either would miss it).
    pub fn took(&mut self, frames: u64, bytes: usize, now: T) -> bool {
        let was_due = self.is_due();
        if self.counts.took(frames, bytes) {
            self.due = true;
        } else if self.counts.pending() && self.deadline.is_none() {
            self.deadline = Some(now + Duration::from_millis(ACK_DELAY_MS));
            return true;
        }
        self.is_due() && !was_due
    }

    /// Acknowledge now (the sender ended: it waits for this ack to close).
    pub fn ack_now(&mut self) {
        self.due = true;
    }

    /// Repeat the last ack even with nothing new: a probe of a silent path.
    pub fn probe(&mut self) {
        self.probe = true;
    }

    /// Whether a line is to go out now (then [`Self::poll_transmit`]).
    pub fn is_due(&self) -> bool {
        self.due || self.probe
    }

    /// When to call [`Self::handle_timeout`] next, if a pending ack waits for
    /// its deadline.
    pub fn poll_timeout(&self) -> Option<T> {
        self.deadline.filter(|_| !self.is_due())
    }

    /// Time passed: a pending ack whose deadline came is due.
    pub fn handle_timeout(&mut self, now: T) {
        if self.deadline.is_some_and(|at| at <= now) {
            self.due = true;
        }
    }

    /// The control line to send now, if any: the ack, or the last one again
    /// as a probe.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        let probe = std::mem::take(&mut self.probe);
        if !(std::mem::take(&mut self.due) || probe) {
            return None;
        }
        self.deadline = None;
        match self.counts.ack() {
            None if probe => Some(Control::Ack(self.counts.received())),
            ack => ack,
        }
    }

    /// A new connection: its hello or welcome acknowledged everything held.
    pub fn resumed(&mut self) {
        self.counts.resumed();
        (self.due, self.probe, self.deadline) = (false, false, None);
    }
}
