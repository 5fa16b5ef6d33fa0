//! Where an admitted connection goes: the one place that decides, for plain,
//! resumable and warm sessions alike, whether it attaches to a session that
//! runs (the one its resume names, or its peer's warm agent) or starts a new
//! one, which takes an agent [slot](super::slots).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use thunderbolt_shared::{close, resume::Control};
use tracing::{debug, info, warn};

use crate::devices::scope::Verb;

use super::{
    accept::Door,
    admit::{still_admitted, Admitted},
    served::AgentConfig,
    session::{self, refuse},
    sessions::{self, AttachError, Hub, HubKind, HubLink, HubTiming, JournalAt, ResumeConfig},
    slots::{self, Slot},
};

/// The connection's stream, as the session will use it.
enum Stream {
    /// ndjson both ways (`/0`).
    Plain { send: SendStream, recv: RecvStream },
    /// The resumable protocol, after the client's hello asked for a new
    /// session; `leftover` is what it sent after the hello.
    Resumable { send: SendStream, recv: RecvStream, leftover: Bytes, resume: ResumeConfig },
}

/// Takes an admitted connection, its stream open, to its session.
pub(super) async fn enter(conn: Connection, door: Door, send: SendStream, mut recv: RecvStream, a: Admitted) {
    let stream = match (door, a.cfg.session.resume) {
        (Door::Resumable, Some(resume)) => {
            let Some((hello, leftover)) = hello(&conn, &mut recv, &a).await else { return };
            let (token, received) = match hello {
                Control::Hello { session, received } => (session, received),
                Control::List { host } => return super::joining::list(conn, send, &a, host).await,
                Control::Join { id, observe, history } => {
                    // A device that may not prompt joins to watch, whatever it asked.
                    let observe = observe || !a.verbs.has(Verb::Prompt);
                    let how = sessions::JoinAs { observe, history, verbs: a.verbs, share: a.share.is_some() };
                    return super::joining::join(&conn, &id, how, (send, recv), leftover, &a);
                }
                _ => unreachable!("read_hello returns hellos only"),
            };
            if let Some(token) = token {
                return resume_named(&conn, &token, send, recv, received, leftover, &a);
            }
            if received != 0 {
                info!(peer = %a.short, "closing: a new session cannot have received frames");
                refuse(&conn, sessions::REASON_PROTOCOL);
                return;
            }
            Stream::Resumable { send, recv, leftover, resume }
        }
        _ => Stream::Plain { send, recv },
    };
    if !a.verbs.has(Verb::Start) {
        info!(peer = %a.short, "refused a new session: {} (its scope: {})", close::REASON_SCOPE_START, a.verbs);
        refuse(&conn, close::REASON_SCOPE_START);
        return;
    }
    // A new session from a peer whose warm agent waits takes that agent over.
    let stream = match a.cfg.session.keep_warm.and_then(|_| a.shared.hubs.warm_for(&a.peer, &a.cfg.name)) {
        Some(hub) => match take_over(&hub, &conn, stream) {
            Ok(()) => return,
            // It ended just now: start a fresh one.
            Err(stream) => stream,
        },
        None => stream,
    };
    start(conn, stream, a).await
}

/// Reads the client's hello: the session it names (if any), how many of its
/// frames it holds, and what it sent after the hello.
async fn hello(conn: &Connection, recv: &mut RecvStream, a: &Admitted) -> Option<(Control, Bytes)> {
    let hello = tokio::select! {
        r = tokio::time::timeout(a.shared.admission.stream_open_timeout, sessions::read_hello(recv)) => r,
        _ = a.shared.shutdown.cancelled() => {
            refuse(conn, close::REASON_SHUTTING_DOWN);
            return None;
        }
    };
    match hello {
        Ok(Ok(h)) => Some(h),
        Ok(Err(e)) => {
            info!(peer = %a.short, "closing: {e}");
            refuse(conn, sessions::REASON_PROTOCOL);
            None
        }
        Err(_) => {
            info!(peer = %a.short, "closing: {}", close::REASON_IDLE);
            refuse(conn, close::REASON_IDLE);
            None
        }
    }
}

/// A resume: attaches to the session `token` names. Only the NodeId that
/// started a session finds it, and only at its agent.
fn resume_named(
    conn: &Connection,
    token: &str,
    send: SendStream,
    recv: RecvStream,
    received: u64,
    leftover: Bytes,
    a: &Admitted,
) {
    let short = a.short.as_str();
    let hub = match a.shared.hubs.find(token, &a.peer, &a.cfg.name) {
        // A share's guest resumes its seat on its one session, no other.
        Ok(hub) if a.share.as_ref().is_some_and(|s| hub.session_hub().is_none_or(|h| h.short() != s)) => {
            info!(peer = %short, "refusing a resume: its share is of another session now");
            refuse(conn, close::REASON_UNKNOWN_SESSION);
            return;
        }
        Ok(hub) => hub,
        Err(reason) => {
            info!(peer = %short, "refusing a resume: {reason}");
            refuse(conn, &reason);
            return;
        }
    };
    match hub.attach(conn.clone(), send, recv, received, leftover) {
        Ok(()) => {}
        Err(AttachError::Gone(reason)) => {
            info!(peer = %short, session = hub.short(), "refusing a resume: the session ended ({reason})");
            refuse(conn, &reason);
        }
        Err(AttachError::Stale { claimed, acked }) => {
            info!(
                peer = %short,
                session = hub.short(),
                "ending the session: {} (the resume holds {claimed} frames, {acked} were acknowledged)",
                close::REASON_STALE_RESUME
            );
            refuse(conn, close::REASON_STALE_RESUME);
        }
        Err(AttachError::BadPosition(e)) => {
            info!(peer = %short, session = hub.short(), "closing a resume: {e}");
            refuse(conn, sessions::REASON_PROTOCOL);
        }
    }
}

