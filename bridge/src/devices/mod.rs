//! Devices: the peers a bridge knows by name, how and when each was added,
//! and when it was last seen.
//!
//! Kept in `iroh/devices.json`, beside the allow file and never inside it:
//! the reference tool compares each allow-file line whole, so a user who
//! switches back keeps every pairing. The allow file still decides who gets
//! in; this file only names them (`iroh list`, `status`, the log) and lets
//! `iroh deny` and `kick` take a name, and says what each may do once in
//! (its [`scope`]).

pub mod scope;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use iroh::EndpointId;
use serde::{Deserialize, Serialize};
use thunderbolt_shared::parse_node_id;
use tracing::{debug, error};

use self::scope::{Scope, Verbs};
use crate::home::{self, Home};

/// How long a share's guest is remembered after its share ended: a late
/// dial is told `device access expired` rather than taken for a stranger,
/// and then the entry goes.
pub const ENDED_SHARES_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How often a device's "last seen" is written: a device that reconnects
/// all day costs one write a minute, not one per connection.
pub const SEEN_EVERY: Duration = Duration::from_secs(60);

/// How a device came to be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum How {
    /// It paired with a one-time code (`iroh pair`).
    Pairing,
    /// `iroh allow`.
    Allow,
    /// The account lists it.
    Account,
    /// Someone else's device, let into one session by a share's one-time
    /// code (`thunderbolt share`): its scope names the session.
    Share,
}

impl std::fmt::Display for How {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            How::Pairing => "pairing",
            How::Allow => "iroh allow",
            How::Account => "account",
            How::Share => "a share of one session",
        })
    }
}

/// What is known of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: Option<String>,
    pub how: How,
    pub added_ms: u64,
    pub last_seen_ms: Option<u64>,
    /// The host's agents this device paired with by a code, each granting
    /// exactly that agent (the allow file, which every agent accepting your
    /// own devices trusts, is not written for them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// What it may do (none written: everything, as the owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// By NodeId (hex).
    devices: BTreeMap<String, Device>,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

/// Milliseconds since the epoch as RFC 3339 UTC (`2026-12-01T10:45:00Z`).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The devices of one home.
#[derive(Debug)]
pub struct Devices {
    path: PathBuf,
    last_seen_write: Mutex<HashMap<EndpointId, Instant>>,
    /// Who paired with which agent and what each may do, as of the file's
    /// stamp: trust asks this on every admission and recheck, so the file is
    /// read again only when it changed (one `stat` a check), as the allow
    /// file is.
    grants: Mutex<Option<(FileStamp, Arc<Grants>)>>,
}

/// What identifies a version of the file without reading it.
type FileStamp = Option<(u64, i64, i64, u64)>;

/// What the file grants, read once per version of it.
#[derive(Debug, Default)]
struct Grants {
    /// The agents each device paired with.
    agents: HashMap<EndpointId, Vec<String>>,
    /// The devices with a scope narrower than the owner's.
    scopes: HashMap<EndpointId, Scope>,
    /// The file exists but cannot be read: which devices are narrowed is
    /// unknown, so every device is taken as narrowed to nothing (a broken
    /// hand edit must not widen a watch-only device to the owner's reach).
    unreadable: bool,
}

impl Devices {
    pub fn new(home: &Home) -> Self {
        Self {
            path: home.iroh_dir().join("devices.json"),
            last_seen_write: Mutex::new(HashMap::new()),
            grants: Mutex::new(None),
        }
    }

    /// Where they are kept.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Every device (a missing or unreadable file is none; the latter is logged).
    pub fn all(&self) -> BTreeMap<EndpointId, Device> {
        self.read().unwrap_or_else(|e| {
            debug!("{e}");
            BTreeMap::new()
        })
    }

    /// Every device the file holds (none when there is no file); an error
    /// for a file that exists but cannot be read.
    fn read(&self) -> std::io::Result<BTreeMap<EndpointId, Device>> {
        let file: File = home::read_json(&self.path)?;
        Ok(file.devices.into_iter().filter_map(|(k, v)| Some((parse_node_id(&k).ok()?, v))).collect())
    }

    pub fn get(&self, id: &EndpointId) -> Option<Device> {
        self.all().remove(id)
    }

    pub fn name_of(&self, id: &EndpointId) -> Option<String> {
        self.get(id).and_then(|d| d.name)
    }

