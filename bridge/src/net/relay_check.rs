//! Asking a relay whether it lives: `GET /ping`, within a time learned from
//! its last answers, a refusal shared by every check in the process.

use std::{sync::Arc, time::Duration};

use iroh::{Endpoint, RelayUrl};
use tracing::debug;

use super::describe_relay_failure;

/// How often a relay in use is asked whether it still answers (the home
/// relay, and the one a connection's path goes through): a dead relay takes
/// its paths with it, and iroh notices one that went silent only at its own
/// ping's timeout (15 s and more).
pub const RELAY_CHECK_EVERY: Duration = Duration::from_millis(500);

/// A relay that does not answer its `/ping` within this is taken for gone
/// (one that refuses is, at once): the first time, when the answer takes a
/// TCP and a TLS handshake too ...
pub const RELAY_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// ... then [`RELAY_CHECK_RTTS`] times the slowest of its last
/// [`RELAY_CHECK_KEPT`] answers (one round trip each, over the connection
/// kept alive), at least this long, at most [`RELAY_CHECK_TIMEOUT`]: a
/// relay that went silent is noticed within about a second on a fast link.
/// (A busy machine takes that long to answer now and then: a check taken
/// for a death costs a needless move of the home relay.)
pub const RELAY_CHECK_MIN_TIMEOUT: Duration = Duration::from_millis(500);

/// See [`RELAY_CHECK_MIN_TIMEOUT`].
pub const RELAY_CHECK_RTTS: u32 = 8;

/// See [`RELAY_CHECK_MIN_TIMEOUT`].
const RELAY_CHECK_KEPT: usize = 8;

/// How long the name of a relay may take to resolve for a check: a name that
/// does not resolve says nothing about the relay (iroh may still reach it).
const RELAY_CHECK_LOOKUP: Duration = Duration::from_millis(800);

/// A relay found refusing is taken for that for this long by every check in
/// the process (the home relay's and a connection's, several agents'
/// endpoints): the first to notice tells the others. (An answer is not
/// shared: one from before a death would hide it; nor is a slow one, which
/// each check judges for itself.)
const RELAY_CHECK_SHARED: Duration = Duration::from_millis(250);

/// The last relays found gone, when, and why.
static RELAYS_GONE: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<RelayUrl, (tokio::time::Instant, String)>>,
> = std::sync::LazyLock::new(Default::default);

/// One HTTP client for every check in the process (one kept-alive connection
/// per relay, not one per endpoint).
static RELAY_CHECK_CLIENT: std::sync::OnceLock<Option<reqwest::Client>> = std::sync::OnceLock::new();

/// How long each relay's last answers took (every check in the process).
static RELAY_TOOK: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<RelayUrl, std::collections::VecDeque<Duration>>>,
> = std::sync::LazyLock::new(Default::default);

/// Asks relays whether they answer: `GET /ping` (what iroh's own net report
/// asks), over one kept-alive connection per relay. Names resolve through
/// the endpoint's own resolver (what iroh reaches the relay with).
/// Certificates are not checked: only an answer is wanted, and a relay with
/// a private CA answers like any other.
#[derive(Clone)]
pub struct RelayCheck {
    client: Option<reqwest::Client>,
}

/// What a relay's answer to [`RelayCheck::ping`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It answered.
    Alive,
    /// It refused (nothing takes connections there, or they are reset):
    /// why, in words.
    Refused(String),
    /// It did not answer in time (it may only be slow): why, in words.
    Silent(String),
    /// Nothing can be said (its name did not resolve, no client could be made).
    Unknown(String),
}

/// The relay's name did not resolve: no verdict on the relay.
#[derive(Debug)]
struct Unresolved(String);

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "its name does not resolve: {}", self.0)
    }
}

impl std::error::Error for Unresolved {}

/// reqwest's names, through iroh's resolver.
struct ViaIroh(iroh::dns::DnsResolver);

impl reqwest::dns::Resolve for ViaIroh {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (dns, name) = (self.0.clone(), name.as_str().to_string());
        Box::pin(async move {
            match dns.lookup_ipv4_ipv6(&name, RELAY_CHECK_LOOKUP).await {
                Ok(ips) => {
                    let addrs: Vec<std::net::SocketAddr> =
                        ips.map(|ip| std::net::SocketAddr::new(ip, 0)).collect();
                    Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
                }
                Err(e) => Err(Box::new(Unresolved(format!("{name}: {e}"))) as Box<_>),
            }
        })
    }
}

impl RelayCheck {
    /// Checks with `ep`'s resolver (the first endpoint's: every endpoint of
    /// the process resolves alike).
    pub fn new(ep: &Endpoint) -> Self {
        let client = RELAY_CHECK_CLIENT.get_or_init(|| Self::client(ep.dns_resolver().ok().cloned())).clone();
        Self { client }
    }

    /// How we ask a relay over HTTP: no proxy, no redirects, its certificate
    /// unchecked (only an answer is wanted), names through `dns` when given.
    pub(crate) fn client(dns: Option<iroh::dns::DnsResolver>) -> Option<reqwest::Client> {
        // The binary installs it first; a library user (a test) may not have.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(30))
            .connect_timeout(RELAY_CHECK_TIMEOUT);
        if let Some(dns) = dns {
            b = b.dns_resolver(Arc::new(ViaIroh(dns)));
        }
        b.build().map_err(|e| debug!("relays cannot be checked: {e}")).ok()
    }

