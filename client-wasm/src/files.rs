//! Files to and from the workstation (`thunderbolt/<p>/files1`, the wire in
//! `thunderbolt_shared::files`): a put is hashed and encoded here (bao-tree's
//! verified encoding: the bridge checks every 16 KiB group against the hash
//! before it writes a byte, and resumes from what it holds), a get is checked
//! group by group before the page sees a byte, and resumes from the last
//! group checked after a cut path.

use bao_tree::{
    io::{
        outboard::PreOrderOutboard,
        sync::{encode_ranges_validated, CreateOutboard, DecodeResponseIter},
        BaoContentItem, DecodeError, Leaf,
    },
    BaoTree, BlockSize, ChunkNum, ChunkRanges,
};
use iroh::endpoint::RecvStream;
use js_sys::{Function, Object, Reflect, Uint8Array, JSON};
use thunderbolt_shared::{
    files::{self as wire, files_alpn, BLOCK_CHUNK_LOG, MAX_REQUEST_LINE},
    Protocol,
};
use wasm_bindgen::prelude::*;

use crate::{
    client::{ClientInner, ConnInner},
    dialing::dial,
    errors::ErrorKind,
    js::{input_error, js_error, op_error, opt, set},
};

/// Largest file a page moves: it holds the file (and its encoding) in
/// memory at once, and a phone tab has a few hundred MiB.
const MAX_PAGE_FILE: u64 = 256 << 20;
/// Bytes written to the stream between progress reports.
const WRITE_SLICE: usize = 256 * 1024;

fn block() -> BlockSize {
    BlockSize::from_chunk_log(BLOCK_CHUNK_LOG)
}

fn protocol(p: Option<String>) -> Result<Protocol, JsValue> {
    p.as_deref().unwrap_or("acp").parse().map_err(input_error)
}

fn progress(on: &Option<Function>, done: u64, total: u64) {
    if let Some(f) = on {
        let _ = f.call2(&JsValue::NULL, &(done as f64).into(), &(total as f64).into());
    }
}

/// What a put asks for, from the page.
pub(crate) struct PutArgs {
    pub name: String,
    pub mime: Option<String>,
    pub session: Option<String>,
    pub protocol: Option<String>,
    pub timeout_ms: Option<u32>,
    pub on_progress: Option<Function>,
}

/// Puts `bytes` on the workstation; resolves with the receipt
/// `{name, size, hash, uri, mime?, sent, resumedFrom}`. The lines are JSON
/// made and read by the browser's own `JSON` (no serializer in the module).
pub(crate) async fn put(
    client: &ClientInner,
    target: &str,
    bytes: Vec<u8>,
    a: PutArgs,
) -> Result<JsValue, JsValue> {
    wire::check_name(&a.name)
        .map_err(|why| input_error(format!("a file whose name {why} cannot be sent")))?;
    let size = bytes.len() as u64;
    if size > MAX_PAGE_FILE {
        return Err(input_error(format!(
            "{} is larger than the {} MiB a page sends",
            a.name,
            MAX_PAGE_FILE >> 20
        )));
    }
    let tree = PreOrderOutboard::<Vec<u8>>::create_sized(&bytes[..], size, block()).map_err(input_error)?;
    let hash = tree.root.to_hex().to_string();
    let c = dial(client, target, files_alpn(&protocol(a.protocol)?), a.timeout_ms).await?;
    let put = Object::new();
    set(&put, "name", a.name.into());
    set(&put, "size", (size as f64).into());
    set(&put, "hash", hash.as_str().into());
    set(&put, "session", a.session.into());
    set(&put, "mime", a.mime.into());
    c.write(&line("put", put)?).await?;
    let mut recv = Lines::new(c.take_recv()?);
    let have = recv.reply(&c, "have").await?.as_f64().map(|k| k as u64).filter(|k| *k <= size);
    let have =
        have.ok_or_else(|| js_error(&ErrorKind::Frame, "the bridge's answer to a put is malformed"))?;
    progress(&a.on_progress, have, size);
    let mut encoded = Vec::with_capacity((size - have) as usize + (size - have) as usize / 200 + 1024);
    if have < size {
        encode_ranges_validated(&bytes[..], &tree, &ChunkRanges::from(ChunkNum(have / 1024)..), &mut encoded)
            .map_err(|e| input_error(format!("cannot encode the file: {e}")))?;
    }
    drop(bytes);
    let total = encoded.len().max(1) as u64;
    for (i, slice) in encoded.chunks(WRITE_SLICE).enumerate() {
        c.write(slice).await?;
        let done = ((i * WRITE_SLICE + slice.len()) as u64).min(total);
        progress(&a.on_progress, have + (size - have) * done / total, size);
    }
    c.finish().await?;
    let receipt = recv.reply(&c, "receipt").await?;
    c.close();
    if opt(&receipt, "hash").as_string().as_deref() != Some(hash.as_str()) {
        return Err(js_error(&ErrorKind::Frame, "the bridge's receipt is for other content"));
    }
    set(&receipt, "sent", (encoded.len() as f64).into());
    set(&receipt, "resumedFrom", (have as f64).into());
    Ok(receipt)
}

