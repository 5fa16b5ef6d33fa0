//! A device's side of the wire: one put or one get on a stream of a
//! `/files1` connection (what `thunderbolt files` and the bench drive).
//! Where the bytes come from and go is the caller's.

use std::{fs::File, io::BufWriter, time::Duration};

use bao_tree::io::outboard::PreOrderOutboard;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use thunderbolt_shared::files::{FileHeader, Get, Put, Receipt, Reply, Request, MAX_REQUEST_LINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::io::SyncIoBridge;

use super::{
    segments::Segments,
    stream::{self, Counted, CountedWrite, StreamError},
};

/// How long the bridge may take to answer a request (a get hashes its file
/// first: a few seconds for gigabytes).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// Buffer a request or reply line is read through: the line fits whole
/// (`MAX_REQUEST_LINE`); what follows it goes to the checker as QUIC holds
/// it (`files::segments::Segments`).
const LINE_BUFFER: usize = 8 * 1024;
/// Buffer between the blocking encoder and the stream: a few chunk groups
/// per trip to the runtime.
const SEND_BUFFER: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The bridge said no, and why.
    #[error("refused: {0}")]
    Refused(String),
    /// The connection or the stream broke.
    #[error("the connection broke: {0}")]
    Broken(String),
    #[error("the bridge did not answer within {0:?}")]
    Silent(Duration),
    /// A reply that is not the protocol's.
    #[error("the bridge's answer is unexpected: {0}")]
    Unexpected(String),
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// A put that arrived.
#[derive(Debug)]
pub struct Sent {
    pub receipt: Receipt,
    /// Where this run started (what the bridge held of it already).
    pub resumed_from: u64,
    /// Bytes this run put on the stream.
    pub sent: u64,
}

/// Puts `file` (hashed into `tree`) as `put` describes it; `stop_after`
/// ends the stream after that many encoded bytes (the bench's cut).
pub async fn put(
    conn: &Connection,
    put: Put,
    file: File,
    tree: PreOrderOutboard<Vec<u8>>,
    stop_after: Option<u64>,
) -> Result<Sent, DeviceError> {
    let size = put.size;
    let hash = put.hash.clone();
    let (mut send, recv) = conn.open_bi().await.map_err(|e| DeviceError::Broken(e.to_string()))?;
    write_request(&mut send, &Request::Put(put)).await?;
    let mut reader = BufReader::new(recv);
    let have = match read_reply(&mut reader).await? {
        Reply::Have(k) if k <= size => k,
        Reply::Error(why) => return Err(DeviceError::Refused(why)),
        other => return Err(DeviceError::Unexpected(format!("{other:?} to a put"))),
    };
    let handle = tokio::runtime::Handle::current();
    let sending = tokio::task::spawn_blocking(move || -> Result<(u64, SendStream), StreamError> {
        let out = CountedWrite { inner: SyncIoBridge::new_with_handle(send, handle), count: 0 };
        let mut out = BufWriter::with_capacity(SEND_BUFFER, Limit { inner: out, left: stop_after });
        stream::send(&file, &tree, have, &mut out)?;
        let out = out.into_inner().map_err(|e| StreamError::Cut(e.into_error()))?;
        Ok((out.inner.count, out.inner.inner.into_inner()))
    });
    let (sent, mut send) = sending.await.map_err(|e| DeviceError::Broken(e.to_string()))??;
    send.finish().map_err(|e| DeviceError::Broken(e.to_string()))?;
    match read_reply(&mut reader).await? {
        Reply::Receipt(r) if r.hash == hash && r.size == size => {
            Ok(Sent { receipt: r, resumed_from: have, sent })
        }
        Reply::Receipt(r) => Err(DeviceError::Unexpected(format!(
            "a receipt for other content ({} bytes, {})",
            r.size, r.hash
        ))),
        Reply::Error(why) => Err(DeviceError::Refused(why)),
        other => Err(DeviceError::Unexpected(format!("{other:?} to a put"))),
    }
}

/// A get that arrived whole.
#[derive(Debug)]
pub struct Got {
    pub header: FileHeader,
    /// Bytes this run read off the stream.
    pub received: u64,
}

/// Gets what `get` names; `open` is given the bridge's header and returns
/// the file to write into (holding the header's `from` bytes already), or
/// `None` to stop there (the device holds it all).
pub async fn get(
    conn: &Connection,
    get: Get,
    open: impl FnOnce(&FileHeader) -> std::io::Result<Option<File>>,
) -> Result<Got, DeviceError> {
    let (mut send, recv) = conn.open_bi().await.map_err(|e| DeviceError::Broken(e.to_string()))?;
    write_request(&mut send, &Request::Get(get)).await?;
    let _ = send.finish();
    let mut reader = BufReader::with_capacity(LINE_BUFFER, recv);
    let header = match read_reply(&mut reader).await? {
        Reply::File(h) if thunderbolt_shared::files::is_hash(&h.hash) && h.from <= h.size => h,
        Reply::Error(why) => return Err(DeviceError::Refused(why)),
        other => return Err(DeviceError::Unexpected(format!("{other:?} to a get"))),
    };
    let Some(file) = open(&header).map_err(StreamError::File)? else {
        return Ok(Got { header, received: 0 });
    };
    let (size, hash, from) = (header.size, header.hash.clone(), header.from);
    let handle = tokio::runtime::Handle::current();
    let received = tokio::task::spawn_blocking(move || -> Result<u64, StreamError> {
        let mut input = Counted { inner: Segments::new(reader, handle), count: 0 };
        // Not synced: a copy on the device is fetched again when lost, and a
        // 64 MiB sync cost a quarter of a get's time. What the bridge
        // receives is synced before its receipt.
        stream::receive(&file, size, &hash, from, &mut input, |_| {})?;
        Ok(input.count)
    })
    .await
    .map_err(|e| DeviceError::Broken(e.to_string()))??;
    Ok(Got { header, received })
}

async fn write_request(send: &mut SendStream, request: &Request) -> Result<(), DeviceError> {
    let mut line = serde_json::to_vec(request).map_err(|e| DeviceError::Unexpected(e.to_string()))?;
    if line.len() >= MAX_REQUEST_LINE {
        return Err(DeviceError::Unexpected(format!(
            "a request over {MAX_REQUEST_LINE} bytes (a path that long?)"
        )));
    }
    line.push(b'\n');
    send.write_all(&line).await.map_err(|e| DeviceError::Broken(e.to_string()))
}

/// One reply line, bounded.
async fn read_reply(reader: &mut BufReader<RecvStream>) -> Result<Reply, DeviceError> {
    let mut buf = Vec::with_capacity(256);
    let read = tokio::time::timeout(
        REPLY_TIMEOUT,
        (&mut *reader).take(MAX_REQUEST_LINE as u64 + 1).read_until(b'\n', &mut buf),
    )
    .await;
    match read {
        Err(_) => Err(DeviceError::Silent(REPLY_TIMEOUT)),
        Ok(Err(e)) => Err(DeviceError::Broken(e.to_string())),
        Ok(Ok(0)) => Err(DeviceError::Broken("the bridge ended the transfer without a word".into())),
        Ok(Ok(_)) => serde_json::from_slice(&buf).map_err(|e| DeviceError::Unexpected(e.to_string())),
    }
}

/// A writer that fails once `left` bytes went through it (a cut, on purpose).
struct Limit<W> {
    inner: W,
    left: Option<u64>,
}

impl<W: std::io::Write> std::io::Write for Limit<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = match &mut self.left {
            None => buf.len(),
            Some(0) => return Err(std::io::Error::other("cut on purpose")),
            Some(left) => buf.len().min(*left as usize),
        };
        let n = self.inner.write(&buf[..n])?;
        if let Some(left) = &mut self.left {
            *left -= n as u64;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
