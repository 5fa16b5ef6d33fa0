//! The browser's TLS provider: ring's, with ChaCha20-Poly1305 first.
//!
//! wasm has no AES instructions, so ring's portable AES-GCM is what a page
//! spent a quarter of its time in during bulk transfers; ChaCha20 is built for
//! software. The bridge's rustls follows the client's order, so native peers
//! keep AES-GCM with hardware. AES-128-GCM stays in the list: QUIC's initial
//! packets need it.
//!
//! iroh does not report which suite a QUIC connection negotiated (its
//! handshake data has the ALPN and the key exchange group only), so the test
//! below runs the same rustls negotiation in memory against a server set up
//! as iroh sets up the bridge's (TLS 1.3 only, ring's default provider).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub fn browser_crypto() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    Arc::new(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{
        pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName},
        CipherSuite, ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection,
    };

    /// The suite a client with `client` negotiates with a bridge-like server.
    fn negotiated(client: Arc<CryptoProvider>) -> CipherSuite {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["bridge.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let server = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let config = ClientConfig::builder_with_provider(client)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut c =
            ClientConnection::new(Arc::new(config), ServerName::try_from("bridge.test").unwrap()).unwrap();
        let mut s = ServerConnection::new(Arc::new(server)).unwrap();
        // Bounded: a TLS 1.3 handshake is two flights each way.
        for _ in 0..16 {
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets().unwrap();
            let mut wire = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut wire).unwrap();
            }
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!c.is_handshaking(), "the handshake completed");
        let suite = c.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(Some(suite), s.negotiated_cipher_suite().map(|s| s.suite()));
        suite
    }

    #[test]
    fn the_browser_negotiates_chacha20_poly1305_with_a_bridge() {
        assert_eq!(negotiated(browser_crypto()), CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
        // The control: ring's own order gets AES-GCM from the same server, so
        // it is the client's order that decides.
        let native = negotiated(Arc::new(rustls::crypto::ring::default_provider()));
        assert_ne!(native, CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    }
}
