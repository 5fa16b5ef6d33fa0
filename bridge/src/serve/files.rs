//! The files door (`thunderbolt/<p>/files1`, the wire in
//! [`thunderbolt_shared::files`]): one admitted device's transfers, a stream
//! each. Reached after the gate, the handshake and trust like every
//! connection; registered so a revocation or the agent's removal ends it at
//! once. What is stored where, and what a device may get, is
//! [`crate::files`]'s.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use iroh::{
    endpoint::{Connection, RecvStream, SendStream},
    EndpointId,
};
use thunderbolt_shared::{
    close,
    files::{self as wire, FileHeader, Get, Put, Receipt, Reply, Request, MAX_REQUEST_LINE},
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::io::SyncIoBridge;
use tracing::{debug, info, warn};

use super::{
    admit::still_admitted,
    bridge::Shared,
    served::{AgentConfig, AgentName, Served},
    session::{refuse, SessionInfo},
    sessions::{ending::Over, Hub},
};
use crate::files::{
    self,
    inflight::Running,
    reach,
    store::{self, Refusal, Store},
    stream::{self, StreamError},
    REQUEST_TIMEOUT, STALL_TIMEOUT,
};

/// Buffer a request or reply line is read through: the line fits whole
/// (`MAX_REQUEST_LINE`); what follows it goes to the checker as QUIC holds
/// it (`files::segments::Segments`).
const LINE_BUFFER: usize = 8 * 1024;
/// Buffer between the blocking encoder and the stream: a few chunk groups
/// per trip to the runtime.
const SEND_BUFFER: usize = 256 * 1024;
/// How often a transfer is looked at for [`STALL_TIMEOUT`].
const STALL_CHECK: Duration = Duration::from_secs(5);
/// The close reason of a connection whose transfer went quiet.
const REASON_STALLED: &str = "file transfer stalled";
/// Streams a files connection may have open at once: a device's share of
/// transfers, and one more so the stream past it hears why (`too many
/// transfers at once`) instead of waiting for QUIC's credit. A session's
/// connection allows one.
const FILES_STREAMS: u32 = files::MAX_TRANSFERS_PER_DEVICE as u32 + 1;
/// Bytes a files connection may have in flight to the bridge: one stream's
/// window per transfer the device may run (the session's is one stream's).
const FILES_RECEIVE_WINDOW: u32 =
    crate::limits::STREAM_RECEIVE_WINDOW * files::MAX_TRANSFERS_PER_DEVICE as u32;

/// Where files of the bridge's home go, and which transfers run.
#[derive(Debug)]
pub struct FilesState {
    pub store: Store,
    /// The bridge's own folder: never a place a get reaches, but for the
    /// files folder inside it.
    pub home: PathBuf,
    pub in_flight: Arc<files::inflight::InFlight>,
    /// `--keep-files`: a session's files stay after it ended.
    pub keep_files: bool,
    /// The stores agents' manifests put in their workspaces, as they are
    /// used: a device's quota counts what it holds in each.
    pub workspaces: std::sync::Mutex<Vec<Store>>,
    /// Hash trees of files hashed or received, so a get of the same file
    /// again starts at once.
    pub trees: files::trees::Trees,
}

impl FilesState {
    /// Where `cfg`'s agent keeps devices' files: the folder its manifest
    /// names in its workspace, else the home's.
    fn store_for(&self, cfg: &AgentConfig) -> Store {
        let agent = &cfg.session.agent;
        let (Some(dir), Some(workspace)) = (agent.files_folder(), agent.workspace()) else {
            return self.store.clone();
        };
        let store = Store::for_one_agent(workspace, dir);
        let mut known = self.workspaces.lock().unwrap_or_else(|p| p.into_inner());
        if !known.contains(&store) {
            known.push(store.clone());
        }
        store
    }

    /// What `device` holds in every store.
    fn usage(&self, device: &EndpointId) -> store::Usage {
        let others = self.workspaces.lock().unwrap_or_else(|p| p.into_inner()).clone();
        others.iter().fold(self.store.usage(device), |u, s| u.plus(s.usage(device)))
    }

    /// A session of `cfg`'s agent is over: the folders named for it go with
    /// it, unless the owner keeps them. Only the folders of the devices that
    /// were on it: the ACP session ids are what its clients named, so a
    /// device naming another's session reaches no other device's files. On
    /// a blocking thread; what cannot be removed is logged and left.
    fn session_over(&self, cfg: &AgentConfig, over: Over) {
        if self.keep_files {
            return;
        }
        let (store, agent) = (self.store_for(cfg), agent_dir(&cfg.name));
        tokio::task::spawn_blocking(move || {
            for device in &over.devices {
                for session in &over.ids {
                    match store.remove_session(&agent, device, session) {
                        Ok(0) => {}
                        Ok(n) => info!(
                            "files: session {session} of {agent} is over: its {n} file(s) removed (keep them with --keep-files)"
                        ),
                        Err(e) => warn!("files: session {session} of {agent} is over, its files stay: {e}"),
                    }
                }
            }
        });
    }
}

/// A hub's run is done: its connection let go, its journal retired, and,
/// when it is over for good, its files folders with it.
pub(super) fn hub_done(hub: &Hub, shared: &Shared, cfg: &AgentConfig) {
    hub.release();
    let over = hub.retire_journal();
    if let (Some(over), Some(files)) = (over, shared.files.get()) {
        files.session_over(cfg, over);
    }
}

/// A plain session (`/0` without a warm agent) is over when its connection
/// ends: its agent ends with it. Its files go as a resumable session's do:
/// the folders of its device named for it (the bridge's short id) or for an
/// ACP session id its client used, unless the owner keeps them.
pub(super) fn plain_done(shared: &Shared, cfg: &AgentConfig, peer: EndpointId, info: &SessionInfo) {
    let Some(files) = shared.files.get() else { return };
    let mut ids = info.acp_sessions();
    ids.push(info.id.clone());
    files.session_over(cfg, Over { devices: vec![peer], ids });
}

/// The folder name of `agent`'s files.
fn agent_dir(agent: &AgentName) -> String {
    match agent {
        AgentName::Single => "_bridge".into(),
        AgentName::Hosted(name) => name.to_string(),
    }
}

/// Serves `peer`'s transfers on `conn` until it closes.
pub(super) async fn serve(
    conn: Connection,
    peer: EndpointId,
    shared: Arc<Shared>,
    agent: Arc<Served>,
    cfg: Arc<AgentConfig>,
) {
    let short = peer.fmt_short().to_string();
    let Some(state) = shared.files.get().cloned() else {
        info!(peer = %short, "files refused: this bridge keeps no files (no home)");
        refuse(&conn, wire::REASON_IO);
        return;
    };
    let _registered = shared.sessions.insert_transfer(&conn, &agent);
    if !still_admitted(&conn, &agent, &peer, &short) {
        return;
    }
    conn.set_max_concurrent_bi_streams(FILES_STREAMS.into());
    conn.set_receive_window(FILES_RECEIVE_WINDOW.into());
    debug!(peer = %short, "files connection");
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (send, recv) = tokio::select! {
            s = conn.accept_bi() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = shared.shutdown.cancelled() => {
                refuse(&conn, close::REASON_SHUTTING_DOWN);
                break;
            }
        };
        let Some(running) = state.in_flight.begin(peer) else {
            info!(peer = %short, "a transfer refused: {}", wire::REASON_BUSY);
            tasks.spawn(refuse_stream(send, wire::REASON_BUSY));
            continue;
        };
        let t = Transfer {
            state: state.clone(),
            cfg: cfg.clone(),
            peer,
            short: short.clone(),
            conn: conn.clone(),
            _running: running,
        };
        tasks.spawn(t.run(send, recv));
        // Reap what finished, so a long connection holds no list of the past.
        while tasks.try_join_next().is_some() {}
    }
    tasks.shutdown().await;
}