    /// How long `url` gets to answer (see [`RELAY_CHECK_MIN_TIMEOUT`]).
    fn timeout(url: &RelayUrl) -> Duration {
        let took = RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner());
        match took.get(url).and_then(|t| t.iter().max()) {
            Some(slowest) => {
                (*slowest * RELAY_CHECK_RTTS).clamp(RELAY_CHECK_MIN_TIMEOUT, RELAY_CHECK_TIMEOUT)
            }
            None => RELAY_CHECK_TIMEOUT,
        }
    }

    /// Keeps how long `url` took to answer; whether it is its first answer.
    fn answered(url: &RelayUrl, took: Duration) -> bool {
        let mut all = RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner());
        let t = all.entry(url.clone()).or_default();
        if t.len() == RELAY_CHECK_KEPT {
            t.pop_front();
        }
        t.push_back(took);
        t.len() == 1
    }

    /// Whether `url` answers in time (see [`RELAY_CHECK_TIMEOUT`]); another
    /// check's finding it gone within [`RELAY_CHECK_SHARED`] is taken as is.
    pub async fn ping(&self, url: &RelayUrl) -> Answer {
        let now = tokio::time::Instant::now();
        if let Some((at, why)) = RELAYS_GONE.lock().unwrap_or_else(|p| p.into_inner()).get(url) {
            if now.saturating_duration_since(*at) < RELAY_CHECK_SHARED {
                return Answer::Refused(why.clone());
            }
        }
        let answer = self.ask(url).await;
        if let Answer::Refused(why) = &answer {
            let mut gone = RELAYS_GONE.lock().unwrap_or_else(|p| p.into_inner());
            gone.insert(url.clone(), (tokio::time::Instant::now(), why.clone()));
        }
        answer
    }

    /// `GET /ping` on `url`, within its time.
    pub(super) async fn ask(&self, url: &RelayUrl) -> Answer {
        let Some(client) = &self.client else { return Answer::Unknown("no HTTP client".into()) };
        let Ok(ping) = url.join("ping") else { return Answer::Unknown(format!("{url} has no /ping")) };
        let (limit, t0) = (Self::timeout(url), tokio::time::Instant::now());
        match tokio::time::timeout(limit, client.get(ping).send()).await {
            Err(_) => {
                // Its connection may be what hangs: the next ping starts afresh.
                RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner()).remove(url);
                Answer::Silent(format!("{url} does not answer (nothing within {limit:?})"))
            }
            // Any answer at all: an HTTP status is the relay's own.
            Ok(Ok(answer)) => {
                // Read to its end, so that its connection is kept for the next.
                let _ = tokio::time::timeout(limit, answer.bytes()).await;
                let took = t0.elapsed();
                if Self::answered(url, took) {
                    debug!("relay {url} answers its /ping (in {took:?})");
                }
                Answer::Alive
            }
            Ok(Err(e)) => {
                let mut chain = e.to_string();
                let mut source = std::error::Error::source(&e);
                let mut unresolved = false;
                while let Some(s) = source {
                    unresolved |= s.is::<Unresolved>();
                    chain.push_str(&format!(": {s}"));
                    source = s.source();
                }
                if unresolved {
                    Answer::Unknown(chain)
                } else if e.is_timeout() {
                    Answer::Silent(format!("{url} does not answer ({chain})"))
                } else {
                    Answer::Refused(format!("{url} {}", describe_relay_failure(&chain)))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay that answers, one that refuses, and one that takes the
    /// connection and then says nothing (a TCP black hole), as the check
    /// tells them apart.
    #[tokio::test]
    async fn a_relay_check_tells_alive_refused_and_silent_apart() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let check = RelayCheck { client: RelayCheck::client(None) };
        // Answers every request on a connection it keeps.
        let alive = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive_url: RelayUrl = format!("http://{}", alive.local_addr().unwrap()).parse().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = alive.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if c.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        assert_eq!(check.ping(&alive_url).await, Answer::Alive);
        assert_eq!(check.ping(&alive_url).await, Answer::Alive);
        // Nothing listens.
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone_url: RelayUrl = format!("http://{}", gone.local_addr().unwrap()).parse().unwrap();
        drop(gone);
        let answer = check.ping(&gone_url).await;
        assert!(matches!(&answer, Answer::Refused(why) if why.contains("refused")), "{answer:?}");
        // Listens (the kernel takes the connection), never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url: RelayUrl = format!("http://{}", silent.local_addr().unwrap()).parse().unwrap();
        let t0 = std::time::Instant::now();
        let answer = check.ping(&silent_url).await;
        assert!(matches!(&answer, Answer::Silent(why) if why.contains("does not answer")), "{answer:?}");
        assert!(t0.elapsed() < RELAY_CHECK_TIMEOUT * 3, "{:?}", t0.elapsed());
        drop(silent);
    }
}