    /// The devices named `name` (compared without case).
    pub fn by_name(&self, name: &str) -> Vec<EndpointId> {
        self.all()
            .into_iter()
            .filter(|(_, d)| d.name.as_deref().is_some_and(|n| same_name(n, name)))
            .map(|(id, _)| id)
            .collect()
    }

    /// Which other device has `name` already (without case), if one does.
    pub fn name_taken(&self, name: &str, by_other_than: &EndpointId) -> Option<EndpointId> {
        self.by_name(name).into_iter().find(|id| id != by_other_than)
    }

    /// Notes `id` as added `how`, with `name` (keeping an earlier name when none is given).
    pub fn record(&self, id: &EndpointId, name: Option<String>, how: How) -> std::io::Result<()> {
        home::edit_json(&self.path, |f: &mut File| named(f, id, name, how).how = how)
    }

    /// `id` paired with the host's `agents` by a code: it may use those
    /// agents, and only them (unless the allow file or the account lists it).
    pub fn grant(&self, id: &EndpointId, name: Option<String>, agents: &[String]) -> std::io::Result<()> {
        home::edit_json(&self.path, |f: &mut File| {
            let d = named(f, id, name, How::Pairing);
            for agent in agents {
                if !d.agents.contains(agent) {
                    d.agents.push(agent.clone());
                }
            }
        })
    }

    /// Whether `id` paired with the host's agent `agent`.
    pub fn granted(&self, id: &EndpointId, agent: &str) -> bool {
        self.grants().agents.get(id).is_some_and(|agents| agents.iter().any(|a| a == agent))
    }

