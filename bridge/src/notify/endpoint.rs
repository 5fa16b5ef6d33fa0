//! Where a device's Web Push endpoint may point: https to a public name or
//! address, port 443, nothing else.
//!
//! A push endpoint is a URL chosen by the device, and the bridge POSTs to it
//! from the workstation: without this check a device could make the
//! workstation reach its loopback services, its LAN, a cloud metadata
//! address or an intranet name. It is checked twice:
//!
//! - at subscribe time, on the URL ([`check_url`]): the scheme, the port, a
//!   literal address, a name of this machine or of an intranet;
//! - at connect time, on the addresses the name resolves to
//!   ([`GuardedResolver`], the push client's resolver): a public-looking
//!   name that resolves to 127.0.0.1 (or whose answer changes after
//!   subscribing) is never connected to.
//!
//! The tests' push service runs on loopback: [`TEST_LOOPBACK_ENV`]`=1`, read
//! once at start, lets http and https to loopback (any port) through, and
//! nothing else. It is for tests only and off unless set.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use reqwest::Url;

/// The tests' switch: `1` admits endpoints on loopback (http or https, any
/// port) for the local push service of the tests. Never set it in use: it
/// lets a device make the bridge POST to this machine's own services.
pub const TEST_LOOPBACK_ENV: &str = "THUNDERBOLT_TEST_PUSH_LOOPBACK";

/// The one port push services use (FCM, Mozilla's autopush, Apple, WNS): a
/// device may not have the workstation open TLS to any other port.
const PUSH_PORT: u16 = 443;

/// Name suffixes that only mean something inside a network (RFC 6762
/// `.local`, RFC 8375 `.home.arpa`, the usual private ones).
const INTRANET_SUFFIXES: &[&str] =
    &["local", "localdomain", "internal", "intranet", "lan", "home", "corp", "home.arpa"];

/// What an endpoint may point at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Loopback admitted too ([`TEST_LOOPBACK_ENV`]), for the tests only.
    pub loopback_for_tests: bool,
}

impl Policy {
    /// The policy of this process: [`TEST_LOOPBACK_ENV`] read once.
    pub fn from_env() -> Self {
        let on = std::env::var(TEST_LOOPBACK_ENV).is_ok_and(|v| v == "1");
        if on {
            tracing::warn!(
                "{TEST_LOOPBACK_ENV}=1: push endpoints on loopback are admitted (for tests only: a device can \
                 make this bridge POST to this machine's own services)"
            );
        }
        Self { loopback_for_tests: on }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("the endpoint must be https")]
    Scheme,
    #[error("the endpoint may not carry a user or password")]
    UserInfo,
    #[error("the endpoint must use port {PUSH_PORT}")]
    Port,
    #[error("the endpoint has no host")]
    NoHost,
    #[error("the endpoint's address {0} is not a public one")]
    Address(IpAddr),
    #[error("the endpoint's host names this machine")]
    ThisMachine,
    #[error("the endpoint's host is an intranet name")]
    Intranet,
    #[error("the endpoint's host resolves to no public address")]
    NoPublicAddress,
}

/// Checks an endpoint URL (subscribe time, and again before each push).
pub fn check_url(url: &Url, policy: Policy) -> Result<(), EndpointError> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err(EndpointError::UserInfo);
    }
    let loopback = policy.loopback_for_tests && is_loopback_host(url);
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => return Err(EndpointError::Scheme),
    }
    if loopback {
        return Ok(());
    }
    if url.port_or_known_default() != Some(PUSH_PORT) {
        return Err(EndpointError::Port);
    }
    match url.host() {
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) => check_name(d),
        None => Err(EndpointError::NoHost),
    }
}

fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

fn check_ip(ip: IpAddr) -> Result<(), EndpointError> {
    if is_public(ip) {
        Ok(())
    } else {
        Err(EndpointError::Address(ip))
    }
}

/// A host name: not this machine's, not a single label, not an intranet suffix.
pub fn check_name(name: &str) -> Result<(), EndpointError> {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    if n.is_empty() {
        return Err(EndpointError::NoHost);
    }
    if n == "localhost" || n.ends_with(".localhost") {
        return Err(EndpointError::ThisMachine);
    }
    // A name that parses as an address (the URL parser takes most forms;
    // a resolver may take others).
    if let Ok(ip) = n.parse::<IpAddr>() {
        return check_ip(ip);
    }
    if !n.contains('.') {
        return Err(EndpointError::Intranet);
    }
    let intranet = INTRANET_SUFFIXES
        .iter()
        .any(|s| n == *s || (n.ends_with(s) && n[..n.len() - s.len()].ends_with('.')));
    if intranet {
        return Err(EndpointError::Intranet);
    }
    Ok(())
}

