//! The pre-handshake gate: decides, before any crypto is spent, whether an
//! incoming connection gets a handshake at all, and after the handshake, who
//! pays for it.
//!
//! Three budgets:
//! - per remote, checked on the `Incoming` (cheap, no TLS yet): at most
//!   `per_remote_max` connections in any sliding `window`, keyed by the
//!   remote's claimed EndpointId when it arrives through a relay (the relay
//!   tells us who it forwards for), else by its IP. The key table holds at
//!   most `max_keys` entries; the least recently seen is evicted.
//! - global: at most `max_handshakes` handshakes in flight. An attacker minting
//!   a fresh identity per connection defeats the per-remote budget; this cap is
//!   the CPU backstop that holds regardless of identity.
//! - per device, once the handshake proved an allowed NodeId ([`Gate::proved`]):
//!   at most [`PER_DEVICE_MAX`] connections admitted in any `window`; past it
//!   the caller refuses the connection (`bridge at capacity`).
//!
//! Over the first two the connection is dropped with `Incoming::ignore` (no
//! answer at all: the cheapest response to a flood), but for the two cases
//! below that answer with a QUIC Retry.
//!
//! Who pays for a dial. Before its handshake a direct dial is known only by
//! its IP, which it shares with whoever else is behind it (loopback, a NAT):
//! nothing before the handshake tells an allowed device from a stranger at
//! its address, so any budget the address has there a stranger can spend, and
//! with it lock the device's direct dials out for the window. Hence:
//! - a dial whose handshake proves an allowed device within its budget is
//!   given back to its address ([`Gate::proved`]): a device's own use never
//!   spends its neighbours' budget, and a device in a loop meets its own;
//! - its address is remembered as proven ([`PROVEN_ADDRESS_TTL`], at most
//!   [`MAX_PROVEN_ADDRESSES`]: a table of its own that only allowed devices'
//!   handshakes fill, so strangers cannot evict it). Past its budget, a dial
//!   from a proven address is not dropped: it is asked to validate its
//!   address (a QUIC Retry, one stateless packet: a spoofed source gets no
//!   further and costs no crypto) and then gets a handshake like any other,
//!   within the handshake cap. The handshake tells the device from the
//!   stranger: the device is admitted against its own budget, the stranger
//!   refused `not allowlisted`. The price: a stranger behind a proven address
//!   gets handshakes past that address's budget, as many as a stranger who
//!   mints a fresh NodeId per dial gets through a relay; the handshake cap is
//!   the backstop for both. (The alternatives keep the lockout: a second,
//!   larger budget for proven addresses is spent by the same stranger, and a
//!   Retry alone proves an address, not who is behind it.)
//! - a relay path's key is the dialer's own NodeId (the relay checked it):
//!   nobody else spends it, so nothing is given back there and it has no
//!   overflow; the device budget applies after its handshake all the same.
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
    hash::Hash,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use iroh::EndpointId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::limits::{
    DROP_LOG_INTERVAL, EVICT_MIN_AGE, MAX_HANDSHAKES, MAX_KEYS, MAX_PROVEN_ADDRESSES, PER_DEVICE_MAX,
    PER_REMOTE_MAX, PER_REMOTE_WINDOW, PROVEN_ADDRESS_TTL,
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
    /// The sliding window of both the per-remote and the per-device budget.
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
    /// Over its remote's budget: dropped unanswered.
    RemoteBudget,
    /// Every handshake slot is taken, none old enough to give way.
    HandshakeCap,
    /// Over its address's budget, at an address an allowed device dialed
    /// from lately, and the address is not validated yet: answer with a QUIC
    /// Retry; validated, the dial gets its handshake.
    Unvalidated,
}

/// An allowed device over its own budget ([`PER_DEVICE_MAX`] per window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverDeviceBudget {
    pub max: usize,
    pub window: Duration,
}