    /// What the file grants now (read again only when it changed).
    fn grants(&self) -> Arc<Grants> {
        use std::os::unix::fs::MetadataExt;
        let stamp: FileStamp =
            std::fs::metadata(&self.path).ok().map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()));
        let mut cache = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        match cache.as_ref() {
            Some((at, g)) if *at == stamp => g.clone(),
            _ => {
                let mut grants = Grants::default();
                let devices = self.read().unwrap_or_else(|e| {
                    error!("{e}: no device is admitted until it is fixed or removed (the scopes in it cannot be read)");
                    grants.unreadable = true;
                    BTreeMap::new()
                });
                for (id, d) in devices {
                    if let Some(s) = d.scope.filter(|s| !s.is_full()) {
                        grants.scopes.insert(id, s);
                    }
                    if !d.agents.is_empty() {
                        grants.agents.insert(id, d.agents);
                    }
                }
                let grants = Arc::new(grants);
                *cache = Some((stamp, grants.clone()));
                grants
            }
        }
    }

    /// What `id` may do (the owner's everything when no scope is written).
    pub fn scope_of(&self, id: &EndpointId) -> Scope {
        let g = self.grants();
        if g.unreadable {
            return Scope::none();
        }
        g.scopes.get(id).cloned().unwrap_or_else(Scope::full)
    }

    /// What `id` may do at `agent` now.
    pub fn verbs_at(&self, id: &EndpointId, agent: &str) -> Verbs {
        let g = self.grants();
        if g.unreadable {
            return Verbs::NONE;
        }
        match g.scopes.get(id) {
            None => Verbs::ALL,
            Some(s) => s.verbs_at(agent, now_ms()),
        }
    }

    /// Whether `id`'s scope has run out.
    pub fn expired(&self, id: &EndpointId) -> bool {
        self.grants().scopes.get(id).is_some_and(|s| s.expired(now_ms()))
    }

    /// The next moment a scope runs out after `after_ms`, if one does.
    pub fn next_expiry(&self, after_ms: u64) -> Option<u64> {
        self.grants().scopes.values().filter_map(|s| s.until_ms).filter(|u| *u > after_ms).min()
    }

    /// Forgets `id` if it is a share's guest (kicked, ended from a page):
    /// nothing admits it any more. Whether it was one.
    pub fn forget_share(&self, id: &EndpointId) -> std::io::Result<bool> {
        if self.grants().scopes.get(id).is_none_or(|s| s.session.is_none()) {
            return Ok(false);
        }
        self.forget(id).map(|()| true)
    }

    /// Forgets the shares' guests whose share ended more than
    /// [`ENDED_SHARES_KEPT`] ago (their entries would otherwise pile up, one
    /// per redeemed share). How many went; the file is written only then.
    pub fn forget_ended_shares(&self) -> usize {
        let long_ago = now_ms().saturating_sub(ENDED_SHARES_KEPT.as_millis() as u64);
        let ended = |s: &Scope| s.session.is_some() && s.expired(long_ago);
        if !self.grants().scopes.values().any(ended) {
            return 0;
        }
        let r = home::edit_json(&self.path, |f: &mut File| {
            let before = f.devices.len();
            f.devices.retain(|_, d| !(d.how == How::Share && d.scope.as_ref().is_some_and(ended)));
            before - f.devices.len()
        });
        r.unwrap_or_else(|e| {
            debug!("could not forget ended shares: {e}");
            0
        })
    }

    /// Writes `id`'s scope (`None`, or a full one: the owner's again). The
    /// device must be known already.
    pub fn set_scope(&self, id: &EndpointId, scope: Option<Scope>) -> std::io::Result<bool> {
        let scope = scope.filter(|s| !s.is_full());
        home::edit_json(&self.path, |f: &mut File| match f.devices.get_mut(&id.to_string()) {
            Some(d) => {
                d.scope = scope;
                true
            }
            None => false,
        })
    }

    /// Forgets `id` (it was denied).
    pub fn forget(&self, id: &EndpointId) -> std::io::Result<()> {
        home::edit_json(&self.path, |f: &mut File| {
            f.devices.remove(&id.to_string());
        })
    }

    /// `id` was admitted just now: its "last seen" is written, at most once
    /// per [`SEEN_EVERY`]; one never recorded is recorded as added `how`.
    pub fn seen(&self, id: &EndpointId, how: How) {
        {
            let mut last = self.last_seen_write.lock().unwrap_or_else(|p| p.into_inner());
            if last.get(id).is_some_and(|t| t.elapsed() < SEEN_EVERY) {
                return;
            }
            last.insert(*id, Instant::now());
        }
        let r = home::edit_json(&self.path, |f: &mut File| {
            let d = f.devices.entry(id.to_string()).or_insert_with(|| Device::new(how));
            d.last_seen_ms = Some(now_ms());
        });
        if let Err(e) = r {
            debug!("could not note that {} was seen: {e}", id.fmt_short());
        }
    }

    /// The NodeId a target names: a NodeId (hex, base32, a ticket) or a
    /// device name. A name two devices share (a file from before names were
    /// kept unique) names neither: acting on whichever sorts first could
    /// deny or kick the wrong device.
    pub fn resolve(&self, target: &str) -> Result<EndpointId, Unresolved> {
        if let Some(id) = resolve_id(target) {
            return Ok(id);
        }
        match self.by_name(target).as_slice() {
            [] => Err(Unresolved::Unknown),
            [id] => Ok(*id),
            many => Err(Unresolved::Ambiguous(many.to_vec())),
        }
    }
}

/// Why a target named no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    #[error("it is not a NodeId, a ticket or a device's name")]
    Unknown,
    #[error("{} devices are named so ({}): name one by its NodeId", .0.len(), .0.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "))]
    Ambiguous(Vec<EndpointId>),
}

/// Two device names are the same name when they differ only in case.
fn same_name(a: &str, b: &str) -> bool {
    a.trim().to_lowercase() == b.trim().to_lowercase()
}

/// `id`'s entry (made, added `how`, if there is none), named `name` made
/// unique when one is given (else keeping an earlier name).
fn named<'f>(f: &'f mut File, id: &EndpointId, name: Option<String>, how: How) -> &'f mut Device {
    let name = name.map(|n| unique_name(f, id, n));
    let d = f.devices.entry(id.to_string()).or_insert_with(|| Device::new(how));
    if name.is_some() {
        d.name = name;
    }
    d
}

/// `name`, or `name (2)`, `name (3)`… when another device has it already:
/// a pairing device chooses its own name, and must not take another's (then
/// `deny` or `kick` by that name would act on either).
fn unique_name(f: &File, id: &EndpointId, name: String) -> String {
    let me = id.to_string();
    let taken = |n: &str| {
        f.devices.iter().any(|(k, d)| *k != me && d.name.as_deref().is_some_and(|x| same_name(x, n)))
    };
    if !taken(&name) {
        return name;
    }
    (2..).map(|i| format!("{name} ({i})")).find(|n| !taken(n)).unwrap_or(name)
}