/// Whether `ip` is a public unicast address: not loopback, private,
/// link-local, ULA, CGNAT, unspecified, multicast, broadcast, documentation,
/// benchmarking, reserved, nor any of those mapped or embedded in IPv6.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    let special = ip.is_unspecified()
        || o[0] == 0 // "this network", 0/8
        || ip.is_loopback() // 127/8
        || ip.is_private() // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local() // 169.254/16 (cloud metadata)
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF assignments 192.0.0/24
        || ip.is_documentation() // 192.0.2/24, 198.51.100/24, 203.0.113/24
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18/15
        || (o[0] == 192 && o[1] == 88 && o[2] == 99) // 6to4 relay anycast
        || ip.is_multicast() // 224/4
        || o[0] >= 240; // reserved 240/4, broadcast
    !special
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    let embedded_v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) reach the IPv4 address inside.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return is_public_v4(embedded_v4(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return is_public_v4(embedded_v4(s[1], s[2]));
    }
    let special = ip.is_unspecified()
        || ip.is_loopback()
        || s[0..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible ::a.b.c.d (deprecated)
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64 64:ff9b:1::/48
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // discard-only 100::/64
        || (s[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (s[0] == 0x2001 && s[1] == 0) // Teredo 2001::/32 (a tunnel to anywhere)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation 2001:db8::/32
        || (s[0] == 0x3fff && s[1] < 0x1000) // documentation 3fff::/20
        || ip.is_multicast(); // ff00::/8
    !special
}

/// The addresses of `addrs` that may be connected to under `policy`.
pub fn filter(addrs: impl IntoIterator<Item = SocketAddr>, policy: Policy) -> Vec<SocketAddr> {
    addrs
        .into_iter()
        .filter(|a| is_public(a.ip()) || (policy.loopback_for_tests && a.ip().is_loopback()))
        .collect()
}

/// Looks a name up: the system's resolver in use, a fixed table in tests.
pub type Lookup = Arc<dyn Fn(String) -> reqwest::dns::Resolving + Send + Sync>;

/// The push client's resolver: the system's answer, less every address that
/// is not public ([`is_public`]); a name left with none is an error, so it
/// is never connected to. (A URL with a literal address does not come here:
/// [`check_url`] runs before every push.)
#[derive(Clone)]
pub struct GuardedResolver {
    policy: Policy,
    lookup: Lookup,
}

impl GuardedResolver {
    pub fn new(policy: Policy) -> Self {
        let lookup: Lookup = Arc::new(|name: String| {
            Box::pin(async move {
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
                Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
            })
        });
        Self { policy, lookup }
    }

    /// With `lookup` in place of the system's resolver (tests).
    pub fn with_lookup(policy: Policy, lookup: Lookup) -> Self {
        Self { policy, lookup }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_string();
        let policy = self.policy;
        let lookup = self.lookup.clone();
        Box::pin(async move {
            let loopback_name = policy.loopback_for_tests && name.eq_ignore_ascii_case("localhost");
            if !loopback_name {
                check_name(&name)?;
            }
            let addrs = filter(lookup(name).await?, policy);
            if addrs.is_empty() {
                return Err(
                    Box::new(EndpointError::NoPublicAddress) as Box<dyn std::error::Error + Send + Sync>
                );
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: Policy = Policy { loopback_for_tests: false };
    const TESTS: Policy = Policy { loopback_for_tests: true };

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn every_special_range_is_not_public() {
        let refused = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::ffff:192.168.0.1",
            "::ffff:100.64.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:a00:1::",
            "fc00::1",
            "fd00::1",
            "fdff:ffff::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
            "2001:db8::1",
            "3fff::1",
            "2001:0:4136:e378::1",
            "100::1",
        ];
        for ip in refused {
            assert!(!is_public(ip.parse().unwrap()), "{ip} must not count as public");
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "192.169.0.1",
            "198.20.0.1",
            "223.255.255.1",
            "2a00:1450:4001::200e",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for ip in public {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
    }

    #[test]
    fn names_of_this_machine_and_of_intranets_are_refused() {
        for n in ["localhost", "LOCALHOST.", "a.localhost", "x.y.localhost"] {
            assert_eq!(check_name(n), Err(EndpointError::ThisMachine), "{n}");
        }
        for n in ["intranet", "printer", "nas.local", "git.corp", "db.internal", "router.home.arpa", "x.lan"]
        {
            assert_eq!(check_name(n), Err(EndpointError::Intranet), "{n}");
        }
        for n in
            ["fcm.googleapis.com", "updates.push.services.mozilla.com", "web.push.apple.com", "mylocal.com"]
        {
            assert_eq!(check_name(n), Ok(()), "{n}");
        }
    }

    #[test]
    fn urls_https_to_port_443_of_public_hosts_only() {
        assert_eq!(check_url(&url("https://fcm.googleapis.com/fcm/send/abc"), OFF), Ok(()));
        assert_eq!(check_url(&url("https://push.example:443/x"), OFF), Ok(()));
        assert_eq!(check_url(&url("https://[2a00:1450:4001::200e]/x"), OFF), Ok(()));
        assert_eq!(check_url(&url("http://fcm.googleapis.com/x"), OFF), Err(EndpointError::Scheme));
        assert_eq!(check_url(&url("ftp://fcm.googleapis.com/x"), OFF), Err(EndpointError::Scheme));
        assert_eq!(check_url(&url("https://fcm.googleapis.com:8443/x"), OFF), Err(EndpointError::Port));
        assert_eq!(check_url(&url("https://u:p@fcm.googleapis.com/x"), OFF), Err(EndpointError::UserInfo));
        let refused = [
            "http://127.0.0.1:9/actuator/shutdown?confirm=yes",
            "https://127.0.0.1/x",
            "https://127.0.0.1:8443/x",
            "https://169.254.169.254/latest/meta-data",
            "https://10.0.0.5/x",
            "https://192.168.0.1/x",
            "https://[fd00::1]/x",
            "https://[::ffff:127.0.0.1]/x",
            "https://2130706433/x",
            "https://0x7f.1/x",
            "https://localhost/x",
            "https://intranet/x",
            "https://nas.local/x",
        ];
        for u in refused {
            assert!(check_url(&url(u), OFF).is_err(), "{u} must be refused");
        }
        // The tests' switch admits loopback, any port, http too; nothing more.
        assert_eq!(check_url(&url("http://127.0.0.1:9/x"), TESTS), Ok(()));
        assert_eq!(check_url(&url("https://127.0.0.1:9/x"), TESTS), Ok(()));
        assert_eq!(check_url(&url("http://localhost:9/x"), TESTS), Ok(()));
        assert_eq!(check_url(&url("http://[::1]:9/x"), TESTS), Ok(()));
        assert!(check_url(&url("http://10.0.0.1:9/x"), TESTS).is_err());
        assert!(check_url(&url("https://10.0.0.1/x"), TESTS).is_err());
        assert!(check_url(&url("http://push.example/x"), TESTS).is_err());
    }

    fn table(answer: Vec<IpAddr>) -> Lookup {
        Arc::new(move |_name| {
            let a: Vec<SocketAddr> = answer.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
            Box::pin(async move { Ok(Box::new(a.into_iter()) as reqwest::dns::Addrs) })
        })
    }

    async fn resolve(r: &GuardedResolver, name: &str) -> Result<Vec<SocketAddr>, String> {
        use reqwest::dns::Resolve;
        match r.resolve(name.parse().unwrap()).await {
            Ok(a) => Ok(a.collect()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[tokio::test]
    async fn the_resolver_drops_every_address_that_is_not_public() {
        let loopback = GuardedResolver::with_lookup(OFF, table(vec!["127.0.0.1".parse().unwrap()]));
        let e = resolve(&loopback, "push.example.com").await.unwrap_err();
        assert!(e.contains("no public address"), "{e}");
        let mixed = GuardedResolver::with_lookup(
            OFF,
            table(vec![
                "10.0.0.1".parse().unwrap(),
                "8.8.8.8".parse().unwrap(),
                "::ffff:127.0.0.1".parse().unwrap(),
            ]),
        );
        let got = resolve(&mixed, "push.example.com").await.unwrap();
        assert_eq!(got, vec!["8.8.8.8:0".parse().unwrap()], "only the public address is kept");
        // Names are checked before any lookup.
        let any = GuardedResolver::with_lookup(OFF, table(vec!["8.8.8.8".parse().unwrap()]));
        assert!(resolve(&any, "localhost").await.unwrap_err().contains("this machine"));
        assert!(resolve(&any, "intranet").await.unwrap_err().contains("intranet"));
        // The system's resolver: localhost is refused before it is looked up.
        let system = GuardedResolver::new(OFF);
        assert!(resolve(&system, "localhost").await.is_err());
        // The tests' switch: loopback passes, private still does not.
        let tests = GuardedResolver::with_lookup(
            TESTS,
            table(vec!["127.0.0.1".parse().unwrap(), "192.168.1.1".parse().unwrap()]),
        );
        assert_eq!(resolve(&tests, "localhost").await.unwrap(), vec!["127.0.0.1:0".parse().unwrap()]);
    }

    /// A name that resolves to a loopback listener: the client never connects.
    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_never_connected_to() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let resolver = GuardedResolver::with_lookup(OFF, table(vec!["127.0.0.1".parse().unwrap()]));
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(resolver))
            .no_proxy()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap();
        // Plain http to a port of our choosing, so a connection would be one
        // the listener sees (the URL check is not run here: only the resolver).
        let err = http.post(format!("http://push.example.com:{port}/x")).send().await.unwrap_err();
        assert!(err.is_connect() || err.to_string().contains("dns"), "{err}");
        let accepted = tokio::time::timeout(std::time::Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "nothing connected to the loopback listener");
    }
}