/// Attaches a new session's stream to the peer's running warm agent; the
/// stream comes back when that agent ended meanwhile.
fn take_over(hub: &Arc<Hub>, conn: &Connection, stream: Stream) -> Result<(), Stream> {
    match stream {
        Stream::Resumable { send, recv, leftover, resume } => hub
            .attach_fresh(conn.clone(), send, recv, leftover)
            .map_err(|(send, recv, leftover)| Stream::Resumable { send, recv, leftover, resume }),
        Stream::Plain { send, recv } => {
            hub.attach_plain(conn.clone(), send, recv).map_err(|(send, recv)| Stream::Plain { send, recv })
        }
    }
}

/// A new session: an agent slot, then the agent, on the connection itself
/// (plain) or through a hub that outlives it (resumable, warm).
async fn start(conn: Connection, stream: Stream, a: Admitted) {
    let Some(slot) = slots::agent_slot(&conn, &a).await else { return };
    let warm = a.cfg.session.keep_warm;
    let (resume, stream) = match stream {
        Stream::Plain { send, recv } if warm.is_none() => {
            let session = a.cfg.session.clone();
            session::run(
                conn,
                send,
                recv,
                session,
                slot.permit,
                a.shared.shutdown.clone(),
                Some(a.info.clone()),
            )
            .await;
            drop(slot.live);
            super::files::plain_done(&a.shared, &a.cfg, a.peer, &a.info);
            return;
        }
        Stream::Resumable { resume, .. } => (resume, stream),
        // A warm agent's plain session keeps its agent for the window; a
        // resumable connection that takes it over later resumes within the grace.
        Stream::Plain { .. } => (
            a.cfg.session.resume.unwrap_or(ResumeConfig {
                grace: crate::limits::RESUME_GRACE,
                buffer: crate::limits::RESUME_BUFFER,
            }),
            stream,
        ),
    };
    let kind = if warm.is_some() { HubKind::Warm } else { HubKind::Resumable };
    let timing = hub_timing(&a.cfg, resume, warm);
    let registry = Arc::downgrade(&a.shared.hubs);
    let max_frame = a.cfg.session.max_frame;
    // A resumable session survives a restart of the bridge.
    let journal = a.shared.journals.get().filter(|_| kind == HubKind::Resumable).map(|journals| JournalAt {
        journals,
        node: a.agent.endpoint.id(),
        protocol: &a.cfg.protocol,
    });
    let (hub, inbox, outbox) =
        Hub::new(kind, a.peer, a.cfg.name.clone(), timing, max_frame, registry, journal);
    hub.set_device(super::joining::device_name(&a, &a.peer));
    hub.set_verbs(a.verbs);
    let _ = hub.sharer.set(super::share::Sharer::new(&a.shared, &a.agent));
    let _registered = a.shared.hubs.insert(&hub);
    if !still_admitted(&conn, &a.agent, &a.peer, &a.short) {
        return;
    }
    match stream {
        Stream::Resumable { send, recv, leftover, .. } => {
            if let Err(e) = hub.attach(conn.clone(), send, recv, 0, leftover) {
                warn!(peer = %a.short, "could not start a resumable session: {e:?}");
                return;
            }
            debug!(peer = %a.short, "resumable session");
        }
        Stream::Plain { send, recv } => {
            if hub.attach_plain(conn.clone(), send, recv).is_err() {
                return;
            }
        }
    }
    run_hub(&hub, inbox, outbox, slot, &a).await;
}

/// How long a hub waits with nothing attached: the resume grace (or, for a
/// warm agent, its keep-warm window), capped by the agent's `idle_stop`.
fn hub_timing(cfg: &AgentConfig, resume: ResumeConfig, warm: Option<Duration>) -> HubTiming {
    HubTiming { warm, idle_stop: cfg.session.idle_stop, ..HubTiming::resume(resume) }
}

/// Runs a hub's session to its end, then lets go of its connection.
async fn run_hub(hub: &Arc<Hub>, inbox: sessions::Inbox, outbox: sessions::Outbox, slot: Slot, a: &Admitted) {
    let link = HubLink(hub.clone());
    let session = a.cfg.session.clone();
    session::run_on(link, outbox, inbox, &a.short, session, slot.permit, a.shared.shutdown.clone()).await;
    super::files::hub_done(hub, &a.shared, &a.cfg);
    drop(slot.live);
}
