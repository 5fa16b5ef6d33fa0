//! The relay's http(s) listener when it also serves the app ([`crate::app_files`]).
//!
//! iroh-relay's `Server::spawn` takes no extra routes (its route builder is
//! private to the crate), but the crate exposes the pieces it is built from for
//! embedding: `RelayService::new(handlers, …)` with a public `Handlers` map of
//! exact (method, path) routes, and `RelayService::handle_connection` for one
//! accepted TCP stream (TLS, the relay's WebSocket upgrade, its timeouts). So
//! with an app directory this module binds the listener, hands each connection
//! to that service, and registers the app's files (and the relay's own small
//! pages, which are private to iroh-relay and rewritten here) as routes. The
//! relay protocol itself, access control, rate limits and QUIC are iroh-relay's.
//!
//! A certificate from LetsEncrypt cannot be used this way (iroh-relay keeps its
//! ACME acceptor to itself): `app_dir` needs `cert_mode = "Manual"`.

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper::{
    body::{Bytes, Frame, Incoming, SizeHint},
    header, http, HeaderMap, Method, Request, Response, StatusCode,
};
use iroh_relay::server::{
    http_server::{BytesBody, HyperError, HyperResult, TlsConfig},
    ClientRateLimit, Handlers, Metrics, RelayService,
};
use tokio::{net::TcpListener, task::JoinSet};
use tracing::{debug, info, warn};

use crate::app_files::{self, AppFile, AppFiles};

/// As iroh-relay's own listener: a connection that has not become a relay
/// connection by then is closed (this also ends idle keep-alive connections of
/// a browser that fetched the app).
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a browser may cache the app's files before asking again: short, so
/// an upgraded app reaches phones within minutes, long enough to not fetch the
/// 2 MB module on every navigation.
const APP_CACHE_CONTROL: &str = "public, max-age=300";

/// As iroh-relay sends on its https listener (two years of HSTS).
const HSTS: &str = "max-age=63072000; includeSubDomains";

/// A body sent in one piece (iroh-relay's body helpers are private).
struct OnceBody(Option<Bytes>);

impl hyper::body::Body for OnceBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

fn body(b: impl Into<Bytes>) -> BytesBody {
    Box::new(OnceBody(Some(b.into())))
}

fn empty() -> BytesBody {
    Box::new(OnceBody(None))
}

fn done(r: Result<Response<BytesBody>, http::Error>) -> HyperResult<Response<BytesBody>> {
    r.map_err(|e| Box::new(e) as HyperError)
}

/// Adds a GET and a HEAD route (HEAD: the same headers, no body).
fn route(
    handlers: &mut Handlers,
    path: &'static str,
    make: impl Fn(&Request<Incoming>, http::response::Builder) -> (http::response::Builder, Bytes)
        + Send
        + Sync
        + Clone
        + 'static,
) {
    let get = make.clone();
    handlers.insert(
        (Method::GET, path),
        Box::new(move |req, res| {
            let (res, b) = get(&req, res);
            done(res.header(header::CONTENT_LENGTH, b.len()).body(body(b)))
        }),
    );
    handlers.insert(
        (Method::HEAD, path),
        Box::new(move |req, res| {
            let (res, b) = make(&req, res);
            done(res.header(header::CONTENT_LENGTH, b.len()).body(empty()))
        }),
    );
}