async fn refuse_stream(mut send: SendStream, why: &str) {
    let _ = write_reply(&mut send, &Reply::Error(why.to_string())).await;
    let _ = send.finish();
}

async fn write_reply(send: &mut SendStream, reply: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    send.write_all(&line).await.map_err(std::io::Error::other)
}

struct Transfer {
    state: Arc<FilesState>,
    cfg: Arc<AgentConfig>,
    peer: EndpointId,
    short: String,
    conn: Connection,
    _running: Running,
}

impl Transfer {
    async fn run(self, mut send: SendStream, recv: RecvStream) {
        let mut reader = BufReader::with_capacity(LINE_BUFFER, recv);
        let request = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut reader)).await {
            Ok(Some(r)) => r,
            _ => return refuse_stream(send, wire::REASON_BAD_REQUEST).await,
        };
        match request {
            Request::Put(put) => {
                if let Err(why) = self.put(put, &mut send, reader).await {
                    info!(peer = %self.short, "a transfer refused: {why}");
                    let _ = write_reply(&mut send, &Reply::Error(why)).await;
                    let _ = send.finish();
                }
            }
            Request::Get(get) => self.get(get, send).await,
        }
    }

    /// A device's file, in.
    async fn put(
        &self,
        put: Put,
        send: &mut SendStream,
        reader: BufReader<RecvStream>,
    ) -> Result<(), String> {
        if let Err(why) = wire::check_name(&put.name) {
            return Err(format!("{}: the name {why}", wire::REASON_BAD_NAME));
        }
        if !wire::is_hash(&put.hash) {
            return Err(wire::REASON_BAD_HASH.into());
        }
        if put.size > files::MAX_FILE_SIZE {
            return Err(format!(
                "{}: {} bytes, at most {}",
                wire::REASON_TOO_LARGE,
                put.size,
                files::MAX_FILE_SIZE
            ));
        }
        if put.mime.as_ref().is_some_and(|m| m.len() > 255 || m.chars().any(char::is_control)) {
            return Err(wire::REASON_BAD_REQUEST.into());
        }
        let agent = agent_dir(&self.cfg.name);
        let store = self.state.store_for(&self.cfg);
        let state = self.state.clone();
        let peer = self.peer;
        let p = put.clone();
        // Where it goes, whether it is there already, what is held of it.
        let plan = tokio::task::spawn_blocking(move || -> Result<Plan, String> {
            let folder = store.folder(&agent, &peer, p.session.as_deref()).map_err(|r| r.to_string())?;
            if let Some(path) = store::find_settled(&folder, &p.name, p.size, &p.hash) {
                return Ok(Plan::Settled(path));
            }
            let partial = store.partial_path(&agent, &peer, &p.hash);
            let held = partial.symlink_metadata().map(|m| m.len().min(p.size)).unwrap_or(0);
            store.admit(state.usage(&peer), &folder, p.size - held).map_err(|r| refusal_reason(&r))?;
            let io = |e: std::io::Error| {
                warn!("files: cannot prepare {}: {e}", folder.display());
                wire::REASON_IO.to_string()
            };
            store.ensure_dir(&folder).map_err(io)?;
            store.ensure_dir(partial.parent().expect("a partial has a folder")).map_err(io)?;
            let (file, have) = store::open_partial(&partial, p.size).map_err(io)?;
            Ok(Plan::Receive { folder, partial, file, have })
        })
        .await
        .unwrap_or_else(|_| Err(wire::REASON_IO.into()));
        let plan = plan?;
        let (folder, partial, have, tree) = match plan {
            Plan::Settled(path) => {
                let _ = write_reply(send, &Reply::Have(put.size)).await;
                drain(reader).await;
                return self.receipt(send, &put, &path).await;
            }
            Plan::Receive { folder, partial, file, have } => {
                if write_reply(send, &Reply::Have(have)).await.is_err() {
                    return Ok(());
                }
                let started = Instant::now();
                let got = self.receive(file, &put, have, reader).await;
                match got {
                    Ok((wire_bytes, tree)) => {
                        debug!(peer = %self.short, "files: {} B on the wire in {:?}", wire_bytes, started.elapsed());
                        (folder, partial, have, tree)
                    }
                    Err(e) => return Err(self.receive_failed(&partial, e)),
                }
            }
        };
        let (name, size, hash) = (put.name.clone(), put.size, put.hash.clone());
        let state = self.state.clone();
        let placed = tokio::task::spawn_blocking(move || {
            let path = store::settle(&partial, &folder, &name, size, &hash)?;
            // Known once in place (the link changed its times): a get of
            // it sends at once.
            if let (Some(tree), Ok(meta)) = (tree, path.symlink_metadata()) {
                state.trees.written(&meta, Arc::new(tree));
            }
            Ok(path)
        })
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("settling panicked")));
        match placed {
            Ok(path) => {
                info!(
                    peer = %self.short,
                    "files: received {} ({} bytes{}) into {}",
                    put.name,
                    put.size,
                    if have > 0 { format!(", resumed at {have}") } else { String::new() },
                    path.display()
                );
                self.receipt(send, &put, &path).await
            }
            Err(e) => {
                warn!(peer = %self.short, "files: cannot store {}: {e}", put.name);
                Err(wire::REASON_IO.into())
            }
        }
    }

    async fn receipt(&self, send: &mut SendStream, put: &Put, path: &std::path::Path) -> Result<(), String> {
        let receipt = Receipt {
            name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size: put.size,
            hash: put.hash.clone(),
            uri: files::file_uri(path),
            mime: put.mime.clone(),
        };
        let _ = write_reply(send, &Reply::Receipt(receipt)).await;
        let _ = send.finish();
        let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
        Ok(())
    }

    /// Checks and writes what the device sends from `have` on. Returns the
    /// bytes read off the wire, and the file's hash tree when it came whole.
    async fn receive(
        &self,
        file: std::fs::File,
        put: &Put,
        have: u64,
        reader: BufReader<RecvStream>,
    ) -> Result<(u64, Option<bao_tree::io::outboard::PreOrderOutboard<Vec<u8>>>), StreamError> {
        let last = Arc::new(AtomicU64::new(0));
        let (size, hash) = (put.size, put.hash.clone());
        let (moved, epoch) = (last.clone(), Instant::now());
        let handle = tokio::runtime::Handle::current();
        let work = tokio::task::spawn_blocking(move || {
            let input = files::segments::Segments::new(reader, handle);
            let mut counted = stream::Counted { inner: input, count: 0 };
            let mut writeback = store::Writeback::new(&file, have);
            let progress = |at| {
                moved.store(epoch.elapsed().as_secs(), Ordering::Relaxed);
                writeback.reached(at);
            };
            let tree = if have == 0 {
                stream::receive_tree(
                    &file,
                    size,
                    &hash,
                    &mut counted,
                    progress,
                    files::trees::MAX_TREE_BYTES,
                )?
            } else {
                stream::receive(&file, size, &hash, have, &mut counted, progress).map(|()| None)?
            };
            // The data and the length (what reading it back needs); the name
            // it settles under is a link made after this.
            file.sync_data().map_err(StreamError::File)?;
            Ok((counted.count, tree))
        });
        self.watch(work, &last, epoch).await
    }

    /// Waits for a blocking transfer, ending the connection if no byte moved
    /// for [`STALL_TIMEOUT`] (its read then fails, and the thread is freed).
    async fn watch<T>(
        &self,
        mut work: tokio::task::JoinHandle<Result<T, StreamError>>,
        last: &AtomicU64,
        epoch: Instant,
    ) -> Result<T, StreamError> {
        let mut tick = tokio::time::interval(STALL_CHECK);
        loop {
            tokio::select! {
                r = &mut work => {
                    return r.unwrap_or_else(|_| Err(StreamError::File(std::io::Error::other("transfer panicked"))));
                }
                _ = tick.tick() => {
                    let quiet = epoch.elapsed().as_secs().saturating_sub(last.load(Ordering::Relaxed));
                    if quiet >= STALL_TIMEOUT.as_secs() {
                        info!(peer = %self.short, "closing: {REASON_STALLED} ({quiet} s without a byte)");
                        refuse(&self.conn, REASON_STALLED);
                    }
                }
            }
        }
    }

    /// What a transfer that failed leaves, and the reason the device is told.
    fn receive_failed(&self, partial: &std::path::Path, e: StreamError) -> String {
        match &e {
            StreamError::Mismatch(at) => {
                // Nothing of a file that is not what it claimed is kept.
                let _ = std::fs::remove_file(partial);
                format!("{} at byte {at}", wire::REASON_HASH_MISMATCH)
            }
            StreamError::Cut(_) => {
                // Kept: the device resumes from it.
                info!(peer = %self.short, "files: a transfer was cut; what arrived is kept for a resume");
                wire::REASON_TRUNCATED.to_string()
            }
            StreamError::File(io) if io.raw_os_error() == Some(libc::ENOSPC) => {
                let _ = std::fs::remove_file(partial);
                warn!(peer = %self.short, "files: the disk is full: a transfer was refused");
                wire::REASON_DISK_FULL.to_string()
            }
            StreamError::File(io) => {
                warn!(peer = %self.short, "files: cannot write {}: {io}", partial.display());
                wire::REASON_IO.to_string()
            }
        }
    }

    /// A file of the workstation's, out.
    async fn get(&self, get: Get, mut send: SendStream) {
        let Some(path) = files::uri_path(&get.uri) else {
            return refuse_stream(send, wire::REASON_BAD_REQUEST).await;
        };
        let roots: Vec<PathBuf> = self
            .cfg
            .session
            .agent
            .workspace()
            .into_iter()
            .chain([self.state.store_for(&self.cfg).device_dir(&agent_dir(&self.cfg.name), &self.peer)])
            .collect();
        let home = self.state.home.clone();
        let state = self.state.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let r = reach::open(&path, &roots, &home)?;
            let meta = r.file.metadata().map_err(|_| reach::Unreachable::NotFound)?;
            // The size the header says is the one reached; a file that grew
            // since is hashed (and its tree not kept) as it was reached.
            let same = meta.len() == r.size;
            if let Some(tree) = state.trees.get(&meta).filter(|_| same) {
                return Ok((r, tree));
            }
            let tree = stream::hash_tree(&r.file, r.size).map_err(|_| reach::Unreachable::NotFound)?;
            let tree = Arc::new(tree);
            if same {
                state.trees.hashed(&meta, tree.clone(), std::time::SystemTime::now());
            }
            Ok::<_, reach::Unreachable>((r, tree))
        })
        .await
        .unwrap_or(Err(reach::Unreachable::NotFound));
        let (reached, tree) = match opened {
            Ok(o) => o,
            Err(e) => {
                info!(peer = %self.short, "files: {} refused: {e}", get.uri);
                return refuse_stream(send, &e.to_string()).await;
            }
        };
        let size = reached.size;
        let hash = stream::hex(&tree);
        let from = match &get.hash {
            Some(h) if *h == hash => (get.from.min(reached.size) / wire::BLOCK_SIZE) * wire::BLOCK_SIZE,
            _ => 0,
        };
        let header = FileHeader {
            name: reached.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size: reached.size,
            hash,
            from,
        };
        if write_reply(&mut send, &Reply::File(header)).await.is_err() {
            return;
        }
        let last = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let handle = tokio::runtime::Handle::current();
        let moved = last.clone();
        let work = tokio::task::spawn_blocking(move || {
            let bridge = SyncIoBridge::new_with_handle(send, handle);
            let progress = Progress { inner: bridge, last: moved, epoch };
            let mut out = std::io::BufWriter::with_capacity(SEND_BUFFER, progress);
            stream::send(&reached.file, &tree, from, &mut out)?;
            let progress = out.into_inner().map_err(|e| StreamError::Cut(e.into_error()))?;
            Ok(progress.inner.into_inner())
        });
        match self.watch(work, &last, epoch).await {
            Ok(mut send) => {
                let _ = send.finish();
                let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
                info!(peer = %self.short, "files: sent {} ({size} bytes, from byte {from})", get.uri);
            }
            Err(e) => info!(peer = %self.short, "files: sending {} ended: {e}", get.uri),
        }
    }
}