impl Device {
    fn new(how: How) -> Self {
        Self { name: None, how, added_ms: now_ms(), last_seen_ms: None, agents: Vec::new(), scope: None }
    }
}

/// The devices that paired with one of the host's agents by a code.
#[derive(Debug)]
pub struct PairedWith {
    pub devices: std::sync::Arc<Devices>,
    pub agent: std::sync::Arc<str>,
}

impl crate::trust::TrustPolicy for PairedWith {
    fn check(&self, peer: &EndpointId) -> Option<crate::trust::Grant> {
        self.devices.granted(peer, &self.agent).then_some(crate::trust::Grant::Paired)
    }
}

/// The guests of shares at one agent: a device redeemed a share's code
/// for a session of this agent (its scope names the session and the agent).
#[derive(Debug)]
pub struct SharedWith {
    pub devices: Arc<Devices>,
    /// The agent's name as a scope names it.
    pub agent: Arc<str>,
}

impl crate::trust::TrustPolicy for SharedWith {
    fn check(&self, peer: &EndpointId) -> Option<crate::trust::Grant> {
        let g = self.devices.grants();
        let s = g.scopes.get(peer)?;
        (s.session.is_some() && s.reaches(&self.agent)).then_some(crate::trust::Grant::Shared)
    }
}

/// An agent's trust narrowed by each device's scope: a device whose scope
/// ran out, or does not name this agent, is not admitted here (so a
/// recheck ends its sessions like a revoked device's).
#[derive(Debug)]
pub struct Scoped {
    pub inner: Arc<dyn crate::trust::TrustPolicy>,
    pub devices: Arc<Devices>,
    /// The agent's name as a scope names it (a manifest's name; a
    /// single-agent bridge's protocol).
    pub agent: Arc<str>,
}

impl crate::trust::TrustPolicy for Scoped {
    fn check(&self, peer: &EndpointId) -> Option<crate::trust::Grant> {
        let grant = self.inner.check(peer)?;
        (self.devices.verbs_at(peer, &self.agent) != Verbs::NONE).then_some(grant)
    }
}

