//! systemd's readiness protocol (`sd_notify`), for `Type=notify` units: the
//! process tells its service manager when it is ready, when it is stopping,
//! and (when the unit sets `WatchdogSec`) that it is alive. Nothing happens
//! outside a service manager (`NOTIFY_SOCKET` unset).

use std::{os::unix::net::UnixDatagram, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Sends `state` (`READY=1`, `STOPPING=1`, `WATCHDOG=1`) to `NOTIFY_SOCKET`, if set.
pub fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let sock = match UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => return debug!("sd_notify: {e}"),
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket (Linux).
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            return;
        }
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = sent {
        debug!("sd_notify {state:?}: {e}");
    }
}

/// Ready: listening, the banner printed.
pub fn ready() {
    send(&format!("READY=1\nMAINPID={}\nSTATUS=serving", std::process::id()));
}

/// Shutting down: every session is being ended.
pub fn stopping() {
    send("STOPPING=1\nSTATUS=ending every session");
}

/// Keeps systemd's watchdog fed (twice per `WATCHDOG_USEC`) until `stop`,
/// when the unit asked for one and it is meant for this process.
pub async fn watchdog(stop: CancellationToken) {
    let Some(usec) = std::env::var("WATCHDOG_USEC").ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok().and_then(|v| v.parse::<u32>().ok()) {
        if pid != std::process::id() {
            return;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_micros(usec / 2).max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = tick.tick() => send("WATCHDOG=1"),
            _ = stop.cancelled() => return,
        }
    }
}
