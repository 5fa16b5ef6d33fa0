//! How often a session, a device and the whole bridge may notify: a burst,
//! then one per interval.
//!
//! A token bucket: [`BURST`] notices at once, then one more each [`EVERY`].
//! Notices over it are not sent but counted, and the next one that goes says
//! how many were held back, so a flood of an agent's requests costs the owner
//! a few notices, never a hundred. A session's bucket alone lets a device
//! that opens many sessions multiply it, so every notice also takes a token
//! of its device's bucket (one per NodeId, across all its sessions and all
//! agents: [`DEVICE_BURST`], [`DEVICE_EVERY`]) and of the bridge's
//! ([`BRIDGE_BURST`], [`BRIDGE_EVERY`]).

use std::{collections::HashMap, time::Duration};

use iroh::EndpointId;

use tokio::time::Instant;

/// Notices one session may send at once: a permission prompt, the turn's end
/// and one more get through before the limit bites.
pub const BURST: u32 = 3;

/// After the burst, one notice per this: often enough to hear that an agent
/// still waits, rarely enough that a looping agent is not a pager.
pub const EVERY: Duration = Duration::from_secs(30);

/// Notices one device may send at once, across all its sessions: two
/// sessions' worth of bursts, so a phone with two agents waiting hears of
/// both, and nine sessions do not make 27 notices (finding 7 of issue 33).
pub const DEVICE_BURST: u32 = 6;

/// After its burst, one notice of a device per this, whatever number of
/// sessions it has.
pub const DEVICE_EVERY: Duration = Duration::from_secs(15);

/// Notices the whole bridge (or host) may send at once: a host's sixteen
/// agents' worth of one notice each, and a few more.
pub const BRIDGE_BURST: u32 = 24;

/// After its burst, one notice of the bridge per this: every device together
/// cannot make the workstation a pager or a POST cannon.
pub const BRIDGE_EVERY: Duration = Duration::from_secs(2);

/// Devices whose buckets are remembered; past it, the buckets that are full
/// again (nothing to remember) are forgotten. Only admitted devices get one.
pub const MAX_DEVICES: usize = 4096;

/// One bucket. Time comes from tokio's clock (paused in tests).
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

    /// Counts a notice held back by another bucket (the device's, the
    /// bridge's), so the next one that goes says so too.
    pub fn hold(&mut self) {
        self.held += 1;
    }

    /// Whether the bucket is full again (forgetting it changes nothing).
    fn is_full(&self) -> bool {
        let gained = if self.every.is_zero() {
            u128::MAX
        } else {
            (Instant::now() - self.refilled).as_nanos() / self.every.as_nanos()
        };
        self.held == 0 && u128::from(self.tokens) + gained >= u128::from(self.burst)
    }
}

/// Which bucket held a notice back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The device's: `n` of its notices held so far (1: the first).
    Device(u64),
    /// The bridge's: `n` held so far.
    Bridge(u64),
}

/// The buckets shared by every session: one per device, one for the bridge.
#[derive(Debug)]
pub struct Budgets {
    devices: HashMap<EndpointId, Limiter>,
    bridge: Limiter,
}

impl Default for Budgets {
    fn default() -> Self {
        Self { devices: HashMap::new(), bridge: Limiter::new(BRIDGE_BURST, BRIDGE_EVERY) }
    }
}

impl Budgets {
    /// Takes a token of `peer`'s bucket and of the bridge's, or neither.
    pub fn take(&mut self, peer: &EndpointId) -> Result<(), Held> {
        if self.devices.len() >= MAX_DEVICES && !self.devices.contains_key(peer) {
            self.devices.retain(|_, l| !l.is_full());
            if self.devices.len() >= MAX_DEVICES {
                // Every remembered device is mid-burst: forget one (it gets
                // a fresh bucket, the bridge's still bounds the whole).
                if let Some(k) = self.devices.keys().next().copied() {
                    self.devices.remove(&k);
                }
            }
        }
        let device = self.devices.entry(*peer).or_insert_with(|| Limiter::new(DEVICE_BURST, DEVICE_EVERY));
        if device.take().is_none() {
            return Err(Held::Device(device.held()));
        }
        if self.bridge.take().is_none() {
            // The device's token is given back: the bridge held this one.
            device.tokens += 1;
            return Err(Held::Bridge(self.bridge.held()));
        }
        Ok(())
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

    fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[tokio::test(start_paused = true)]
    async fn a_device_has_one_budget_across_its_sessions_and_the_bridge_one_for_all() {
        let mut b = Budgets::default();
        let (a, c) = (id(1), id(2));
        for _ in 0..DEVICE_BURST {
            assert_eq!(b.take(&a), Ok(()));
        }
        assert_eq!(b.take(&a), Err(Held::Device(1)));
        assert_eq!(b.take(&a), Err(Held::Device(2)));
        assert_eq!(b.take(&c), Ok(()), "another device has its own");
        tokio::time::advance(DEVICE_EVERY).await;
        assert_eq!(b.take(&a), Ok(()));
        assert_eq!(b.take(&a), Err(Held::Device(1)));

        // The bridge's bucket bounds every device together.
        let mut b = Budgets::default();
        let mut sent = 0;
        for n in 0..=255u8 {
            if b.take(&id(n)).is_ok() {
                sent += 1;
            }
        }
        assert_eq!(sent, BRIDGE_BURST);
        assert_eq!(b.take(&id(7)), Err(Held::Bridge(256 - BRIDGE_BURST as u64 + 1)));
        tokio::time::advance(BRIDGE_EVERY).await;
        assert_eq!(b.take(&id(7)), Ok(()), "the device's token was given back while the bridge held it");
    }
}