/// A NodeId written as hex, base32 or a ticket.
pub fn resolve_id(target: &str) -> Option<EndpointId> {
    target.parse::<thunderbolt_shared::Target>().ok().map(|t| t.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_file_that_does_not_parse_admits_no_one_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let d = Arc::new(Devices::new(&home));
        let (watcher, owner) =
            (iroh::SecretKey::from_bytes(&[6; 32]).public(), iroh::SecretKey::from_bytes(&[7; 32]).public());
        d.record(&owner, Some("Laptop".into()), How::Allow).unwrap();
        d.record(&watcher, Some("Phone".into()), How::Pairing).unwrap();
        let observe: Verbs = "observe".parse().unwrap();
        assert!(d.set_scope(&watcher, Some(Scope { verbs: observe, ..Scope::full() })).unwrap());
        let both = crate::trust::AcceptFrom { own: None, ids: [owner, watcher].into(), paired: None };
        let scoped = Scoped { inner: Arc::new(both), devices: d.clone(), agent: "acp".into() };
        use crate::trust::TrustPolicy;
        assert!(scoped.check(&owner).is_some() && scoped.check(&watcher).is_some());
        assert_eq!(d.verbs_at(&watcher, "acp"), observe);

        // A hand edit breaks it: the watcher is not widened to the owner's
        // reach; no one is admitted until it parses again.
        let text = std::fs::read_to_string(d.path()).unwrap();
        std::fs::write(d.path(), format!("{text},")).unwrap();
        for id in [&owner, &watcher] {
            assert_eq!(d.verbs_at(id, "acp"), Verbs::NONE);
            assert_eq!(d.scope_of(id).verbs, Verbs::NONE);
            assert!(scoped.check(id).is_none());
        }
        // Nothing written to it replaces what it held.
        assert!(d.record(&owner, None, How::Allow).is_err());
        assert!(std::fs::read_to_string(d.path()).unwrap().ends_with(','));

        std::fs::write(d.path(), text).unwrap();
        assert!(scoped.check(&owner).is_some());
        assert_eq!(d.verbs_at(&watcher, "acp"), observe);
    }

    #[test]
    fn names_live_beside_the_allow_file() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let d = Devices::new(&home);
        let id = iroh::SecretKey::from_bytes(&[5; 32]).public();
        assert_eq!(d.name_of(&id), None);
        d.record(&id, Some("Pixel 9".into()), How::Pairing).unwrap();
        assert_eq!(d.by_name("pixel 9"), vec![id]);
        assert_eq!(d.resolve("Pixel 9"), Ok(id));
        assert_eq!(d.resolve(&id.to_string()), Ok(id));
        d.seen(&id, How::Allow);
        let dev = d.get(&id).unwrap();
        assert_eq!((dev.how, dev.name.as_deref()), (How::Pairing, Some("Pixel 9")));
        assert!(dev.last_seen_ms.is_some());
        d.record(&id, None, How::Allow).unwrap();
        assert_eq!(d.name_of(&id).as_deref(), Some("Pixel 9"), "a name stays unless replaced");
        d.forget(&id).unwrap();
        assert!(d.all().is_empty());
        assert!(!home.allowlist_path().exists(), "the allow file is not touched");
    }

    #[test]
    fn a_shares_guest_goes_a_day_after_its_share_ended_and_nobody_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let d = Devices::new(&Home::new(dir.path().to_path_buf()));
        let (old, recent, scoped) = (
            iroh::SecretKey::from_bytes(&[7; 32]).public(),
            iroh::SecretKey::from_bytes(&[8; 32]).public(),
            iroh::SecretKey::from_bytes(&[9; 32]).public(),
        );
        let share = |until_ms| Scope {
            verbs: "observe".parse().unwrap(),
            agents: Some(vec!["acp".into()]),
            until_ms: Some(until_ms),
            session: Some("ab12cd34".into()),
        };
        let day = ENDED_SHARES_KEPT.as_millis() as u64;
        d.record(&old, None, How::Share).unwrap();
        d.set_scope(&old, Some(share(now_ms() - day - 1000))).unwrap();
        d.record(&recent, None, How::Share).unwrap();
        d.set_scope(&recent, Some(share(now_ms() - 1000))).unwrap();
        d.record(&scoped, None, How::Pairing).unwrap();
        d.set_scope(&scoped, Some(Scope { session: None, ..share(1) })).unwrap();
        assert!(d.expired(&recent), "ended, refused as such");
        assert_eq!(d.forget_ended_shares(), 1);
        assert!(d.get(&old).is_none());
        assert!(d.get(&recent).is_some() && d.get(&scoped).is_some());
        assert_eq!(d.forget_ended_shares(), 0, "nothing more, and the file is left alone");
    }

    #[test]
    fn a_name_belongs_to_one_device_and_a_shared_one_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let d = Devices::new(&Home::new(dir.path().to_path_buf()));
        let (a, b, c) = (
            iroh::SecretKey::from_bytes(&[1; 32]).public(),
            iroh::SecretKey::from_bytes(&[2; 32]).public(),
            iroh::SecretKey::from_bytes(&[3; 32]).public(),
        );
        d.record(&a, Some("Owner's phone".into()), How::Pairing).unwrap();
        d.grant(&b, Some("OWNER'S PHONE".into()), &["coder".into()]).unwrap();
        d.record(&c, Some("owner's phone".into()), How::Allow).unwrap();
        assert_eq!(d.name_of(&a).as_deref(), Some("Owner's phone"));
        assert_eq!(d.name_of(&b).as_deref(), Some("OWNER'S PHONE (2)"), "another device's name is not taken");
        assert_eq!(d.name_of(&c).as_deref(), Some("owner's phone (3)"));
        assert_eq!(d.resolve("owner's PHONE"), Ok(a));
        d.record(&a, Some("Owner's phone".into()), How::Pairing).unwrap();
        assert_eq!(d.name_of(&a).as_deref(), Some("Owner's phone"), "its own name is its own");
        assert!(d.granted(&b, "coder") && !d.granted(&b, "other") && !d.granted(&a, "coder"));
        // A file written before names were unique: the shared name names neither.
        let path = dir.path().join("iroh/devices.json");
        let text = std::fs::read_to_string(&path).unwrap().replace("OWNER'S PHONE (2)", "owner's phone");
        std::fs::write(&path, text).unwrap();
        assert!(matches!(d.resolve("Owner's Phone"), Err(Unresolved::Ambiguous(v)) if v.len() == 2));
        assert_eq!(d.resolve("nobody"), Err(Unresolved::Unknown));
    }
}
