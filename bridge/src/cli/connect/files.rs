//! `thunderbolt files put|get <ticket> …`: files to and from the
//! workstation over the device's own connection (`thunderbolt/<p>/files1`,
//! the wire in [`thunderbolt_shared::files`]), each checked against its
//! BLAKE3 hash as it arrives; run again after a cut, a transfer resumes.

use std::{
    fs::{File, OpenOptions},
    io::BufWriter,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{anyhow, bail, Context, Result};
use iroh::endpoint::{Connection, RecvStream, VarInt};
use serde_json::json;
use thunderbolt_shared::{
    close,
    files::{self as wire, FileHeader, Get, Put, Reply, Request, MAX_REQUEST_LINE},
    Protocol,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::io::SyncIoBridge;

use super::{
    describe_close,
    dial::{dial_one, with_relay_hint, Dial},
    not_ourselves, CLOSE_FLUSH_TIMEOUT,
};
use crate::{
    cli::args::{FilesCmd, FilesDialArgs},
    files::stream,
    home::Home,
    identity, limits,
};

/// How long the bridge may take to answer a request (it hashes a file it
/// sends first: a few seconds for gigabytes).
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// Buffer between the blocking encoder and the stream.
const IO_BUFFER: usize = 256 * 1024;

/// `thunderbolt files put|get`.
pub async fn files(home: &Home, cmd: FilesCmd) -> Result<()> {
    match cmd {
        FilesCmd::Put(a) => {
            let conn = connect(home, &a.target, &a.dial).await?;
            let mut failed = 0;
            for path in &a.files {
                match put(&conn.conn, path, a.session.as_deref()).await {
                    Ok(line) => println!("{line}"),
                    Err(e) => {
                        failed += 1;
                        eprintln!("thunderbolt: {}: {:#}", path.display(), conn.why(e));
                    }
                }
            }
            conn.close().await;
            if failed > 0 {
                bail!("{failed} of {} file(s) did not arrive", a.files.len());
            }
            Ok(())
        }
        FilesCmd::Get(a) => {
            let conn = connect(home, &a.target, &a.dial).await?;
            let r = get(&conn.conn, &a.uri, a.out.as_deref()).await.map_err(|e| conn.why(e));
            conn.close().await;
            println!("{}", r?);
            Ok(())
        }
    }
}

/// A files connection and the endpoint it runs on.
struct Connected {
    conn: Connection,
    ep: iroh::Endpoint,
    protocol: Protocol,
}

impl Connected {
    async fn close(self) {
        self.conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
        crate::net::close_endpoint(self.ep, CLOSE_FLUSH_TIMEOUT).await;
    }

    /// What went wrong: the bridge's words first when it closed the
    /// connection, then what that did to the transfer.
    fn why(&self, e: anyhow::Error) -> anyhow::Error {
        match self.conn.close_reason() {
            Some(err) => anyhow!("{} ({e:#})", describe_close(&err, &self.protocol)),
            None => e,
        }
    }
}

async fn connect(home: &Home, target: &str, a: &FilesDialArgs) -> Result<Connected> {
    let protocol: Protocol = a.protocol.parse().map_err(|e| anyhow!("--protocol: {e}"))?;
    let net = a.net.config()?;
    let target = with_relay_hint(target.parse()?, &net.relays);
    let (key, _) = identity::load_or_create(home, &Protocol::acp())?;
    not_ourselves(home, &target, &key, &protocol)?;
    let ep = net.bind(key, vec![], limits::IDLE_TIMEOUT).await?;
    let d = Dial { ep: &ep, target: &target, protocol: &protocol, net: &net };
    let dialed = dial_one(d, &wire::files_alpn(&protocol), a.dial_timeout, || {
        anyhow!("{} takes no files (an older version of thunderbolt): update it", target.id())
    })
    .await;
    match dialed {
        Ok(conn) => Ok(Connected { conn, ep, protocol }),
        Err(e) => {
            crate::net::close_endpoint(ep, CLOSE_FLUSH_TIMEOUT).await;
            Err(e)
        }
    }
}

/// Puts one file; returns its receipt line.
async fn put(conn: &Connection, path: &Path, session: Option<&str>) -> Result<String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("the file's name is not UTF-8"))?
        .to_string();
    wire::check_name(&name).map_err(|why| anyhow!("cannot send a file whose name {why}: rename it"))?;
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        bail!("not a file");
    }
    let size = meta.len();
    let (file, tree) = tokio::task::spawn_blocking(move || stream::hash_tree(&file, size).map(|t| (file, t)))
        .await?
        .context("cannot read it")?;
    let hash = stream::hex(&tree);
    let request = Request::Put(Put {
        name,
        size,
        hash: hash.clone(),
        session: session.map(str::to_string),
        mime: mime_of(path).map(str::to_string),
    });
    let (mut send, recv) = conn.open_bi().await.map_err(|e| anyhow!("the connection broke: {e}"))?;
    send.write_all(&line(&request)?).await?;
    let mut reader = BufReader::new(recv);
    let have = match read_reply(&mut reader).await? {
        Reply::Have(k) if k <= size => k,
        Reply::Error(why) => bail!("refused: {why}"),
        other => bail!("the bridge answered {other:?} to a put"),
    };
    let handle = tokio::runtime::Handle::current();
    let sent = tokio::task::spawn_blocking(move || -> Result<(u64, iroh::endpoint::SendStream)> {
        let out = stream::CountedWrite { inner: SyncIoBridge::new_with_handle(send, handle), count: 0 };
        let mut out = BufWriter::with_capacity(IO_BUFFER, out);
        stream::send(&file, &tree, have, &mut out)?;
        let out = out.into_inner().map_err(|e| e.into_error())?;
        Ok((out.count, out.inner.into_inner()))
    })
    .await?;
    let (sent, mut send) = sent.context("sending it")?;
    send.finish()?;
    match read_reply(&mut reader).await? {
        Reply::Receipt(r) if r.hash == hash && r.size == size => {
            let mut v = serde_json::to_value(&r)?;
            v["sent"] = json!(sent);
            v["resumed_from"] = json!(have);
            Ok(v.to_string())
        }
        Reply::Receipt(r) => {
            bail!("the bridge's receipt is for other content ({} bytes, {})", r.size, r.hash)
        }
        Reply::Error(why) => bail!("refused: {why}"),
        other => bail!("the bridge answered {other:?} to a put"),
    }
}

