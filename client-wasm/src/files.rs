//! Files to and from the workstation (`thunderbolt/<p>/files1`, the wire in
//! `thunderbolt_shared::files`): a put is hashed and encoded here (bao-tree's
//! verified encoding: the bridge checks every 16 KiB group against the hash
//! before it writes a byte, and resumes from what it holds), a get is checked
//! group by group before the page sees a byte.

use bao_tree::{
    io::{
        outboard::PreOrderOutboard,
        sync::{encode_ranges_validated, CreateOutboard, DecodeResponseIter},
        BaoContentItem, Leaf,
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
/// bytes}` once every group was checked against its hash.
pub(crate) async fn get(
    client: &ClientInner,
    target: &str,
    uri: String,
    p: Option<String>,
    timeout_ms: Option<u32>,
    on_progress: Option<Function>,
) -> Result<JsValue, JsValue> {
    let c = dial(client, target, files_alpn(&protocol(p)?), timeout_ms).await?;
    let get = Object::new();
    set(&get, "uri", uri.into());
    c.write(&line("get", get)?).await?;
    c.finish().await?;
    let mut recv = Lines::new(c.take_recv()?);
    let header = recv.reply(&c, "file").await?;
    let size = opt(&header, "size").as_f64().unwrap_or(-1.0);
    let hash = opt(&header, "hash").as_string().unwrap_or_default();
    if !(0.0..=MAX_PAGE_FILE as f64).contains(&size)
        || !wire::is_hash(&hash)
        || opt(&header, "from").as_f64() != Some(0.0)
    {
        return Err(js_error(
            &ErrorKind::Frame,
            "the file is larger than a page takes, or the answer is malformed",
        ));
    }
    let size = size as u64;
    // The encoding: the file and 64 bytes of tree per group.
    let most = size + size / 200 + 1024;
    let mut encoded = std::mem::take(&mut recv.buf);
    let mut chunk = vec![0u8; WRITE_SLICE];
    while let Some(n) = recv.stream.read(&mut chunk).await.map_err(|e| op_error(&c.conn, &c.me, e))? {
        encoded.extend_from_slice(&chunk[..n]);
        if encoded.len() as u64 > most {
            return Err(js_error(&ErrorKind::Frame, "the bridge sent more than the file"));
        }
        progress(&on_progress, (encoded.len() as u64).min(size), size);
    }
    c.close();
    let root = blake3::Hash::from_hex(&hash).map_err(input_error)?;
    let mut bytes = vec![0u8; size as usize];
    let mismatch = || js_error(&ErrorKind::Frame, "the file does not match its hash");
    if size > 0 {
        let ranges = ChunkRanges::all();
        for item in DecodeResponseIter::new(root, BaoTree::new(size, block()), &encoded[..], &ranges) {
            match item.map_err(|_| mismatch())? {
                BaoContentItem::Leaf(Leaf { offset, data }) => {
                    bytes[offset as usize..offset as usize + data.len()].copy_from_slice(&data)
                }
                BaoContentItem::Parent(_) => {}
            }
        }
    } else if root != blake3::hash(b"") {
        return Err(mismatch());
    }
    set(&header, "bytes", Uint8Array::from(&bytes[..]).into());
    Ok(header)
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