impl std::fmt::Display for OverDeviceBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "over its device budget of {} connections per {:?}", self.max, self.window)
    }
}

/// At most `cap` entries; [`Lru::touch`] makes one the most recent, and a new
/// one evicts the least recently touched.
#[derive(Debug)]
struct Lru<K, V> {
    entries: HashMap<K, (V, u64)>,
    /// Touch sequence → key, oldest first: the eviction order.
    order: BTreeMap<u64, K>,
    seq: u64,
    cap: usize,
}

impl<K: Copy + Eq + Hash, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Self { entries: HashMap::new(), order: BTreeMap::new(), seq: 0, cap: cap.max(1) }
    }

    /// `key`'s value (made by `new` if it had none), now the most recent.
    fn touch(&mut self, key: K, new: impl FnOnce() -> V) -> &mut V {
        self.seq += 1;
        let seq = self.seq;
        match self.entries.get_mut(&key) {
            Some(e) => {
                self.order.remove(&e.1);
                e.1 = seq;
            }
            None => {
                while self.entries.len() >= self.cap {
                    let Some((_, oldest)) = self.order.pop_first() else { break };
                    self.entries.remove(&oldest);
                }
                self.entries.insert(key, (new(), seq));
            }
        }
        self.order.insert(seq, key);
        &mut self.entries.get_mut(&key).expect("just touched").0
    }

    /// `key`'s value, its place in the order unchanged.
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key).map(|e| &mut e.0)
    }
}

/// Records a hit at `now` in a sliding `window` if fewer than `max` are in it.
/// Hits over the budget are not recorded, so a dialer that backs off gets
/// back in once its old hits leave the window.
fn spend(hits: &mut VecDeque<Instant>, now: Instant, window: Duration, max: usize) -> bool {
    while hits.front().is_some_and(|&h| now.duration_since(h) >= window) {
        hits.pop_front();
    }
    let within = hits.len() < max;
    if within {
        hits.push_back(now);
    }
    within
}

