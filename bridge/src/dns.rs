//! DNS lookups that stay quiet while nothing answers.
//!
//! Offline (a laptop without a network, a namespace or a firewall that lets
//! no DNS out) every lookup fails at once ("network unreachable"), and iroh's
//! relay actor and its net report look the default relays' names up again and
//! again: each lookup walks every nameserver (the system's, then the public
//! fallback tier, over UDP, TCP and HTTPS). A fresh `connect` with the default
//! relays unreachable opened ~10 000 sockets a second for its first three
//! seconds and spent 210–240 ms of CPU on it, on the cores the transfer it
//! carries needs (issue 39: the resumable path at 0.62–0.74× the plain one in
//! such runs, the plain one slowed too).
//!
//! [`QuietResolver`] wraps the resolver iroh would have used: a name whose
//! lookup failed is not looked up again for a while ([`RETRY_FIRST`],
//! doubling to [`RETRY_MAX`]); a lookup meanwhile fails at once, as it would
//! have anyway. A success forgets the name's failures, and a network change
//! (iroh resets its resolver then) forgets them all, so coming back online is
//! noticed at once rather than at the end of a wait.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Arc, Mutex},
    time::Duration,
};

use iroh::dns::{BoxIter, DnsError, DnsResolver, Resolver, TxtRecordData};
use n0_future::boxed::BoxFuture;
use tokio::time::Instant;
use tracing::debug;

/// How long a name whose lookup failed is left alone the first time: long
/// enough that iroh's retries (its relay actor starts at 10 ms) cost a lookup
/// a second instead of hundreds, short enough that a name that failed by a
/// fluke is asked again before anybody waits on it.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);

/// ... doubling while it keeps failing, up to this: iroh's own relay dial
/// backoff tops out at 16 s, and a network change forgets the wait anyway.
pub const RETRY_MAX: Duration = Duration::from_secs(16);

/// Failed names remembered at once. An endpoint looks up its relays' names
/// (a handful) and, with discovery on, one name per peer it dials: past
/// this, a new failure is simply not remembered (no table grows without bound).
pub const MAX_REMEMBERED: usize = 256;

/// The inner resolver's own limit per lookup. iroh puts its own (3 s or
/// less) around every lookup and drops ours when it passes; this only bounds
/// a lookup nobody waits for any more.
const INNER_TIMEOUT: Duration = Duration::from_secs(10);

/// What was looked up: the same name fails or answers separately per record type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Ipv4,
    Ipv6,
    Txt,
}

/// A name that failed: not asked again before `until`.
#[derive(Debug)]
struct Failed {
    until: Instant,
    gap: Duration,
    why: String,
}

/// The resolver iroh uses, with failed names left alone for a while (see the module).
#[derive(Clone)]
pub struct QuietResolver {
    inner: DnsResolver,
    failed: Arc<Mutex<HashMap<(Kind, String), Failed>>>,
}

impl fmt::Debug for QuietResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.failed.lock().map_or(0, |m| m.len());
        f.debug_struct("QuietResolver").field("failed_names", &n).finish()
    }
}

impl QuietResolver {
    pub fn new(inner: DnsResolver) -> Self {
        Self { inner, failed: Arc::default() }
    }

    /// An endpoint's resolver: `inner` behind the wait (see the module).
    pub fn wrap(inner: DnsResolver) -> DnsResolver {
        DnsResolver::custom(Self::new(inner))
    }

