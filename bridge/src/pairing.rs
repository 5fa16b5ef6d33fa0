//! One-time pairing codes (`thunderbolt iroh pair`): minted here, redeemed by
//! the bridge when a device dials with one (the wire is in
//! [`thunderbolt_shared::pairing`]).
//!
//! A code is 128 random bits. Only its SHA-256 is kept (`iroh/pairings.json`,
//! 0600), with what it is for ([`Target`]: some agents of the host, every
//! agent that admits your own devices, or a protocol's single-agent bridge),
//! the name to give the device, and when it expires.
//! Redeeming one spends it. A wrong code writes nothing and counts against
//! the device (NodeId) that tried it, never against the agent or its codes:
//! past [`MAX_WRONG_TRIES`] that device waits ([`Throttle`]), so a stranger
//! dialing with guesses cannot burn the code a real device is about to use.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use iroh::EndpointId;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thunderbolt_shared::pairing as wire;

use crate::{
    devices::{
        now_ms,
        scope::{Scope, Verbs},
    },
    home::{self, Home},
};

/// Wrong codes one device may try before it has to wait. A person
/// mistyping gets a few tries; guessing 128 bits was never possible, and this
/// caps the noise of trying.
pub const MAX_WRONG_TRIES: u32 = 5;

/// The first wait past [`MAX_WRONG_TRIES`]; each further wrong try doubles
/// it, up to [`MAX_BACKOFF`]. Long enough that a loop of guesses costs the
/// bridge a log line a minute, short enough for a person to try again.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(30);

/// The longest wait.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// A device's wrong tries are forgotten after this long without one.
pub const WRONG_TRIES_FORGOTTEN: Duration = Duration::from_secs(3600);

/// Devices whose wrong tries are remembered at once (memory, not the file): a
/// stranger with endless NodeIds makes the oldest entries go, never the map grow.
pub const MAX_THROTTLED: usize = 1024;

/// How long a code is valid unless `--expires` says otherwise: long enough
/// to walk to the phone, short enough that a code in an old screenshot is dead.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(600);

/// How long a spent or expired code is remembered (to say so, rather than
/// "not recognised").
const REMEMBER: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    /// SHA-256 of the code, hex.
    hash: String,
    /// What it pairs with first ([`Target::key`]): the one place bridges
    /// before codes for several agents look.
    target: String,
    /// Where else it pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    also: Vec<String>,
    /// The name the device gets (else the one it sends).
    name: Option<String>,
    created_ms: u64,
    expires_ms: u64,
    spent_ms: Option<u64>,
    burned: bool,
    /// What the device may do once paired (none: everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<CodeScope>,
}

/// The scope a code grants: its verbs, and how long the device keeps them
/// from the moment it pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CodeScope {
    pub verbs: Verbs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_ms: Option<u64>,
    /// A share's: the moment it ends whenever it is redeemed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// A share's: the one session it lets the device join, and its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl CodeScope {
    /// The device's scope when it pairs at `now_ms`.
    fn at(&self, now_ms: u64) -> Scope {
        Scope {
            verbs: self.verbs,
            agents: self.agent.clone().map(|a| vec![a]),
            until_ms: self.until_ms.or(self.for_ms.map(|f| now_ms.saturating_add(f))),
            session: self.session.clone(),
        }
    }
}

/// `pairings.json`. (Older files also count wrong tries per agent; that is
/// no longer read.)
#[derive(Debug, Default, Serialize, Deserialize)]
struct Store {
    codes: Vec<Entry>,
}

/// What redeeming a code gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redeemed {
    /// Spent now: the device may be added, under this name if one was given
    /// at minting, to what the code was minted for.
    Paired { name: Option<String>, minted_for: Vec<Target>, scope: Option<Scope> },
    /// Valid, but the device holds everything it grants already: left unspent
    /// (another device may still use it).
    Unneeded,
    /// Refused, with the close reason.
    Refused(&'static str),
}

/// Where a code pairs, and so what it grants.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A protocol's single-agent bridge (`iroh pair` before codes for a
    /// whole host; a host's agent on that bridge's identity takes it too).
    Bridge(String),
    /// Any agent that admits your own devices: the device becomes one of
    /// them (the allow file). What a bare `iroh pair` mints, beside
    /// [`Target::Bridge`] for bridges that predate it.
    OwnDevices,
    /// One agent of the host, by its manifest's name: granted exactly.
    Agent(String),
}

