//! The pre-handshake gate: decides, before any crypto is spent, whether an
//! incoming connection gets a handshake at all.
//!
//! Two budgets, both checked on the `Incoming` (cheap, no TLS yet):
//! - per remote: at most `per_remote_max` connections in any sliding
//!   `window`, keyed by the remote's claimed EndpointId when it arrives through
//!   a relay (the relay tells us who it forwards for), else by its IP. The key
//!   table holds at most `max_keys` entries; the least recently seen is evicted.
//! - global: at most `max_handshakes` handshakes in flight. An attacker minting
//!   a fresh identity per connection defeats the per-remote budget; this cap is
//!   the CPU backstop that holds regardless of identity.
//!
//! Over either limit the connection is dropped with `Incoming::ignore` (no
//! answer at all: the cheapest response to a flood).
//!
//! Stalled handshakes (a dial that sends its first packet and then nothing)
//! cannot lock allowed peers out:
//! - when every slot is taken, the oldest handshake that has run for at least
//!   [`EVICT_MIN_AGE`] gives its slot to the newcomer ([`HandshakeSlot::evicted`]
//!   fires for it): slots turn over at the attacker's own rate instead of once
//!   per handshake timeout;
//! - when every slot is taken and none is old enough, the caller answers a
//!   newcomer whose address is not validated with a QUIC Retry rather than
//!   silence: a real client comes back validated one round trip later, a
//!   spoofed or stalled one never holds state. (Retrying earlier, under mere
//!   pressure, was measured: it cost every honest dial ~30 ms on loopback,
//!   7.6× an unloaded dial, where eviction alone kept it at 1.08×.)

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use iroh::EndpointId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::limits::{
    DROP_LOG_INTERVAL, EVICT_MIN_AGE, MAX_HANDSHAKES, MAX_KEYS, PER_REMOTE_MAX, PER_REMOTE_WINDOW,
};

/// Time source, injectable so tests never wait for real windows to pass.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Instant;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Who a connection is from, as far as we can tell before the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteKey {
    /// Claimed by the relay path (not yet proven; proven by the handshake later).
    Endpoint(EndpointId),
    Ip(IpAddr),
}

impl std::fmt::Display for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteKey::Endpoint(id) => write!(f, "endpoint {}", id.fmt_short()),
            RemoteKey::Ip(ip) => write!(f, "ip {ip}"),
        }
    }
}

/// Limits of the gate.
#[derive(Debug, Clone)]
pub struct GateLimits {
    pub per_remote_max: usize,
    pub window: Duration,
    pub max_keys: usize,
    pub max_handshakes: usize,
}

impl Default for GateLimits {
    fn default() -> Self {
        Self {
            per_remote_max: PER_REMOTE_MAX,
            window: PER_REMOTE_WINDOW,
            max_keys: MAX_KEYS,
            max_handshakes: MAX_HANDSHAKES,
        }
    }
}

/// Why the gate said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    RemoteBudget,
    HandshakeCap,
}

#[derive(Debug)]
struct Entry {
    hits: VecDeque<Instant>,
    seen: u64,
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<RemoteKey, Entry>,
    /// `seen` sequence → key, oldest first: the eviction order.
    order: BTreeMap<u64, RemoteKey>,
    seq: u64,
}

/// Counters for the drop log.
#[derive(Debug)]
struct DropLog {
    last: Option<Instant>,
    suppressed: u64,
}

/// A handshake in flight: when it started, how to evict it, and its slot.
#[derive(Debug)]
struct InFlight {
    started: Instant,
    evict: CancellationToken,
    permit: OwnedSemaphorePermit,
}

/// The gate. Shared as `Arc<Gate>`.
#[derive(Debug)]
pub struct Gate {
    limits: GateLimits,
    clock: Arc<dyn Clock>,
    table: Mutex<Table>,
    handshakes: Arc<Semaphore>,
    in_flight: Mutex<InFlightTable>,
    drop_log: Mutex<DropLog>,
}