/// The routes: the relay's own small pages, the captive-portal probe when
/// plain http, the app's files, its redirects and `relay.json`.
pub fn handlers(app: &AppFiles, plain_http: bool) -> Handlers {
    let mut h = Handlers::default();
    let text = |status: StatusCode, t: &'static str| {
        move |_: &Request<Incoming>, res: http::response::Builder| {
            (res.status(status).header(header::CONTENT_TYPE, "text/plain; charset=utf-8"), Bytes::from(t))
        }
    };
    route(&mut h, "/", text(StatusCode::OK, "thunderbolt-relay: an iroh relay. The app is at /app/www/\n"));
    route(&mut h, "/robots.txt", text(StatusCode::OK, "User-agent: *\nDisallow: /\n"));
    route(&mut h, "/healthz", text(StatusCode::OK, "ok\n"));
    // Clients measure latency with it, browsers from other origins too.
    h.insert(
        (Method::GET, iroh_relay::http::RELAY_PROBE_PATH),
        Box::new(|_, res| done(res.header("Access-Control-Allow-Origin", "*").body(empty()))),
    );
    if plain_http {
        h.insert((Method::GET, "/generate_204"), Box::new(|req, res| done(no_content(&req, res))));
    }
    route(&mut h, app_files::RELAY_JSON_PATH, |_, res| {
        (
            res.header(header::CONTENT_TYPE, "application/json").header(header::CACHE_CONTROL, "no-cache"),
            Bytes::from_static(app_files::RELAY_JSON.as_bytes()),
        )
    });
    for path in app_files::redirects() {
        route(&mut h, path, |req, res| {
            let to = match req.uri().query() {
                Some(q) => format!("{}?{q}", app_files::PAGE),
                None => app_files::PAGE.to_string(),
            };
            (res.status(StatusCode::FOUND).header(header::LOCATION, to), Bytes::new())
        });
    }
    for (path, file) in app.iter() {
        // Routes are keyed by `&'static str`: each path is kept for the
        // process's life, once, at start (at most MAX_FILES of them).
        let path: &'static str = Box::leak(path.clone().into_boxed_str());
        let AppFile { content_type, body } = file.clone();
        route(&mut h, path, move |_, res| {
            (
                res.header(header::CONTENT_TYPE, content_type)
                    .header(header::CACHE_CONTROL, APP_CACHE_CONTROL)
                    .header("X-Content-Type-Options", "nosniff"),
                body.clone(),
            )
        });
    }
    h
}

/// The captive-portal probe (`/generate_204`), as iroh-relay answers it: the
/// client's challenge echoed when it is short and plain.
fn no_content<B>(
    req: &Request<B>,
    mut res: http::response::Builder,
) -> Result<Response<BytesBody>, http::Error> {
    let challenge = req.headers().get("X-Iroh-Challenge").and_then(|c| c.to_str().ok()).filter(|c| {
        !c.is_empty() && c.len() < 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    });
    if let Some(c) = challenge {
        res = res.header("X-Iroh-Response", format!("response {c}"));
    }
    res.status(StatusCode::NO_CONTENT).body(empty())
}

/// What the embedded listener needs from the relay's config.
pub struct Options {
    pub bind: SocketAddr,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub client_rx: Option<ClientRateLimit>,
    pub key_cache_capacity: usize,
    pub access: Arc<dyn iroh_relay::server::DynAccessControl>,
    pub metrics: Arc<Metrics>,
}

/// The running listener.
pub struct AppRelay {
    pub addr: SocketAddr,
    pub service: RelayService,
    accept: tokio::task::JoinHandle<()>,
}

