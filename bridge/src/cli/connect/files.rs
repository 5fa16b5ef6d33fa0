//! `thunderbolt files put|get <ticket> …`: files to and from the
//! workstation over the device's own connection (`thunderbolt/<p>/files1`,
//! the wire in [`thunderbolt_shared::files`]), each checked against its
//! BLAKE3 hash as it arrives; run again after a cut, a transfer resumes.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context, Result};
use iroh::endpoint::{Connection, VarInt};
use serde_json::json;
use thunderbolt_shared::{
    close,
    files::{self as wire, FileHeader, Get, Put},
    Protocol,
};

use super::{
    describe_close,
    dial::{dial_one, with_relay_hint, Dial},
    not_ourselves, CLOSE_FLUSH_TIMEOUT,
};
use crate::{
    cli::args::{FilesCmd, FilesDialArgs},
    files::{
        device::{self, DeviceError},
        stream::{self, StreamError},
    },
    home::Home,
    identity, limits,
};

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
    let request = Put {
        name,
        size,
        hash: stream::hex(&tree),
        session: session.map(str::to_string),
        mime: mime_of(path).map(str::to_string),
    };
    let sent = device::put(conn, request, file, tree, None).await?;
    let mut v = serde_json::to_value(&sent.receipt)?;
    v["sent"] = json!(sent.sent);
    v["resumed_from"] = json!(sent.resumed_from);
    Ok(v.to_string())
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
    let whole = out.exists();
    let (hash, from) = if whole {
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
    let request = Get { uri: uri.to_string(), hash: hash.clone(), from };
    let mut clash = false;
    let open = |header: &FileHeader| -> std::io::Result<Option<File>> {
        if whole {
            // The same content whole here: nothing to move. Other content: not replaced.
            clash = !(hash.as_deref() == Some(header.hash.as_str()) && header.from == header.size);
            return Ok(None);
        }
        let resuming = hash.as_deref() == Some(header.hash.as_str()) && header.from > 0;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!resuming)
            .mode(0o600)
            .open(&part)?;
        file.set_len(if resuming { header.from } else { 0 })?;
        std::fs::write(&part_hash, &header.hash)?;
        Ok(Some(file))
    };
    let got = match device::get(conn, request, open).await {
        Ok(got) => got,
        Err(DeviceError::Stream(StreamError::Mismatch(at))) => {
            let _ = std::fs::remove_file(&part);
            let _ = std::fs::remove_file(&part_hash);
            bail!("the bytes from byte {at} do not match the file's hash: nothing kept, try again");
        }
        Err(DeviceError::Stream(StreamError::Cut(e))) => bail!(
            "the transfer was cut ({e}); {} keeps what arrived: run the same command again to resume",
            part.display()
        ),
        Err(DeviceError::Stream(StreamError::File(e))) => bail!("cannot write {}: {e}", part.display()),
        Err(e) => return Err(e.into()),
    };
    if clash {
        bail!("{} exists with other content: remove it or name another OUT", out.display());
    }
    if !whole {
        std::fs::rename(&part, &out).with_context(|| format!("cannot move it to {}", out.display()))?;
        let _ = std::fs::remove_file(&part_hash);
    }
    let h = &got.header;
    Ok(json!({
        "name": h.name, "size": h.size, "hash": h.hash, "path": out.display().to_string(),
        "received": got.received, "resumed_from": h.from,
    })
    .to_string())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
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