#[derive(Debug)]
struct Tables {
    /// Per remote (before the handshake): its hits in the window.
    remotes: Lru<RemoteKey, VecDeque<Instant>>,
    /// Per allowed device (after the handshake): its admissions in the window.
    devices: Lru<EndpointId, VecDeque<Instant>>,
    /// Addresses an allowed device's handshake came from, and when last.
    proven: Lru<IpAddr, Instant>,
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
    tables: Mutex<Tables>,
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

/// What a connection was charged to its remote's budget, for [`Gate::proved`]
/// to give back.
#[derive(Debug, Clone, Copy)]
pub struct Receipt {
    key: RemoteKey,
    /// When it was charged; `None` when it came past its address's budget
    /// (a proven address's overflow): there is nothing to give back.
    at: Option<Instant>,
}

impl Receipt {
    /// Whether this connection got its handshake past its address's budget,
    /// because an allowed device dialed from that address lately.
    pub fn past_budget(&self) -> bool {
        self.at.is_none()
    }
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
            tables: Mutex::new(Tables {
                remotes: Lru::new(limits.max_keys),
                // Only allowed devices are entered: as many as the trust lists hold.
                devices: Lru::new(limits.max_keys),
                proven: Lru::new(MAX_PROVEN_ADDRESSES),
            }),
            limits,
            clock,
            in_flight: Mutex::new(InFlightTable::default()),
            drop_log: Mutex::new(DropLog { last: None, suppressed: 0 }),
        }
    }

    /// Admits a connection attempt to the handshake, or says why not.
    /// `validated`: its source address is proven (it came back after a QUIC
    /// Retry). The slot must be held until the handshake has finished. When
    /// every slot is taken, the oldest handshake past [`EVICT_MIN_AGE`] is
    /// evicted for this one.
    pub fn admit(self: &Arc<Self>, key: RemoteKey, validated: bool) -> Result<HandshakeSlot, Drop> {
        let at = self.charge(key, validated)?;
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

    /// The handshake of the connection `receipt` is for proved `peer`, a
    /// device the bridge allows. Charges the device's own budget; within it,
    /// gives the dial back to its address (shared with whoever is behind it,
    /// the strangers it is there against). Either way the address is
    /// remembered as one an allowed device dials from, so strangers spending
    /// its budget cannot keep the device out ([module docs](self)).
    pub fn proved(&self, peer: EndpointId, receipt: Receipt) -> Result<(), OverDeviceBudget> {
        let now = self.clock.now();
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let RemoteKey::Ip(ip) = receipt.key {
            *t.proven.touch(ip, || now) = now;
        }
        let window = self.limits.window;
        if !spend(t.devices.touch(peer, VecDeque::new), now, window, PER_DEVICE_MAX) {
            return Err(OverDeviceBudget { max: PER_DEVICE_MAX, window });
        }
        // A relay path's key is the device's own NodeId: its budget stays spent.
        if let (RemoteKey::Ip(_), Some(at)) = (receipt.key, receipt.at) {
            if let Some(hits) = t.remotes.get_mut(&receipt.key) {
                if let Some(i) = hits.iter().rposition(|h| *h == at) {
                    hits.remove(i);
                }
            }
        }
        Ok(())
    }

    /// Handshakes in flight right now.
    pub fn handshakes_in_flight(&self) -> usize {
        self.limits.max_handshakes - self.handshakes.available_permits()
    }

    /// Charges one attempt to `key`'s budget: `Some(when)` if within it,
    /// `None` if past it at a proven address (validated), else why not.
    fn charge(&self, key: RemoteKey, validated: bool) -> Result<Option<Instant>, Drop> {
        let now = self.clock.now();
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let hits = t.remotes.touch(key, VecDeque::new);
        if spend(hits, now, self.limits.window, self.limits.per_remote_max) {
            return Ok(Some(now));
        }
        let RemoteKey::Ip(ip) = key else { return Err(Drop::RemoteBudget) };
        let proven = t.proven.get_mut(&ip).is_some_and(|last| now.duration_since(*last) < PROVEN_ADDRESS_TTL);
        match (proven, validated) {
            (false, _) => Err(Drop::RemoteBudget),
            (true, false) => Err(Drop::Unvalidated),
            (true, true) => Ok(None),
        }
    }

    /// Number of remotes currently remembered.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.tables.lock().unwrap().remotes.entries.len()
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

    fn ip(s: &str) -> RemoteKey {
        RemoteKey::Ip(s.parse().unwrap())
    }

    fn device(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    /// One dial whose handshake proves `peer`, an allowed device: the gate's
    /// answer before the handshake, then its answer after.
    fn dial_as(
        gate: &Arc<Gate>,
        from: RemoteKey,
        validated: bool,
        peer: EndpointId,
    ) -> Result<Result<(), OverDeviceBudget>, Drop> {
        let slot = gate.admit(from, validated)?;
        Ok(gate.proved(peer, slot.receipt()))
    }

    #[test]
    fn an_allowed_device_pays_its_own_budget_and_is_refused_past_it() {
        let clock = ManualClock::new();
        let limits = GateLimits { per_remote_max: 2, max_handshakes: 100, ..GateLimits::default() };
        let gate = Arc::new(Gate::new(limits.clone(), clock.clone()));
        let home = ip("192.0.2.7");
        let over = OverDeviceBudget { max: PER_DEVICE_MAX, window: limits.window };
        // Its whole budget in one window, from an address whose own budget is
        // 2: each dial is given back to the address.
        for i in 0..PER_DEVICE_MAX {
            assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Ok(())), "dial {i}");
            clock.advance(Duration::from_millis(10));
        }
        // Past it: refused after its handshake (before, every dial was
        // admitted and given back: no bound at all).
        assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Err(over)));
        // Through a relay it is the same device, with the same budget.
        assert_eq!(dial_as(&gate, RemoteKey::Endpoint(device(1)), false, device(1)), Ok(Err(over)));
        // Another device at the same address has a budget of its own.
        assert_eq!(dial_as(&gate, home, false, device(2)), Ok(Ok(())));
        // The window slides: once its first dial ages out, one more fits.
        clock.advance(limits.window - Duration::from_millis(10 * PER_DEVICE_MAX as u64));
        assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Ok(())));
        assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Err(over)));
    }

    #[test]
    fn strangers_spending_an_address_budget_do_not_keep_out_the_device_that_dials_from_it() {
        let clock = ManualClock::new();
        let limits = GateLimits { per_remote_max: 3, max_handshakes: 100, ..GateLimits::default() };
        let gate = Arc::new(Gate::new(limits, clock.clone()));
        let home = ip("192.0.2.7");
        // The device dials from its address once: the address is proven.
        assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Ok(())));
        // A stranger behind the same address spends its budget (its
        // handshakes prove nobody allowed: nothing is given back).
        for _ in 0..3 {
            drop(gate.admit(home, false).unwrap());
        }
        // The device's next dial is asked to validate its address, not
        // dropped (before: dropped unanswered for the whole window); validated,
        // it gets its handshake, which proves it.
        assert_eq!(gate.admit(home, false).unwrap_err(), Drop::Unvalidated);
        assert_eq!(dial_as(&gate, home, true, device(1)), Ok(Ok(())));
        // The stranger's validated dials get handshakes too (and are refused
        // after them, `not allowlisted`): nothing before the handshake tells
        // the two apart.
        assert!(gate.admit(home, true).is_ok());
        // An address no allowed device dialed from keeps its budget, validated or not.
        let elsewhere = ip("198.51.100.9");
        for _ in 0..3 {
            drop(gate.admit(elsewhere, false).unwrap());
        }
        assert_eq!(gate.admit(elsewhere, false).unwrap_err(), Drop::RemoteBudget);
        assert_eq!(gate.admit(elsewhere, true).unwrap_err(), Drop::RemoteBudget);
        // A relay path's key is the dialer's own NodeId: no overflow there,
        // even for an allowed device, and its charges stay spent.
        let relayed = RemoteKey::Endpoint(device(1));
        for _ in 0..3 {
            assert_eq!(dial_as(&gate, relayed, true, device(1)), Ok(Ok(())));
        }
        assert_eq!(gate.admit(relayed, true).unwrap_err(), Drop::RemoteBudget);
    }

    #[test]
    fn a_proven_address_is_forgotten_after_its_time_and_never_by_strangers() {
        let clock = ManualClock::new();
        let limits =
            GateLimits { per_remote_max: 1, max_keys: 3, max_handshakes: 100, ..GateLimits::default() };
        let gate = Arc::new(Gate::new(limits.clone(), clock.clone()));
        let home = ip("192.0.2.7");
        assert_eq!(dial_as(&gate, home, false, device(1)), Ok(Ok(())));
        // Strangers push the address out of the (3-key) remote table: it is
        // still remembered as proven, a table only allowed devices fill.
        for n in 10..20 {
            drop(gate.admit(key(n), false));
        }
        assert_eq!(gate.keys(), 3);
        clock.advance(PROVEN_ADDRESS_TTL - Duration::from_secs(1));
        drop(gate.admit(home, false).unwrap());
        assert!(gate.admit(home, true).is_ok(), "still proven a second before its time");
        // Its time is up: the budget holds again.
        clock.advance(Duration::from_secs(1));
        assert_eq!(gate.admit(home, true).unwrap_err(), Drop::RemoteBudget);
        // A new proof opens it again, and each device's proof counts, even
        // one over its own budget (its address is its address).
        let _ = gate.proved(device(1), Receipt { key: home, at: None });
        assert!(gate.admit(home, true).is_ok());
        // At most MAX_PROVEN_ADDRESSES are remembered: the least recently proven goes.
        for n in 0..MAX_PROVEN_ADDRESSES as u32 {
            let other =
                RemoteKey::Ip(std::net::Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(n)).into());
            let _ = gate.proved(device(2), Receipt { key: other, at: None });
        }
        assert_eq!(gate.admit(home, true).unwrap_err(), Drop::RemoteBudget);
    }

    #[test]
    fn sliding_window_per_remote() {
        let clock = ManualClock::new();
        let gate =
            Arc::new(Gate::new(GateLimits { max_handshakes: 100, ..Default::default() }, clock.clone()));
        for _ in 0..10 {
            drop(gate.admit(key(1), false).unwrap());
            clock.advance(Duration::from_millis(500));
        }
        // 10 in the last 5 s: the 11th is dropped, another remote is not.
        assert_eq!(gate.admit(key(1), false).unwrap_err(), Drop::RemoteBudget);
        assert!(gate.admit(key(2), false).is_ok());
        // The window slides: after the first attempt ages out, one more fits.
        clock.advance(Duration::from_millis(5000));
        assert!(gate.admit(key(1), false).is_ok());
        assert_eq!(gate.admit(key(1), false).unwrap_err(), Drop::RemoteBudget);
        // IPs are keys too.
        let ip = RemoteKey::Ip("192.0.2.1".parse().unwrap());
        assert!(gate.admit(ip, false).is_ok());
    }

    #[test]
    fn handshake_cap_is_global() {
        let gate =
            Arc::new(Gate::new(GateLimits { max_handshakes: 2, ..Default::default() }, ManualClock::new()));
        let a = gate.admit(key(1), false).unwrap();
        let _b = gate.admit(key(2), false).unwrap();
        assert_eq!(gate.admit(key(3), false).unwrap_err(), Drop::HandshakeCap);
        assert_eq!(gate.handshakes_in_flight(), 2);
        drop(a);
        assert!(gate.admit(key(3), false).is_ok());
    }

    #[tokio::test]
    async fn stalled_handshakes_give_their_slot_to_newcomers() {
        use futures::FutureExt;
        let clock = ManualClock::new();
        let gate = Arc::new(Gate::new(GateLimits { max_handshakes: 2, ..Default::default() }, clock.clone()));
        let old = gate.admit(key(1), false).unwrap();
        clock.advance(Duration::from_millis(100));
        let young = gate.admit(key(2), false).unwrap();
        // Full, and nobody old enough to evict: the newcomer is dropped.
        assert_eq!(gate.admit(key(3), false).unwrap_err(), Drop::HandshakeCap);
        clock.advance(EVICT_MIN_AGE - Duration::from_millis(100));
        let newcomer = gate.admit(key(3), false).unwrap();
        // The oldest one was evicted for it, and is told so; the cap still holds.
        assert!(old.evicted().now_or_never().is_some(), "the oldest handshake is told to stop");
        assert!(young.evicted().now_or_never().is_none());
        assert_eq!(gate.handshakes_in_flight(), 2);
        drop(old);
        assert_eq!(gate.handshakes_in_flight(), 2, "the evicted slot now belongs to the newcomer");
        assert_eq!(
            gate.admit(key(4), false).unwrap_err(),
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
            drop(gate.admit(key(n), false));
        }
        // Touch 1 so 2 is the least recently seen, then add 4: 2 is evicted.
        assert!(gate.admit(key(1), false).is_err());
        drop(gate.admit(key(4), false));
        assert_eq!(gate.keys(), 3);
        // 2 was forgotten: it gets a fresh budget (and evicts 3, now the oldest).
        assert!(gate.admit(key(2), false).is_ok());
        assert_eq!(gate.keys(), 3);
        // 1 was seen more recently than 3, so it is still remembered and over budget.
        assert!(gate.admit(key(1), false).is_err());
        assert!(gate.admit(key(3), false).is_ok(), "3 was evicted, so it starts afresh");
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