impl Target {
    /// As kept in `pairings.json`.
    pub fn key(&self) -> String {
        match self {
            Target::Bridge(p) => format!("bridge:{p}"),
            Target::OwnDevices => "own-devices".into(),
            Target::Agent(n) => format!("agent:{n}"),
        }
    }

    /// Back from [`Target::key`]; `None` for a kind this bridge does not know.
    pub fn parse(key: &str) -> Option<Self> {
        match key.split_once(':') {
            Some(("bridge", p)) => Some(Target::Bridge(p.into())),
            Some(("agent", n)) => Some(Target::Agent(n.into())),
            None if key == "own-devices" => Some(Target::OwnDevices),
            _ => None,
        }
    }
}

fn hash(code: &str) -> String {
    hex::encode(Sha256::digest(code.trim().as_bytes()))
}

/// The codes of one home.
#[derive(Debug, Clone)]
pub struct Pairings {
    path: PathBuf,
}

impl Pairings {
    pub fn new(home: &Home) -> Self {
        Self { path: home.iroh_dir().join("pairings.json") }
    }

    /// A new code that pairs at any of `targets` (not empty), valid for
    /// `valid`; returned once, kept only as its hash.
    pub fn mint(&self, targets: &[Target], name: Option<String>, valid: Duration) -> std::io::Result<String> {
        self.mint_scoped(targets, name, valid, None)
    }

    /// [`Self::mint`] for a device that may do only what `scope` says.
    pub fn mint_scoped(
        &self,
        targets: &[Target],
        name: Option<String>,
        valid: Duration,
        scope: Option<CodeScope>,
    ) -> std::io::Result<String> {
        let Some((first, also)) = targets.split_first() else {
            return Err(std::io::Error::other("a pairing code must pair with something"));
        };
        let code = crate::ids::random_hex(16);
        let now = now_ms();
        let entry = Entry {
            hash: hash(&code),
            target: first.key(),
            also: also.iter().map(Target::key).collect(),
            name,
            created_ms: now,
            expires_ms: now.saturating_add(valid.as_millis() as u64),
            spent_ms: None,
            burned: false,
            scope,
        };
        home::edit_json(&self.path, |s: &mut Store| {
            prune(s, now);
            s.codes.push(entry);
        })?;
        Ok(code)
    }

    /// Redeems `code` at a place that takes any of `here`: spends it when it
    /// pairs and `wanted` (asked with what it was minted for) says it would
    /// grant the device something. A code that matches nothing writes nothing.
    pub fn redeem(
        &self,
        here: &[Target],
        code: &str,
        wanted: impl FnOnce(&[Target]) -> bool,
    ) -> std::io::Result<Redeemed> {
        let h = hash(code);
        let matches = |e: &Entry| constant_time_eq(e.hash.as_bytes(), h.as_bytes());
        let known = home::read_json::<Store>(&self.path)?.codes.iter().any(matches);
        if !known {
            return Ok(Redeemed::Refused(wire::REASON_PAIR_WRONG));
        }
        let now = now_ms();
        home::edit_json(&self.path, |s: &mut Store| {
            prune(s, now);
            let Some(e) = s.codes.iter_mut().find(|e| matches(e)) else {
                return Redeemed::Refused(wire::REASON_PAIR_WRONG);
            };
            let minted_for: Vec<Target> =
                std::iter::once(&e.target).chain(&e.also).filter_map(|k| Target::parse(k)).collect();
            if e.burned {
                Redeemed::Refused(wire::REASON_PAIR_BURNED)
            } else if e.spent_ms.is_some() {
                Redeemed::Refused(wire::REASON_PAIR_SPENT)
            } else if now >= e.expires_ms {
                Redeemed::Refused(wire::REASON_PAIR_EXPIRED)
            } else if !minted_for.iter().any(|t| here.contains(t)) {
                Redeemed::Refused(wire::REASON_PAIR_OTHER_AGENT)
            } else if !wanted(&minted_for) {
                Redeemed::Unneeded
            } else {
                e.spent_ms = Some(now);
                Redeemed::Paired {
                    name: e.name.clone(),
                    minted_for,
                    scope: e.scope.as_ref().map(|s| s.at(now)),
                }
            }
        })
    }
}

