//! Batched datagrams through the relay.
//!
//! A relay frame carries a batch of QUIC datagrams (`segment_size`, up to
//! 64 KiB), and native iroh sends up to 10 per frame. In a browser iroh's
//! socket takes its batch size from the *custom* transports alone and, with
//! none, sends one datagram per WebSocket message: every 1.2 KB of a bulk
//! upload then pays the browser's per-message cost (dispatch, IPC, glue).
//!
//! [`Batching`] is a custom transport that carries nothing: no local address
//! (so no path ever uses it), never receives, refuses every destination. It
//! only says how many segments a transmit may hold, which lifts the relay
//! path's batch size to [`SEGMENTS`]. The bridge re-splits batches (iroh
//! 1.4 takes a batch frame apart by its `segment_size`).

use std::{
    io,
    num::NonZeroUsize,
    sync::Arc,
    task::{Context, Poll},
};

use iroh::endpoint::transports::{CustomEndpoint, CustomSender, CustomTransport, RecvInfo, Transmit};
use iroh_base::CustomAddr;

/// Datagrams per relay frame: QUIC's own cap on a transmit (noq batches at
/// most 10), 10 × 1452 bytes ≈ 14 KB, far under the relay's 64 KiB frame.
pub const SEGMENTS: usize = 10;

/// The transport (a factory, as iroh wants it).
#[derive(Debug)]
pub struct Batching;

impl CustomTransport for Batching {
    fn bind(&self) -> io::Result<Box<dyn CustomEndpoint>> {
        Ok(Box::new(Endpoint { addrs: n0_watcher::Watchable::new(Vec::new()) }))
    }
}

#[derive(Debug)]
struct Endpoint {
    /// Always empty: nothing is published, no path is made.
    addrs: n0_watcher::Watchable<Vec<CustomAddr>>,
}

impl CustomEndpoint for Endpoint {
    fn watch_local_addrs(&self) -> n0_watcher::Direct<Vec<CustomAddr>> {
        self.addrs.watch()
    }

    fn create_sender(&self) -> Arc<dyn CustomSender> {
        Arc::new(Sender)
    }

    fn poll_recv(
        &mut self,
        _cx: &mut Context,
        _bufs: &mut [io::IoSliceMut<'_>],
        _metas: &mut [noq_udp::RecvMeta],
        _recv_infos: &mut [RecvInfo],
    ) -> Poll<io::Result<usize>> {
        Poll::Pending
    }

    fn max_transmit_segments(&self) -> NonZeroUsize {
        NonZeroUsize::new(SEGMENTS).unwrap_or(NonZeroUsize::MIN)
    }
}

#[derive(Debug)]
struct Sender;

impl CustomSender for Sender {
    fn is_valid_send_addr(&self, _addr: &CustomAddr) -> bool {
        false
    }

    fn poll_send(
        &self,
        _cx: &mut Context,
        _dst: &CustomAddr,
        _src: Option<&CustomAddr>,
        _transmit: &Transmit<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::Error::new(io::ErrorKind::Unsupported, "this transport carries nothing")))
    }
}