/// Gets one file; returns the line that says what arrived.
async fn get(conn: &Connection, uri: &str, out: Option<&Path>) -> Result<String> {
    let out: PathBuf = match out {
        Some(o) => o.to_path_buf(),
        None => {
            let path = crate::files::uri_path(uri).ok_or_else(|| anyhow!("not a file:// URI: {uri}"))?;
            PathBuf::from(path.file_name().ok_or_else(|| anyhow!("the URI names no file"))?)
        }
    };
    let part = with_suffix(&out, ".part");
    let part_hash = with_suffix(&out, ".part.b3");
    // What this device holds already: a whole copy, or part of one.
    let (hash, from) = if out.exists() {
        let f = File::open(&out).with_context(|| format!("cannot read {}", out.display()))?;
        let size = f.metadata()?.len();
        let tree = tokio::task::spawn_blocking(move || stream::hash_tree(&f, size)).await??;
        (Some(stream::hex(&tree)), size)
    } else {
        match (std::fs::read_to_string(&part_hash), std::fs::metadata(&part)) {
            (Ok(h), Ok(m)) if wire::is_hash(h.trim()) => (Some(h.trim().to_string()), m.len()),
            _ => (None, 0),
        }
    };
    let request = Request::Get(Get { uri: uri.to_string(), hash: hash.clone(), from });
    let (mut send, recv) = conn.open_bi().await.map_err(|e| anyhow!("the connection broke: {e}"))?;
    send.write_all(&line(&request)?).await?;
    send.finish()?;
    let mut reader = BufReader::with_capacity(IO_BUFFER, recv);
    let header: FileHeader = match read_reply(&mut reader).await? {
        Reply::File(h) => h,
        Reply::Error(why) => bail!("refused: {why}"),
        other => bail!("the bridge answered {other:?} to a get"),
    };
    if !wire::is_hash(&header.hash) || header.from > header.size {
        bail!("the bridge's answer is malformed");
    }
    let summary = |path: &Path, received: u64| {
        json!({
            "name": header.name, "size": header.size, "hash": header.hash,
            "path": path.display().to_string(), "received": received, "resumed_from": header.from,
        })
        .to_string()
    };
    if out.exists() {
        if hash.as_deref() == Some(header.hash.as_str()) && header.from == header.size {
            return Ok(summary(&out, 0));
        }
        bail!("{} exists with other content: remove it or name another OUT", out.display());
    }
    let resuming = hash.as_deref() == Some(header.hash.as_str()) && header.from > 0;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(!resuming)
        .mode(0o600)
        .open(&part)
        .with_context(|| format!("cannot write {}", part.display()))?;
    file.set_len(if resuming { header.from } else { 0 })?;
    std::fs::write(&part_hash, &header.hash)
        .with_context(|| format!("cannot write {}", part_hash.display()))?;
    let (size, h, from) = (header.size, header.hash.clone(), header.from);
    let handle = tokio::runtime::Handle::current();
    let received = tokio::task::spawn_blocking(move || -> Result<u64, stream::StreamError> {
        let mut input = stream::Counted { inner: SyncIoBridge::new_with_handle(reader, handle), count: 0 };
        stream::receive(&file, size, &h, from, &mut input, |_| {})?;
        file.sync_all().map_err(stream::StreamError::File)?;
        Ok(input.count)
    })
    .await?;
    let received = match received {
        Ok(n) => n,
        Err(stream::StreamError::Mismatch(at)) => {
            let _ = std::fs::remove_file(&part);
            let _ = std::fs::remove_file(&part_hash);
            bail!("the bytes from byte {at} do not match the file's hash: nothing kept, try again");
        }
        Err(stream::StreamError::Cut(e)) => bail!(
            "the transfer was cut ({e}); {} keeps what arrived: run the same command again to resume",
            part.display()
        ),
        Err(stream::StreamError::File(e)) => bail!("cannot write {}: {e}", part.display()),
    };
    std::fs::rename(&part, &out).with_context(|| format!("cannot move it to {}", out.display()))?;
    let _ = std::fs::remove_file(&part_hash);
    Ok(summary(&out, received))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn line(request: &Request) -> Result<Vec<u8>> {
    let mut l = serde_json::to_vec(request)?;
    if l.len() >= MAX_REQUEST_LINE {
        bail!("the request is longer than {MAX_REQUEST_LINE} bytes (a path that long?)");
    }
    l.push(b'\n');
    Ok(l)
}

/// One reply line, bounded.
async fn read_reply(reader: &mut BufReader<RecvStream>) -> Result<Reply> {
    let mut buf = Vec::with_capacity(256);
    let read = tokio::time::timeout(
        REPLY_TIMEOUT,
        (&mut *reader).take(MAX_REQUEST_LINE as u64 + 1).read_until(b'\n', &mut buf),
    )
    .await;
    match read {
        Err(_) => bail!("the bridge did not answer within {REPLY_TIMEOUT:?}"),
        Ok(Err(e)) => bail!("the connection broke: {e}"),
        Ok(Ok(0)) => bail!("the bridge ended the transfer without a word"),
        Ok(Ok(_)) => {
            serde_json::from_slice(&buf).map_err(|e| anyhow!("the bridge's answer is unreadable: {e}"))
        }
    }
}

/// The media type a prompt's `resource_link` carries, from the file's
/// extension (what phones and agents send most).
fn mime_of(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "html" => "text/html",
        "mp4" => "video/mp4",
        "mov" => "video/quicktime",
        "zip" => "application/zip",
        _ => return None,
    })
}