/// Wrong pairing codes per device, in memory: past [`MAX_WRONG_TRIES`] a
/// device waits [`FIRST_BACKOFF`], doubling per further wrong try. Time is
/// passed in, so tests need no clock.
#[derive(Debug, Default)]
pub struct Throttle {
    devices: HashMap<EndpointId, Tries>,
}

#[derive(Debug, Clone, Copy)]
struct Tries {
    wrong: u32,
    last: Instant,
    until: Option<Instant>,
}

impl Throttle {
    /// How long `peer` must still wait before a try counts, if it must.
    pub fn waiting(&mut self, peer: &EndpointId, now: Instant) -> Option<Duration> {
        let t = self.devices.get(peer)?;
        if now.saturating_duration_since(t.last) >= WRONG_TRIES_FORGOTTEN {
            self.devices.remove(peer);
            return None;
        }
        t.until.and_then(|u| u.checked_duration_since(now)).filter(|d| !d.is_zero())
    }

    /// `peer` tried a wrong code.
    pub fn wrong(&mut self, peer: &EndpointId, now: Instant) {
        if !self.devices.contains_key(peer) && self.devices.len() >= MAX_THROTTLED {
            if let Some(oldest) = self.devices.iter().min_by_key(|(_, t)| t.last).map(|(k, _)| *k) {
                self.devices.remove(&oldest);
            }
        }
        let t = self.devices.entry(*peer).or_insert(Tries { wrong: 0, last: now, until: None });
        if now.saturating_duration_since(t.last) >= WRONG_TRIES_FORGOTTEN {
            t.wrong = 0;
        }
        t.wrong += 1;
        t.last = now;
        if t.wrong >= MAX_WRONG_TRIES {
            let doublings = (t.wrong - MAX_WRONG_TRIES).min(16);
            let wait = FIRST_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF);
            t.until = Some(now + wait);
        }
    }

    /// `peer` paired: its wrong tries are forgotten.
    pub fn paired(&mut self, peer: &EndpointId) {
        self.devices.remove(peer);
    }
}