#[derive(Debug, Default)]
struct InFlightTable {
    next_id: u64,
    slots: HashMap<u64, InFlight>,
}

/// One handshake slot, held until the handshake has finished (or failed).
/// Dropping it frees the slot.
#[derive(Debug)]
pub struct HandshakeSlot {
    gate: Arc<Gate>,
    id: u64,
    evict: CancellationToken,
    receipt: Receipt,
}

/// What a connection was charged to its remote's budget, to give back
/// ([`Gate::refund`]).
#[derive(Debug, Clone, Copy)]
pub struct Receipt {
    key: RemoteKey,
    at: Instant,
}

impl HandshakeSlot {
    /// What this connection cost its remote's budget.
    pub fn receipt(&self) -> Receipt {
        self.receipt
    }

    /// Resolves when the slot was given to a newer handshake: abandon this one.
    pub fn evicted(&self) -> WaitForCancellationFutureOwned {
        self.evict.clone().cancelled_owned()
    }
}

impl std::ops::Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.gate.in_flight.lock().unwrap_or_else(|p| p.into_inner()).slots.remove(&self.id);
    }
}

impl Gate {
    pub fn new(limits: GateLimits, clock: Arc<dyn Clock>) -> Self {
        Self {
            handshakes: Arc::new(Semaphore::new(limits.max_handshakes)),
            limits,
            clock,
            table: Mutex::new(Table::default()),
            in_flight: Mutex::new(InFlightTable::default()),
            drop_log: Mutex::new(DropLog { last: None, suppressed: 0 }),
        }
    }