/// What a put does.
enum Plan {
    /// The same content is there already (a put run again).
    Settled(PathBuf),
    Receive {
        folder: PathBuf,
        partial: PathBuf,
        file: std::fs::File,
        have: u64,
    },
}

fn refusal_reason(r: &Refusal) -> String {
    match r {
        Refusal::TooManyFiles => wire::REASON_TOO_MANY_FILES.into(),
        Refusal::Quota => wire::REASON_QUOTA.into(),
        Refusal::DiskFull => wire::REASON_DISK_FULL.into(),
        Refusal::BadSession => format!("{}: bad session id", wire::REASON_BAD_REQUEST),
    }
}

/// Reads the request line: at most [`MAX_REQUEST_LINE`] bytes, up to `\n`.
async fn read_request(reader: &mut BufReader<RecvStream>) -> Option<Request> {
    let mut line = Vec::with_capacity(512);
    let n = (&mut *reader).take(MAX_REQUEST_LINE as u64 + 1).read_until(b'\n', &mut line).await.ok()?;
    if n == 0 || line.last() != Some(&b'\n') {
        return None;
    }
    serde_json::from_slice(&line).ok()
}

/// Reads and drops what a device sends after `have` equal to the size (nothing, if it follows the protocol).
async fn drain(reader: BufReader<RecvStream>) {
    let mut limited = reader.take(wire::BLOCK_SIZE);
    let _ =
        tokio::time::timeout(REQUEST_TIMEOUT, tokio::io::copy(&mut limited, &mut tokio::io::sink())).await;
}

/// A writer that notes when bytes last moved.
struct Progress<W> {
    inner: W,
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl<W: std::io::Write> std::io::Write for Progress<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.last.store(self.epoch.elapsed().as_secs(), Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