/// Gets the file `uri` names; resolves with `{name, size, hash, from,
/// bytes, resumedFrom}` once every group was checked against its hash. A
/// path cut after the bridge's header (a relay or the host restarting) is
/// dialed again and the rest asked for from the last group checked (at most
/// [`GET_RESUMES`] times); a file that changed meanwhile is refused.
pub(crate) async fn get(
    client: &ClientInner,
    target: &str,
    uri: String,
    p: Option<String>,
    timeout_ms: Option<u32>,
    on_progress: Option<Function>,
) -> Result<JsValue, JsValue> {
    let alpn = files_alpn(&protocol(p)?);
    let mut got = Got::default();
    let mut resumes = 0;
    loop {
        match got.attempt(client, target, &uri, &alpn, timeout_ms, &on_progress).await {
            Ok(header) => {
                set(&header, "bytes", Uint8Array::from(&got.bytes[..]).into());
                set(&header, "resumedFrom", (got.resumed_from as f64).into());
                return Ok(header);
            }
            // A cut path after the header: asked again from what was checked.
            Err(Attempt::Cut(_)) if got.header.is_some() && resumes < GET_RESUMES => {
                resumes += 1;
                n0_future::time::sleep(RESUME_PAUSE).await;
            }
            Err(Attempt::Cut(e) | Attempt::Final(e)) => return Err(e),
        }
    }
}

/// Times a get is asked again after its path was cut (a relay or the host
/// restarting): each time from the last group checked.
const GET_RESUMES: u32 = 5;
/// Before each: a host that restarts takes a moment to listen again.
const RESUME_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// How one attempt at a get ended, when not with the whole file.
enum Attempt {
    /// The path was cut: what arrived was kept, the rest may be asked again.
    Cut(JsValue),
    /// A refusal, a lie or a change: asking again would not help.
    Final(JsValue),
}

/// A get's progress: the file's header once known, its bytes, how much of
/// it was checked (a whole number of groups, or all of it).
#[derive(Default)]
struct Got {
    header: Option<(u64, String)>,
    bytes: Vec<u8>,
    have: u64,
    resumed_from: u64,
}

impl Got {
    /// Asks for the file from what is held, reads and checks what comes.
    async fn attempt(
        &mut self,
        client: &ClientInner,
        target: &str,
        uri: &str,
        alpn: &[u8],
        timeout_ms: Option<u32>,
        on_progress: &Option<Function>,
    ) -> Result<JsValue, Attempt> {
        let c = dial(client, target, alpn.to_vec(), timeout_ms).await.map_err(Attempt::Cut)?;
        let get = Object::new();
        set(&get, "uri", uri.into());
        if let Some((_, hash)) = &self.header {
            set(&get, "hash", hash.as_str().into());
            set(&get, "from", (self.have as f64).into());
        }
        let cut = Attempt::Cut;
        c.write(&line("get", get).map_err(Attempt::Final)?).await.map_err(cut)?;
        c.finish().await.map_err(cut)?;
        let mut recv = Lines::new(c.take_recv().map_err(cut)?);
        let header = recv.reply(&c, "file").await.map_err(|e| {
            // A refusal in words is final; a cut before the answer is not.
            if Reflect::get(&e, &"code".into()).ok().and_then(|v| v.as_f64())
                == Some(thunderbolt_shared::close::CLOSE_CODE_REFUSED as f64)
            {
                Attempt::Final(e)
            } else {
                Attempt::Cut(e)
            }
        })?;
        let size = opt(&header, "size").as_f64().unwrap_or(-1.0);
        let hash = opt(&header, "hash").as_string().unwrap_or_default();
        let from = opt(&header, "from").as_f64().unwrap_or(-1.0);
        let frame = |why: &str| Attempt::Final(js_error(&ErrorKind::Frame, why));
        if !(0.0..=MAX_PAGE_FILE as f64).contains(&size)
            || !wire::is_hash(&hash)
            || !(0.0..=size).contains(&from)
        {
            return Err(frame("the file is larger than a page takes, or the answer is malformed"));
        }
        let (size, from) = (size as u64, from as u64);
        match &self.header {
            None if from != 0 => return Err(frame("the bridge's answer is malformed")),
            None => {
                self.bytes = vec![0u8; size as usize];
                self.header = Some((size, hash.clone()));
            }
            Some((s, h)) if (*s, h.as_str()) != (size, hash.as_str()) => {
                return Err(frame("the file changed on the workstation while it was fetched"))
            }
            Some(_) if from > self.have => return Err(frame("the bridge's answer is malformed")),
            Some(_) => self.resumed_from = from,
        }
        self.have = from;
        // The encoding from `from` on: the file's rest and 64 bytes of tree per group.
        let rest = size - from;
        let most = rest + rest / 200 + 1024;
        let mut encoded = std::mem::take(&mut recv.buf);
        let mut chunk = vec![0u8; WRITE_SLICE];
        let ended = loop {
            match recv.stream.read(&mut chunk).await {
                Ok(Some(n)) => {
                    encoded.extend_from_slice(&chunk[..n]);
                    if encoded.len() as u64 > most {
                        return Err(frame("the bridge sent more than the file"));
                    }
                    progress(on_progress, (from + encoded.len() as u64).min(size), size);
                }
                Ok(None) => break None,
                Err(e) => break Some(op_error(&c.conn, &c.me, e)),
            }
        };
        c.close();
        self.check(&encoded, &hash)?;
        match ended {
            _ if self.have >= size => Ok(header),
            Some(e) => Err(Attempt::Cut(e)),
            None => Err(frame("the bridge ended the file early")),
        }
    }

