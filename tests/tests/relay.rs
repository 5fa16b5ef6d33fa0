//! The self-hosted relay (`thunderbolt-relay`) end to end: dev mode, manual TLS
//! with a private CA passed to the clients, and its access modes.

use std::{path::Path, process::Stdio};

use iroh::{endpoint::presets, Endpoint, EndpointAddr, RelayMode, RelayUrl, SecretKey, TransportAddr};
use thunderbolt_shared::{EndpointTicket, Protocol};
use thunderbolt_tests::*;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// A running `thunderbolt-relay` process.
struct Relay {
    child: Child,
    url: RelayUrl,
    log: Log,
}

impl Relay {
    async fn start(args: &[&str]) -> Relay {
        let mut child = Command::new(bin_dir().join("thunderbolt-relay"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("relay spawns");
        let log = Log::default();
        log.capture_stderr(child.stderr.take().unwrap());
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("relay starts in time")
            .expect("read")
            .unwrap_or_else(|| panic!("relay printed nothing; log:\n{}", log.text()));
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let url = first.strip_prefix("relay listening on ").expect("relay banner").parse().expect("url");
        Relay { child, url, log }
    }
}

/// A relay-only client endpoint for `url`, trusting `ca` in addition to the built-in roots.
async fn relay_client(key: SecretKey, url: &RelayUrl, ca: Option<&[u8]>) -> Endpoint {
    let mut b = Endpoint::builder(presets::Minimal)
        .secret_key(key)
        .relay_mode(RelayMode::custom([url.clone()]))
        .portmapper_config(iroh::endpoint::PortmapperConfig::Disabled)
        .clear_ip_transports();
    if let Some(pem) = ca {
        use rustls_pki_types::{pem::PemObject, CertificateDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().expect("pem");
        b = b.ca_tls_config(iroh::tls::CaTlsConfig::default().with_extra_roots(certs));
    }
    b.bind().await.expect("bind")
}

/// The ticket with its direct addresses removed: the relay is the only way in.
fn relay_only(ticket: &str) -> EndpointAddr {
    let t: EndpointTicket = ticket.parse().unwrap();
    let a = t.endpoint_addr();
    EndpointAddr::from_parts(a.id, a.relay_urls().cloned().map(TransportAddr::Relay))
}

async fn round_trip(ep: &Endpoint, addr: EndpointAddr) -> iroh::endpoint::Connection {
    let conn = tokio::time::timeout(WAIT, ep.connect(addr, &Protocol::acp().alpn()))
        .await
        .expect("dial in time")
        .expect("dial");
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"{\"via\":\"relay\"}\n").await.unwrap();
    send.finish().unwrap();
    let got = tokio::time::timeout(WAIT, recv.read_to_end(1 << 20)).await.unwrap().unwrap();
    assert_eq!(got, b"{\"via\":\"relay\"}\n");
    conn
}

fn assert_relay_path(conn: &iroh::endpoint::Connection, url: &RelayUrl) {
    let paths: Vec<String> = conn.paths().iter().map(|p| format!("{:?}", p.remote_addr())).collect();
    assert!(!paths.is_empty());
    assert!(paths.iter().all(|p| p.contains("Relay")), "paths: {paths:?}");
    assert!(paths.iter().any(|p| p.contains(url.host_str().unwrap())), "paths: {paths:?} / {url}");
}

async fn bridge_via(home: &Tb, relay_url: &str, ca: Option<&Path>) -> RunningBridge {
    let mut c = home.cmd();
    c.env("THUNDERBOLT_IROH_RELAY_URL", relay_url);
    if let Some(ca) = ca {
        c.env("THUNDERBOLT_IROH_RELAY_CA", ca);
    }
    c.args(["acp", "--transport", "iroh", "--", &test_agent_bin().display().to_string(), "cat"]);
    RunningBridge::start(c).await
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_relay_carries_a_relay_only_session() {
    init_tracing();
    let relay = Relay::start(&["--dev", "--bind", "127.0.0.1:0"]).await;
    let home = Tb::new(None);
    let client = SecretKey::generate();
    home.allow(&client.public()).await;
    let bridge = bridge_via(&home, relay.url.as_str(), None).await;
    let t: EndpointTicket = bridge.ticket.parse().unwrap();
    assert_eq!(t.endpoint_addr().relay_urls().next(), Some(&relay.url), "the ticket names this relay");
    let ep = relay_client(client, &relay.url, None).await;
    let conn = round_trip(&ep, relay_only(&bridge.ticket)).await;
    assert_relay_path(&conn, &relay.url);
    // --dev refuses anything but loopback.
    let o = Command::new(bin_dir().join("thunderbolt-relay"))
        .args(["--dev", "--bind", "0.0.0.0:0"])
        .output()
        .await
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"));
}

fn write_config(dir: &Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("relay.toml");
    std::fs::write(&p, body).unwrap();
    p
}

fn tls_config(dir: &Path, access: &str) -> std::path::PathBuf {
    let (_, crt, key) = private_ca(dir, &["127.0.0.1", "localhost"]);
    write_config(
        dir,
        &format!(
            "http_bind_addr = \"127.0.0.1:0\"\n{access}\n[tls]\nhostname = \"127.0.0.1\"\ncert_mode = \"Manual\"\n\
             manual_cert_path = \"{}\"\nmanual_key_path = \"{}\"\nhttps_bind_addr = \"127.0.0.1:0\"\n",
            crt.display(),
            key.display()
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn manual_tls_with_a_private_ca() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let cfg = tls_config(dir.path(), "");
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    assert_eq!(relay.url.scheme(), "https");
    let ca = dir.path().join("ca.pem");
    let home = Tb::new(None);
    let client = SecretKey::generate();
    home.allow(&client.public()).await;
    let bridge = bridge_via(&home, relay.url.as_str(), Some(&ca)).await;
    assert!(
        bridge.banner.contains(&format!("relay {}", relay.url)),
        "bridge did not reach the TLS relay: {}",
        bridge.banner
    );
    let ep = relay_client(client, &relay.url, Some(&std::fs::read(&ca).unwrap())).await;
    let conn = round_trip(&ep, relay_only(&bridge.ticket)).await;
    assert_relay_path(&conn, &relay.url);

    // Without the extra CA the bridge cannot use the relay (and says so, without hanging).
    let other = Tb::new(None);
    let b2 = bridge_via(&other, relay.url.as_str(), None).await;
    assert!(b2.banner.contains("relay none"), "{}", b2.banner);
}

/// A browser offers h2 and HTTP/1.1; iroh-relay's server speaks only HTTP/1.1,
/// so the relay must pick that: a page's fetch of the relay (its `/ping`) was
/// cut off when h2 was chosen.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_offering_h2_gets_http1_and_its_request_answered() {
    use rustls_pki_types::{pem::PemObject, CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let cfg = tls_config(dir.path(), "");
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.path().join("ca.pem")).expect("ca") {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let addr = format!("{}:{}", relay.url.host_str().unwrap(), relay.url.port().unwrap());
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .expect("TLS handshake with the relay");
    assert_eq!(
        s.get_ref().1.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "the relay chose a protocol it does not speak"
    );
    s.write_all(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut answer)).await.expect("an answer in time").ok();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_file_admits_only_listed_devices_and_reloads() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let home = Tb::new(None);
    let bridge_id = home.node_id("acp").await;
    let allow = dir.path().join("allowlist");
    std::fs::write(&allow, format!("# my devices\n{bridge_id}\n")).unwrap();
    let cfg = write_config(
        dir.path(),
        &format!("http_bind_addr = \"127.0.0.1:0\"\n[access]\nallow_file = \"{}\"\n", allow.display()),
    );
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    let stranger = SecretKey::generate();
    home.allow(&stranger.public()).await;
    let bridge = bridge_via(&home, relay.url.as_str(), None).await;
    assert!(bridge.banner.contains(&format!("relay {}", relay.url)), "{}", bridge.banner);

    // Not in the relay's file: the relay refuses it, so it cannot reach the bridge.
    let ep = relay_client(stranger.clone(), &relay.url, None).await;
    relay.log.wait_for(&format!("client refused: {}", stranger.public())).await;
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(3),
        ep.connect(relay_only(&bridge.ticket), &Protocol::acp().alpn()),
    )
    .await;
    assert!(!matches!(r, Ok(Ok(_))), "an unlisted endpoint got through the relay");
    ep.close().await;

    // Listed now: admitted without restarting the relay.
    std::fs::write(&allow, format!("# my devices\n{bridge_id}\n{}\n", stranger.public())).unwrap();
    let ep = relay_client(stranger.clone(), &relay.url, None).await;
    let conn = round_trip(&ep, relay_only(&bridge.ticket)).await;
    assert_relay_path(&conn, &relay.url);
    relay.log.wait_for(&format!("client connected: {}", stranger.public())).await;

    // Removed again: its live relay connection ends too (not only new ones), and
    // the endpoint's own reconnect is refused.
    std::fs::write(&allow, format!("# my devices\n{bridge_id}\n")).unwrap();
    relay.log.wait_for(&format!("disconnected {}: removed from the allow file", stranger.public())).await;
    let refusals = relay.log.text().matches(&format!("client refused: {}", stranger.public())).count();
    relay.log.wait_for_count(&format!("client refused: {}", stranger.public()), refusals + 1).await;
    drop(conn);
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_token_refuses_clients_without_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "http_bind_addr = \"127.0.0.1:0\"\n[access]\nshared_token = [\"s3cret-relay-token\"]\n",
    );
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    let with_token: RelayUrl =
        format!("{}?token=s3cret-relay-token", relay.url.as_str().trim_end_matches('/')).parse().unwrap();
    let home = Tb::new(None);
    let client = SecretKey::generate();
    home.allow(&client.public()).await;
    let bridge = bridge_via(&home, with_token.as_str(), None).await;
    relay.log.wait_for("client connected").await;

    let ep = relay_client(client.clone(), &relay.url, None).await;
    relay.log.wait_for("client refused").await;
    relay.log.wait_for("no token").await;
    ep.close().await;
    let ep = relay_client(client, &with_token, None).await;
    let conn = round_trip(&ep, relay_only(&bridge.ticket)).await;
    assert_relay_path(&conn, &relay.url);
    assert!(!relay.log.contains("s3cret-relay-token"), "the relay must not log tokens");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configs_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (body, key) in [
        ("http_bind_addr = \"127.0.0.1:0\"\nenable_magic = true\n", "enable_magic"),
        ("http_bind_addr = \"nope\"\n", "http_bind_addr"),
        ("[access]\nallow_file = \"/does/not/exist\"\n", "access.allow_file"),
        ("[tls]\nhostname = \"r.example\"\ncert_mode = \"LetsEncrypt\"\n", "tls.contact"),
    ] {
        let cfg = write_config(dir.path(), body);
        let o = Command::new(bin_dir().join("thunderbolt-relay"))
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{body}: {err}");
        assert!(err.contains(key), "{body}: error does not name {key}: {err}");
        assert!(!err.contains("panicked"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_relay() {
    let mut relay = Relay::start(&["--dev", "--bind", "127.0.0.1:0"]).await;
    signal(relay.child.id().unwrap(), libc::SIGTERM);
    let st = tokio::time::timeout(WAIT, relay.child.wait()).await.unwrap().unwrap();
    assert!(st.success());
    relay.log.wait_for("relay stopped").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_with_an_untrusted_certificate_is_named_as_the_cause() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let cfg = tls_config(dir.path(), "");
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    // No CA given: iroh's relay client never gets a relay, and says nothing at the
    // default level; the bridge asks the relay itself and names the certificate.
    let b = bridge_via(&Tb::new(None), relay.url.as_str(), None).await;
    let line =
        b.banner.lines().find(|l| l.trim_start().starts_with("Relay:")).unwrap_or_default().to_string();
    assert!(
        line.contains("NOT reachable") && line.contains("its TLS certificate is not trusted"),
        "{}",
        b.banner
    );
    assert!(line.contains("THUNDERBOLT_IROH_RELAY_CA"), "what to do next: {line}");
    b.log.wait_for("its TLS certificate is not trusted").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_device_the_relay_refuses_is_told_so_not_timed_out() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let home = Tb::new(None);
    let bridge_id = home.node_id("acp").await;
    let allow = dir.path().join("allowlist");
    std::fs::write(&allow, format!("{bridge_id}\n")).unwrap();
    let cfg = write_config(
        dir.path(),
        &format!("http_bind_addr = \"127.0.0.1:0\"\n[access]\nallow_file = \"{}\"\n", allow.display()),
    );
    let relay = Relay::start(&["--config", cfg.to_str().unwrap()]).await;
    let phone = Tb::with_relay_url(&relay.url);
    home.allow(&phone.node_id("acp").await).await;
    let bridge = bridge_via(&home, relay.url.as_str(), None).await;
    let ticket = EndpointTicket::new(relay_only(&bridge.ticket)).to_string();
    let t0 = std::time::Instant::now();
    let out = phone.run(&["acp", "connect", "--dial-timeout", "25", &ticket]).await;
    // Told as soon as the relay said no, not after the dial timeout.
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "took {:?}", t0.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let phone_id = phone.node_id("acp").await;
    assert!(
        err.contains(&format!("the relay {} refused this device: not in the allow file", relay.url))
            && err.contains(&format!("ask its operator to allow this device ({phone_id})")),
        "{err}"
    );
    assert!(!err.contains("timed out"), "{err}");
}