    /// Runs `lookup` for `host`, unless it failed lately (then fails at once).
    async fn quiet<T>(
        &self,
        kind: Kind,
        host: String,
        lookup: impl Future<Output = Result<T, DnsError>>,
    ) -> Result<T, DnsError> {
        let key = (kind, host);
        if let Some(f) = self.lock().get(&key) {
            let now = Instant::now();
            if now < f.until {
                let msg = format!(
                    "{} failed to resolve ({}); not asked again for {} ms",
                    key.1,
                    f.why,
                    (f.until - now).as_millis()
                );
                return Err(DnsError::from(n0_error::AnyError::from(msg)));
            }
        }
        let result = lookup.await;
        let mut failed = self.lock();
        match &result {
            Ok(_) => {
                failed.remove(&key);
            }
            Err(e) => {
                let gap = failed.get(&key).map_or(RETRY_FIRST, |f| (f.gap * 2).min(RETRY_MAX));
                if failed.len() >= MAX_REMEMBERED && !failed.contains_key(&key) {
                    let now = Instant::now();
                    failed.retain(|_, f| f.until > now);
                }
                if failed.len() < MAX_REMEMBERED || failed.contains_key(&key) {
                    debug!(host = %key.1, ?kind, "DNS lookup failed ({e}); next try in {gap:?} at the earliest");
                    let why = e.to_string();
                    failed.insert(key, Failed { until: Instant::now() + gap, gap, why });
                }
            }
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Kind, String), Failed>> {
        // A panic while holding it cannot leave the table half-written in a
        // way that matters: it only delays lookups.
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn v4(addrs: impl Iterator<Item = IpAddr>) -> Vec<Ipv4Addr> {
    addrs
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        })
        .collect()
}

fn v6(addrs: impl Iterator<Item = IpAddr>) -> Vec<Ipv6Addr> {
    addrs
        .filter_map(|a| match a {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
        .collect()
}

impl QuietResolver {
    /// One lookup of `kind` for `host` by `lookup` (given the inner resolver), quiet as [`Self::quiet`] says.
    fn ask<T, Fut>(
        &self,
        kind: Kind,
        host: String,
        lookup: impl FnOnce(DnsResolver, String) -> Fut + Send + 'static,
    ) -> BoxFuture<Result<BoxIter<T>, DnsError>>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<Vec<T>, DnsError>> + Send + 'static,
    {
        let this = self.clone();
        Box::pin(async move {
            let list = this.quiet(kind, host.clone(), lookup(this.inner.clone(), host)).await?;
            Ok(Box::new(list.into_iter()) as BoxIter<T>)
        })
    }
}

impl Resolver for QuietResolver {
    fn lookup_ipv4(&self, host: String) -> BoxFuture<Result<BoxIter<Ipv4Addr>, DnsError>> {
        self.ask(Kind::Ipv4, host, |r, h| async move { Ok(v4(r.lookup_ipv4(h, INNER_TIMEOUT).await?)) })
    }

    fn lookup_ipv6(&self, host: String) -> BoxFuture<Result<BoxIter<Ipv6Addr>, DnsError>> {
        self.ask(Kind::Ipv6, host, |r, h| async move { Ok(v6(r.lookup_ipv6(h, INNER_TIMEOUT).await?)) })
    }

    fn lookup_txt(&self, host: String) -> BoxFuture<Result<BoxIter<TxtRecordData>, DnsError>> {
        self.ask(Kind::Txt, host, |r, h| async move { Ok(r.lookup_txt(h, INNER_TIMEOUT).await?.collect()) })
    }

    fn clear_cache(&self) {
        self.inner.clear_cache();
        self.lock().clear();
    }

    /// A network change: the inner resolver re-reads the system's settings,
    /// and every name may be asked again at once.
    fn reset(&self) -> Box<dyn Resolver> {
        self.inner.reset();
        Box::new(Self::new(self.inner.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers `ok.example` once `up` is set, fails everything else; counts lookups.
    #[derive(Debug, Clone, Default)]
    struct Fake {
        asked: Arc<AtomicUsize>,
        up: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Resolver for Fake {
        fn lookup_ipv4(&self, host: String) -> BoxFuture<Result<BoxIter<Ipv4Addr>, DnsError>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let up = self.up.load(Ordering::SeqCst);
            Box::pin(async move {
                if up && host == "ok.example" {
                    Ok(Box::new(vec![Ipv4Addr::LOCALHOST].into_iter()) as BoxIter<_>)
                } else {
                    Err(DnsError::from(n0_error::AnyError::from("network unreachable")))
                }
            })
        }
        fn lookup_ipv6(&self, _: String) -> BoxFuture<Result<BoxIter<Ipv6Addr>, DnsError>> {
            Box::pin(async { Err(DnsError::from(n0_error::AnyError::from("network unreachable"))) })
        }
        fn lookup_txt(&self, _: String) -> BoxFuture<Result<BoxIter<TxtRecordData>, DnsError>> {
            Box::pin(async { Err(DnsError::from(n0_error::AnyError::from("network unreachable"))) })
        }
        fn clear_cache(&self) {}
        fn reset(&self) -> Box<dyn Resolver> {
            Box::new(self.clone())
        }
    }

    async fn ask(r: &DnsResolver, host: &str) -> bool {
        r.lookup_ipv4(host, Duration::from_secs(3)).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_name_is_left_alone_doubling_and_an_answer_or_a_network_change_forgets_it() {
        let fake = Fake::default();
        let r = QuietResolver::wrap(DnsResolver::custom(fake.clone()));
        let asked = || fake.asked.load(Ordering::SeqCst);

        // Offline: the first lookup goes out, the next hundred do not.
        assert!(!ask(&r, "ok.example").await);
        for _ in 0..100 {
            assert!(!ask(&r, "ok.example").await);
        }
        assert_eq!(asked(), 1);
        // Another name is its own.
        assert!(!ask(&r, "other.example").await);
        assert_eq!(asked(), 2);

        // After the first wait it is asked again, fails, and waits twice as long.
        tokio::time::advance(RETRY_FIRST).await;
        assert!(!ask(&r, "ok.example").await);
        assert_eq!(asked(), 3);
        tokio::time::advance(RETRY_FIRST).await;
        assert!(!ask(&r, "ok.example").await);
        assert_eq!(asked(), 3, "the second wait is twice the first");
        tokio::time::advance(RETRY_FIRST).await;

        // Back online: the answer comes and the failure is forgotten.
        fake.up.store(true, Ordering::SeqCst);
        assert!(ask(&r, "ok.example").await);
        assert!(ask(&r, "ok.example").await);
        assert_eq!(asked(), 5);

        // Waits never grow past the cap.
        fake.up.store(false, Ordering::SeqCst);
        for _ in 0..10 {
            assert!(!ask(&r, "ok.example").await);
            tokio::time::advance(RETRY_MAX).await;
        }
        assert_eq!(asked(), 15);

        // A network change: asked again at once.
        assert!(!ask(&r, "ok.example").await);
        let n = asked();
        assert!(!ask(&r, "ok.example").await);
        assert_eq!(asked(), n, "still waiting");
        r.reset();
        fake.up.store(true, Ordering::SeqCst);
        assert!(ask(&r, "ok.example").await);
        assert_eq!(asked(), n + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_of_failed_names_is_bounded() {
        let q = QuietResolver::new(DnsResolver::custom(Fake::default()));
        let r = DnsResolver::custom(q.clone());
        for i in 0..MAX_REMEMBERED + 50 {
            assert!(!ask(&r, &format!("n{i}.example")).await);
        }
        assert_eq!(q.lock().len(), MAX_REMEMBERED);
        // Once they expire, new failures take their places.
        tokio::time::advance(RETRY_FIRST).await;
        assert!(!ask(&r, "late.example").await);
        assert_eq!(q.lock().len(), 1);
    }
}