    /// Checks the groups of `encoded` (from `have` on) against the file's
    /// hash, keeping each one that holds; a truncated end stops it.
    fn check(&mut self, encoded: &[u8], hash: &str) -> Result<(), Attempt> {
        let Some((size, _)) = self.header else { return Ok(()) };
        let root = blake3::Hash::from_hex(hash).map_err(|e| Attempt::Final(input_error(e)))?;
        let mismatch = || Attempt::Final(js_error(&ErrorKind::Frame, "the file does not match its hash"));
        if size == 0 {
            return if root == blake3::hash(b"") { Ok(()) } else { Err(mismatch()) };
        }
        let ranges = ChunkRanges::from(ChunkNum(self.have / 1024)..);
        for item in DecodeResponseIter::new(root, BaoTree::new(size, block()), encoded, &ranges) {
            match item {
                Ok(BaoContentItem::Leaf(Leaf { offset, data })) => {
                    let end = offset as usize + data.len();
                    self.bytes[offset as usize..end].copy_from_slice(&data);
                    self.have = end as u64;
                }
                Ok(BaoContentItem::Parent(_)) => {}
                Err(DecodeError::LeafHashMismatch(_) | DecodeError::ParentHashMismatch(_)) => {
                    return Err(mismatch())
                }
                // What arrived ends here (a group or a node cut short): the rest is asked again.
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }
}

/// `{"<kind>": fields}` and a newline.
fn line(kind: &str, fields: Object) -> Result<Vec<u8>, JsValue> {
    let request = Object::new();
    set(&request, kind, fields.into());
    let mut l = String::from(JSON::stringify(&request)?).into_bytes();
    if l.len() >= MAX_REQUEST_LINE {
        return Err(input_error("the request is too long"));
    }
    l.push(b'\n');
    Ok(l)
}

/// The bridge's reply lines, and what came after the last one read.
struct Lines {
    stream: RecvStream,
    buf: Vec<u8>,
}

impl Lines {
    fn new(stream: RecvStream) -> Self {
        Self { stream, buf: Vec::new() }
    }

    /// The next reply line's `want` field; a refusal (`error`) rejects with
    /// the bridge's reason. No timer of its own: a bridge that stops
    /// answering is a connection that goes idle, and that ends it.
    async fn reply(&mut self, c: &ConnInner, want: &str) -> Result<JsValue, JsValue> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(end + 1);
                let line = std::mem::replace(&mut self.buf, rest);
                let v = JSON::parse(&String::from_utf8_lossy(&line))
                    .map_err(|_| js_error(&ErrorKind::Frame, "the bridge's answer is unreadable"))?;
                if let Some(why) = opt(&v, "error").as_string() {
                    let code = thunderbolt_shared::close::CLOSE_CODE_REFUSED as u64;
                    return Err(js_error(&ErrorKind::Closed { code, reason: why.clone() }, &why));
                }
                let field = Reflect::get(&v, &want.into()).unwrap_or_default();
                if field.is_undefined() {
                    return Err(js_error(&ErrorKind::Frame, &format!("the bridge's answer has no {want}")));
                }
                return Ok(field);
            }
            if self.buf.len() > MAX_REQUEST_LINE {
                return Err(js_error(&ErrorKind::Frame, "the bridge's answer is too long"));
            }
            let mut chunk = [0u8; 1024];
            match self.stream.read(&mut chunk).await {
                Ok(Some(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(None) => {
                    return Err(js_error(&ErrorKind::Frame, "the bridge ended the transfer without a word"))
                }
                Err(e) => return Err(op_error(&c.conn, &c.me, e)),
            }
        }
    }
}