    /// Admits a connection attempt to the handshake, or says why not. The
    /// slot must be held until the handshake has finished. When every slot is
    /// taken, the oldest handshake past [`EVICT_MIN_AGE`] is evicted for this one.
    pub fn admit(self: &Arc<Self>, key: RemoteKey) -> Result<HandshakeSlot, Drop> {
        let Some(at) = self.charge(key) else {
            return Err(Drop::RemoteBudget);
        };
        let now = self.clock.now();
        let mut table = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let permit = match self.handshakes.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let oldest = table
                    .slots
                    .iter()
                    .filter(|(_, s)| now.duration_since(s.started) >= EVICT_MIN_AGE)
                    .min_by_key(|(_, s)| s.started)
                    .map(|(id, _)| *id);
                let Some(victim) = oldest.and_then(|id| table.slots.remove(&id)) else {
                    return Err(Drop::HandshakeCap);
                };
                victim.evict.cancel();
                victim.permit
            }
        };
        table.next_id += 1;
        let id = table.next_id;
        let evict = CancellationToken::new();
        table.slots.insert(id, InFlight { started: now, evict: evict.clone(), permit });
        Ok(HandshakeSlot { gate: self.clone(), id, evict, receipt: Receipt { key, at } })
    }

    /// Gives a connection's charge back to its address once its handshake
    /// proved an allowed NodeId: an address is shared by every peer behind it
    /// (loopback, a NAT, a machine whose client dials once per prompt), so
    /// the budget is left for the strangers it is there against and a
    /// device's ordinary use never spends it. A relay path's key is the
    /// device's own claimed NodeId: its budget is its own and stays spent.
    pub fn refund(&self, receipt: Receipt) {
        if !matches!(receipt.key, RemoteKey::Ip(_)) {
            return;
        }
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = t.entries.get_mut(&receipt.key) {
            if let Some(i) = e.hits.iter().rposition(|h| *h == receipt.at) {
                e.hits.remove(i);
            }
        }
    }

    /// Handshakes in flight right now.
    pub fn handshakes_in_flight(&self) -> usize {
        self.limits.max_handshakes - self.handshakes.available_permits()
    }

    /// Records one attempt for `key` (when, if it was within its budget).
    /// Attempts over the budget are not recorded, so a remote that backs off
    /// gets back in once its old attempts leave the window.
    fn charge(&self, key: RemoteKey) -> Option<Instant> {
        let now = self.clock.now();
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.seq += 1;
        let seq = t.seq;
        let (allowed, old_seen) = {
            let entry = t.entries.entry(key).or_insert_with(|| Entry { hits: VecDeque::new(), seen: 0 });
            while entry.hits.front().is_some_and(|&h| now.duration_since(h) >= self.limits.window) {
                entry.hits.pop_front();
            }
            let allowed = entry.hits.len() < self.limits.per_remote_max;
            if allowed {
                entry.hits.push_back(now);
            }
            let old = entry.seen;
            entry.seen = seq;
            (allowed, old)
        };
        t.order.remove(&old_seen);
        t.order.insert(seq, key);
        while t.entries.len() > self.limits.max_keys {
            let Some((_, oldest)) = t.order.pop_first() else { break };
            t.entries.remove(&oldest);
        }
        allowed.then_some(now)
    }

    /// Number of remotes currently remembered.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.table.lock().unwrap().entries.len()
    }

    /// Whether to log a drop now; returns how many drops were not logged since
    /// the last line. Keeps a flood from flooding the log.
    pub fn should_log_drop(&self) -> Option<u64> {
        let now = self.clock.now();
        let mut l = self.drop_log.lock().unwrap_or_else(|p| p.into_inner());
        match l.last {
            Some(last) if now.duration_since(last) < DROP_LOG_INTERVAL => {
                l.suppressed += 1;
                None
            }
            _ => {
                l.last = Some(now);
                Some(std::mem::take(&mut l.suppressed))
            }
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A clock tests move by hand.
    #[derive(Debug)]
    pub struct ManualClock(Mutex<Instant>);

    impl ManualClock {
        pub fn new() -> Arc<Self> {
            Arc::new(Self(Mutex::new(Instant::now())))
        }
        pub fn advance(&self, d: Duration) {
            *self.0.lock().unwrap() += d;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
    }

    fn key(n: u8) -> RemoteKey {
        RemoteKey::Endpoint(iroh::SecretKey::from_bytes(&[n; 32]).public())
    }

    #[test]
    fn an_allowed_devices_dial_gives_its_address_budget_back_a_relay_keys_does_not() {
        let clock = ManualClock::new();
        let limits = GateLimits { per_remote_max: 2, ..GateLimits::default() };
        let gate = Arc::new(Gate::new(limits, clock.clone()));
        let ip = RemoteKey::Ip(std::net::Ipv4Addr::LOCALHOST.into());
        // Thirty dials in one window, each admitted and given back: none is dropped.
        for _ in 0..30 {
            let slot = gate.admit(ip).expect("an allowed device is never over the budget");
            gate.refund(slot.receipt());
            clock.advance(Duration::from_millis(10));
        }
        // Strangers at the same address still spend it.
        let _a = gate.admit(ip).unwrap();
        let _b = gate.admit(ip).unwrap();
        assert_eq!(gate.admit(ip).unwrap_err(), Drop::RemoteBudget);
        // A relay path's key is the device's own: its budget stays spent.
        for _ in 0..2 {
            let slot = gate.admit(key(9)).unwrap();
            gate.refund(slot.receipt());
        }
        assert_eq!(gate.admit(key(9)).unwrap_err(), Drop::RemoteBudget);
    }

    #[test]
    fn sliding_window_per_remote() {
        let clock = ManualClock::new();
        let gate =
            Arc::new(Gate::new(GateLimits { max_handshakes: 100, ..Default::default() }, clock.clone()));
        for _ in 0..10 {
            drop(gate.admit(key(1)).unwrap());
            clock.advance(Duration::from_millis(500));
        }
        // 10 in the last 5 s: the 11th is dropped, another remote is not.
        assert_eq!(gate.admit(key(1)).unwrap_err(), Drop::RemoteBudget);
        assert!(gate.admit(key(2)).is_ok());
        // The window slides: after the first attempt ages out, one more fits.
        clock.advance(Duration::from_millis(5000));
        assert!(gate.admit(key(1)).is_ok());
        assert_eq!(gate.admit(key(1)).unwrap_err(), Drop::RemoteBudget);
        // IPs are keys too.
        let ip = RemoteKey::Ip("192.0.2.1".parse().unwrap());
        assert!(gate.admit(ip).is_ok());
    }

    #[test]
    fn handshake_cap_is_global() {
        let gate =
            Arc::new(Gate::new(GateLimits { max_handshakes: 2, ..Default::default() }, ManualClock::new()));
        let a = gate.admit(key(1)).unwrap();
        let _b = gate.admit(key(2)).unwrap();
        assert_eq!(gate.admit(key(3)).unwrap_err(), Drop::HandshakeCap);
        assert_eq!(gate.handshakes_in_flight(), 2);
        drop(a);
        assert!(gate.admit(key(3)).is_ok());
    }

    #[tokio::test]
    async fn stalled_handshakes_give_their_slot_to_newcomers() {
        use futures::FutureExt;
        let clock = ManualClock::new();
        let gate = Arc::new(Gate::new(GateLimits { max_handshakes: 2, ..Default::default() }, clock.clone()));
        let old = gate.admit(key(1)).unwrap();
        clock.advance(Duration::from_millis(100));
        let young = gate.admit(key(2)).unwrap();
        // Full, and nobody old enough to evict: the newcomer is dropped.
        assert_eq!(gate.admit(key(3)).unwrap_err(), Drop::HandshakeCap);
        clock.advance(EVICT_MIN_AGE - Duration::from_millis(100));
        let newcomer = gate.admit(key(3)).unwrap();
        // The oldest one was evicted for it, and is told so; the cap still holds.
        assert!(old.evicted().now_or_never().is_some(), "the oldest handshake is told to stop");
        assert!(young.evicted().now_or_never().is_none());
        assert_eq!(gate.handshakes_in_flight(), 2);
        drop(old);
        assert_eq!(gate.handshakes_in_flight(), 2, "the evicted slot now belongs to the newcomer");
        assert_eq!(
            gate.admit(key(4)).unwrap_err(),
            Drop::HandshakeCap,
            "both holders are under the minimum age"
        );
        drop(newcomer);
        drop(young);
        assert_eq!(gate.handshakes_in_flight(), 0);
    }

    #[test]
    fn key_table_is_capped_lru() {
        let clock = ManualClock::new();
        let limits = GateLimits { max_keys: 3, per_remote_max: 1, max_handshakes: 100, ..Default::default() };
        let gate = Arc::new(Gate::new(limits, clock));
        for n in 1..=3 {
            drop(gate.admit(key(n)));
        }
        // Touch 1 so 2 is the least recently seen, then add 4: 2 is evicted.
        assert!(gate.admit(key(1)).is_err());
        drop(gate.admit(key(4)));
        assert_eq!(gate.keys(), 3);
        // 2 was forgotten: it gets a fresh budget (and evicts 3, now the oldest).
        assert!(gate.admit(key(2)).is_ok());
        assert_eq!(gate.keys(), 3);
        // 1 was seen more recently than 3, so it is still remembered and over budget.
        assert!(gate.admit(key(1)).is_err());
        assert!(gate.admit(key(3)).is_ok(), "3 was evicted, so it starts afresh");
    }

    #[test]
    fn drop_log_is_throttled() {
        let clock = ManualClock::new();
        let gate = Gate::new(GateLimits::default(), clock.clone());
        assert_eq!(gate.should_log_drop(), Some(0));
        for _ in 0..100 {
            assert_eq!(gate.should_log_drop(), None);
        }
        clock.advance(DROP_LOG_INTERVAL);
        assert_eq!(gate.should_log_drop(), Some(100));
    }
}