impl AppRelay {
    pub async fn spawn(app: &AppFiles, o: Options) -> std::io::Result<Self> {
        let mut headers = HeaderMap::new();
        if o.tls.is_some() {
            headers.insert(header::STRICT_TRANSPORT_SECURITY, header::HeaderValue::from_static(HSTS));
        }
        let service = RelayService::new(
            handlers(app, o.tls.is_none()),
            headers,
            o.client_rx,
            iroh_relay::KeyCache::new(o.key_cache_capacity),
            o.access,
            o.metrics,
        );
        let listener = TcpListener::bind(o.bind).await?;
        let addr = listener.local_addr()?;
        let tls = o.tls.map(TlsConfig::new);
        let svc = service.clone();
        let accept = tokio::spawn(async move {
            // Dropped with the task, which aborts every connection still open.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    Some(_) = conns.join_next() => {}
                    res = listener.accept() => match res {
                        Ok((stream, peer)) => {
                            debug!(%peer, "connection");
                            conns.spawn(svc.clone().handle_connection(stream, tls.clone(), ESTABLISH_TIMEOUT));
                        }
                        Err(e) => {
                            warn!("accept failed: {e}");
                            // Out of file descriptors, most likely: give closing connections a moment.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        });
        info!(files = app.len(), bytes = app.total_bytes(), "serving the app under {}", app_files::PREFIX);
        Ok(AppRelay { addr, service, accept })
    }

    pub async fn shutdown(self) {
        self.accept.abort();
        self.service.shutdown().await;
    }
}

/// With TLS, plain http only answers the captive-portal probe (as iroh-relay's
/// own server does): never the relay, never the app.
pub async fn spawn_captive_portal(
    bind: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                Some(_) = conns.join_next() => {}
                res = listener.accept() => {
                    let Ok((stream, _)) = res else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    conns.spawn(async move {
                        let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                            let res = if req.uri().path() == "/generate_204" {
                                no_content(&req, Response::builder())
                            } else {
                                Response::builder().status(StatusCode::NOT_FOUND).body(body("Not Found"))
                            };
                            // Static headers: building cannot fail; an empty 204 if it did.
                            Ok::<_, Infallible>(res.unwrap_or_else(|_| Response::new(empty())))
                        });
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
                        let _ = tokio::time::timeout(ESTABLISH_TIMEOUT, conn).await;
                    });
                }
            }
        }
    });
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One HTTP/1.1 request with the path sent byte for byte (no client to
    /// normalise it), the response's head and body as text.
    async fn get(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (head.to_lowercase(), body.to_string())
    }

    #[tokio::test]
    async fn the_listener_serves_the_app_the_relay_pages_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let app = t.path().join("app");
        std::fs::create_dir_all(app.join("www")).unwrap();
        std::fs::create_dir_all(app.join("pkg")).unwrap();
        std::fs::write(app.join("www/index.html"), "<html>page").unwrap();
        std::fs::write(app.join("pkg/m_bg.wasm"), b"\0asm").unwrap();
        std::fs::write(t.path().join("secret.toml"), "[package]").unwrap();
        let files = AppFiles::load(&app).unwrap();
        let relay = AppRelay::spawn(
            &files,
            Options {
                bind: "127.0.0.1:0".parse().unwrap(),
                tls: None,
                client_rx: None,
                key_cache_capacity: 16,
                access: Arc::new(iroh_relay::server::AllowAll),
                metrics: Arc::default(),
            },
        )
        .await
        .unwrap();
        let a = relay.addr;

        let (head, body) = get(a, "GET", "/app/www/").await;
        assert!(head.starts_with("http/1.1 200") && head.contains("text/html"), "{head}");
        assert_eq!(body, "<html>page");
        let (head, _) = get(a, "GET", "/app/pkg/m_bg.wasm").await;
        assert!(head.contains("content-type: application/wasm"), "{head}");
        let (head, body) = get(a, "HEAD", "/app/www/index.html").await;
        assert!(head.starts_with("http/1.1 200") && head.contains("content-length: 10"), "{head}");
        assert_eq!(body, "");
        let (head, _) = get(a, "GET", "/app/settings/agents?ticket=t").await;
        assert!(head.starts_with("http/1.1 302") && head.contains("location: /app/www/?ticket=t"), "{head}");
        let (_, body) = get(a, "GET", "/app/relay.json").await;
        assert_eq!(body, app_files::RELAY_JSON);
        let (head, _) = get(a, "GET", "/generate_204").await;
        assert!(head.starts_with("http/1.1 204"), "{head}");
        for path in [
            "/app/../secret.toml",
            "/app/%2e%2e/secret.toml",
            "/app/www/..%2f..%2fsecret.toml",
            "/secret.toml",
        ] {
            let (head, body) = get(a, "GET", path).await;
            assert!(head.starts_with("http/1.1 404"), "{path}: {head}");
            assert!(!body.contains("[package]"), "{path}");
        }
        let (head, _) = get(a, "POST", "/app/www/index.html").await;
        assert!(head.starts_with("http/1.1 404"), "{head}");
        relay.shutdown().await;
    }
}