/// Drops what is no longer worth remembering.
fn prune(s: &mut Store, now: u64) {
    let keep = REMEMBER.as_millis() as u64;
    // Done when spent or expired; still pending ones are kept, of course.
    s.codes.retain(|e| {
        let done = e.spent_ms.map_or(e.expires_ms, |spent| spent.min(e.expires_ms));
        now.saturating_sub(done) < keep
    });
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `10m`, `1h`, `30s`, or plain seconds.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1),
        Some((i, 'm')) => (&t[..i], 60),
        Some((i, 'h')) => (&t[..i], 3600),
        Some((i, 'd')) => (&t[..i], 86_400),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("'{v}' is not a duration (e.g. 10m, 1h, 90s)"))?;
    if n == 0 {
        return Err("a pairing code must be valid for some time".into());
    }
    Ok(Duration::from_secs(n.saturating_mul(unit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Pairings) {
        let dir = tempfile::tempdir().unwrap();
        let p = Pairings::new(&Home::new(dir.path().to_path_buf()));
        (dir, p)
    }

    fn bridge(p: &str) -> Target {
        Target::Bridge(p.into())
    }

    fn paired(name: Option<&str>, minted_for: Vec<Target>) -> Redeemed {
        Redeemed::Paired { name: name.map(str::to_string), minted_for, scope: None }
    }

    #[test]
    fn a_code_pairs_once_for_its_target_until_it_expires() {
        let (dir, p) = store();
        let code = p.mint(&[bridge("acp")], Some("phone".into()), DEFAULT_EXPIRY).unwrap();
        assert_eq!(code.len(), 32, "128 bits");
        let text = std::fs::read_to_string(dir.path().join("iroh/pairings.json")).unwrap();
        assert!(!text.contains(&code), "only its hash is kept");
        assert_eq!(
            p.redeem(&[bridge("mcp")], &code, |_| true).unwrap(),
            Redeemed::Refused(wire::REASON_PAIR_OTHER_AGENT)
        );
        assert_eq!(
            p.redeem(&[bridge("mcp"), bridge("acp")], &code, |_| true).unwrap(),
            paired(Some("phone"), vec![bridge("acp")])
        );
        assert_eq!(
            p.redeem(&[bridge("acp")], &code, |_| true).unwrap(),
            Redeemed::Refused(wire::REASON_PAIR_SPENT)
        );
        let old = p.mint(&[bridge("acp")], None, Duration::from_millis(1)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            p.redeem(&[bridge("acp")], &old, |_| true).unwrap(),
            Redeemed::Refused(wire::REASON_PAIR_EXPIRED)
        );
    }

    #[test]
    fn a_code_for_several_places_pairs_at_any_of_them_once_and_only_when_it_grants_something() {
        let (_dir, p) = store();
        let (a, b, c) = (Target::Agent("a".into()), Target::Agent("b".into()), Target::Agent("c".into()));
        let code = p.mint(&[a.clone(), b.clone()], None, DEFAULT_EXPIRY).unwrap();
        assert_eq!(
            p.redeem(&[c], &code, |_| true).unwrap(),
            Redeemed::Refused(wire::REASON_PAIR_OTHER_AGENT)
        );
        // A device that holds all it grants leaves it for another.
        assert_eq!(p.redeem(std::slice::from_ref(&b), &code, |_| false).unwrap(), Redeemed::Unneeded);
        assert_eq!(
            p.redeem(std::slice::from_ref(&b), &code, |_| true).unwrap(),
            paired(None, vec![a.clone(), b.clone()])
        );
        assert_eq!(p.redeem(&[a], &code, |_| true).unwrap(), Redeemed::Refused(wire::REASON_PAIR_SPENT));
        // A whole host's code: at the bridge, or at any agent taking your own devices.
        let host = p.mint(&[bridge("acp"), Target::OwnDevices], None, DEFAULT_EXPIRY).unwrap();
        assert_eq!(
            p.redeem(&[b, Target::OwnDevices], &host, |_| true).unwrap(),
            paired(None, vec![bridge("acp"), Target::OwnDevices])
        );
        for t in [bridge("acp"), Target::OwnDevices, Target::Agent("x-1".into())] {
            assert_eq!(Target::parse(&t.key()), Some(t));
        }
        assert_eq!(Target::parse("later:kind"), None);
    }

    #[test]
    fn wrong_codes_write_nothing_and_burn_nothing() {
        let (dir, p) = store();
        let code = p.mint(&[bridge("acp")], None, DEFAULT_EXPIRY).unwrap();
        let path = dir.path().join("iroh/pairings.json");
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for _ in 0..MAX_WRONG_TRIES * 3 {
            assert_eq!(
                p.redeem(&[bridge("acp")], "not-it", |_| true).unwrap(),
                Redeemed::Refused(wire::REASON_PAIR_WRONG)
            );
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), before);
        assert!(matches!(p.redeem(&[bridge("acp")], &code, |_| true).unwrap(), Redeemed::Paired { .. }));
    }

    #[test]
    fn a_device_that_tries_wrong_codes_waits_longer_each_time_and_only_it() {
        let mut th = Throttle::default();
        let (a, b) =
            (iroh::SecretKey::from_bytes(&[1; 32]).public(), iroh::SecretKey::from_bytes(&[2; 32]).public());
        let t0 = Instant::now();
        for _ in 1..MAX_WRONG_TRIES {
            th.wrong(&a, t0);
            assert_eq!(th.waiting(&a, t0), None, "a few tries are free");
        }
        th.wrong(&a, t0);
        assert_eq!(th.waiting(&a, t0), Some(FIRST_BACKOFF));
        assert_eq!(th.waiting(&b, t0), None, "another device is not held back");
        let later = t0 + FIRST_BACKOFF;
        assert_eq!(th.waiting(&a, later), None);
        th.wrong(&a, later);
        assert_eq!(th.waiting(&a, later), Some(FIRST_BACKOFF * 2), "doubled");
        // Forgotten after an hour of quiet.
        let quiet = later + WRONG_TRIES_FORGOTTEN;
        assert_eq!(th.waiting(&a, quiet), None);
        th.wrong(&a, quiet);
        assert_eq!(th.waiting(&a, quiet), None, "counting starts again");
        th.paired(&a);
        // Bounded: endless NodeIds push the oldest out.
        for i in 0..(MAX_THROTTLED + 10) {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            th.wrong(&iroh::SecretKey::from_bytes(&k).public(), t0 + Duration::from_millis(i as u64));
        }
        assert!(th.devices.len() <= MAX_THROTTLED);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
