//! One-time pairing codes (`thunderbolt iroh pair`): minted here, redeemed by
//! the bridge when a device dials with one (the wire is in
//! [`thunderbolt_shared::pairing`]).
//!
//! A code is 128 random bits. Only its SHA-256 is kept (`iroh/pairings.json`,
//! 0600), with what it is for (an agent of the host, or a protocol's
//! single-agent bridge), the name to give the device, and when it expires.
//! Redeeming one spends it. Every wrong code counts against the agent it was
//! tried at: [`MAX_WRONG_TRIES`] in a row burn every code pending for it.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thunderbolt_shared::pairing as wire;

use crate::{
    devices::now_ms,
    home::{self, Home},
};

/// Wrong codes tried at one agent before its pending codes are burned. A
/// person mistyping gets a few tries; guessing 128 bits was never possible,
/// and this caps the noise of trying.
pub const MAX_WRONG_TRIES: u32 = 5;

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
    /// What it pairs with: an agent's name, or a protocol (a single-agent bridge).
    target: String,
    /// The name the device gets (else the one it sends).
    name: Option<String>,
    created_ms: u64,
    expires_ms: u64,
    spent_ms: Option<u64>,
    burned: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Store {
    codes: Vec<Entry>,
    /// Wrong codes tried in a row, per target.
    wrong: std::collections::BTreeMap<String, u32>,
}

/// What redeeming a code gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redeemed {
    /// Spent now: the device may be added, under this name if one was given at minting.
    Paired { name: Option<String> },
    /// Refused, with the close reason.
    Refused(&'static str),
}

/// What a code minted for a host's agent names.
pub fn agent_target(name: &str) -> String {
    format!("agent:{name}")
}

/// What a code minted for a protocol's single-agent bridge names.
pub fn bridge_target(protocol: &str) -> String {
    format!("bridge:{protocol}")
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

    /// A new code for `target`, valid for `valid`; returned once, kept only as its hash.
    pub fn mint(&self, target: &str, name: Option<String>, valid: Duration) -> std::io::Result<String> {
        let code = crate::serve::hub::random_hex(16);
        let now = now_ms();
        let entry = Entry {
            hash: hash(&code),
            target: target.to_string(),
            name,
            created_ms: now,
            expires_ms: now.saturating_add(valid.as_millis() as u64),
            spent_ms: None,
            burned: false,
        };
        home::edit_json(&self.path, |s: &mut Store| {
            prune(s, now);
            s.codes.push(entry);
        })?;
        Ok(code)
    }

    /// Redeems `code` at `target` (spending it when it pairs).
    pub fn redeem(&self, target: &str, code: &str) -> std::io::Result<Redeemed> {
        let h = hash(code);
        let now = now_ms();
        home::edit_json(&self.path, |s: &mut Store| {
            prune(s, now);
            let Some(i) = s.codes.iter().position(|e| constant_time_eq(e.hash.as_bytes(), h.as_bytes()))
            else {
                let wrong = s.wrong.entry(target.to_string()).or_insert(0);
                *wrong += 1;
                if *wrong >= MAX_WRONG_TRIES {
                    *wrong = 0;
                    for e in s.codes.iter_mut().filter(|e| e.target == target && e.spent_ms.is_none()) {
                        e.burned = true;
                    }
                }
                return Redeemed::Refused(wire::REASON_PAIR_WRONG);
            };
            let e = &mut s.codes[i];
            let verdict = if e.burned {
                Redeemed::Refused(wire::REASON_PAIR_BURNED)
            } else if e.spent_ms.is_some() {
                Redeemed::Refused(wire::REASON_PAIR_SPENT)
            } else if now >= e.expires_ms {
                Redeemed::Refused(wire::REASON_PAIR_EXPIRED)
            } else if e.target != target {
                Redeemed::Refused(wire::REASON_PAIR_OTHER_AGENT)
            } else {
                e.spent_ms = Some(now);
                Redeemed::Paired { name: e.name.clone() }
            };
            if matches!(verdict, Redeemed::Paired { .. }) {
                s.wrong.remove(target);
            }
            verdict
        })
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

    #[test]
    fn a_code_pairs_once_for_its_target_until_it_expires() {
        let (dir, p) = store();
        let code = p.mint("acp", Some("phone".into()), DEFAULT_EXPIRY).unwrap();
        assert_eq!(code.len(), 32, "128 bits");
        let text = std::fs::read_to_string(dir.path().join("iroh/pairings.json")).unwrap();
        assert!(!text.contains(&code), "only its hash is kept");
        assert_eq!(p.redeem("mcp", &code).unwrap(), Redeemed::Refused(wire::REASON_PAIR_OTHER_AGENT));
        assert_eq!(p.redeem("acp", &code).unwrap(), Redeemed::Paired { name: Some("phone".into()) });
        assert_eq!(p.redeem("acp", &code).unwrap(), Redeemed::Refused(wire::REASON_PAIR_SPENT));
        let old = p.mint("acp", None, Duration::from_millis(1)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(p.redeem("acp", &old).unwrap(), Redeemed::Refused(wire::REASON_PAIR_EXPIRED));
    }

    #[test]
    fn five_wrong_codes_burn_the_pending_ones() {
        let (_dir, p) = store();
        let code = p.mint("acp", None, DEFAULT_EXPIRY).unwrap();
        for _ in 0..MAX_WRONG_TRIES {
            assert_eq!(p.redeem("acp", "not-it").unwrap(), Redeemed::Refused(wire::REASON_PAIR_WRONG));
        }
        assert_eq!(p.redeem("acp", &code).unwrap(), Redeemed::Refused(wire::REASON_PAIR_BURNED));
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
