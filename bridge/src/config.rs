//! One configuration for a serving bridge: every limit and timeout it runs
//! with, built once from the command line (`cli::serve_config`) or, in
//! tests, from [`Config::default`] with a field or two changed. The defaults
//! and why they have their values are in [`crate::limits`].

use std::time::Duration;

use thunderbolt_shared::ndjson::MAX_FRAME_LEN;

use crate::{
    limits,
    serve::{agent::Launcher, gate::GateLimits, session::SessionConfig, sessions::ResumeConfig, Admission},
};

/// A bridge's limits and timeouts.
#[derive(Debug, Clone)]
pub struct Config {
    /// Agent slots, handshake and stream-open deadlines, heartbeat.
    pub admission: Admission,
    /// Rate limits applied before any crypto is spent.
    pub gate: GateLimits,
    /// A connection with nothing heard for this long is gone.
    pub idle_timeout: Duration,
    /// Longest ndjson line forwarded in either direction.
    pub max_frame: usize,
    /// Resumable sessions (`thunderbolt/<p>/r1`), unless switched off.
    pub resume: Option<ResumeConfig>,
    /// `--keep-warm`: plain sessions' agents outlive their connection this long.
    pub keep_warm: Option<Duration>,
    /// Every account backend call's bound.
    pub backend_timeout: Duration,
    /// Resumable sessions are journaled, so they survive a restart (`--no-journal` turns it off).
    pub journal: bool,
    /// Files devices put for a session stay after it ended (`--keep-files`);
    /// by default they go with it.
    pub keep_files: bool,
    /// Notices to the owner, when anything would receive one.
    pub notify: Option<std::sync::Arc<crate::notify::Notifier>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            admission: Admission {
                max_agents: limits::MAX_LIVE_AGENTS,
                max_per_device: limits::per_device_cap(limits::MAX_LIVE_AGENTS),
                max_guests: limits::guests_cap(limits::MAX_LIVE_AGENTS),
                handshake_timeout: limits::HANDSHAKE_TIMEOUT,
                stream_open_timeout: limits::STREAM_OPEN_TIMEOUT,
                heartbeat: limits::HEARTBEAT_INTERVAL,
            },
            gate: GateLimits::default(),
            idle_timeout: limits::IDLE_TIMEOUT,
            max_frame: MAX_FRAME_LEN,
            resume: Some(ResumeConfig { grace: limits::RESUME_GRACE, buffer: limits::RESUME_BUFFER }),
            keep_warm: None,
            backend_timeout: limits::BACKEND_TIMEOUT,
            journal: true,
            keep_files: false,
            notify: None,
        }
    }
}

impl Config {
    /// What every session of this bridge shares, running `agent`.
    pub fn session(&self, agent: impl Launcher + 'static) -> SessionConfig {
        SessionConfig {
            max_frame: self.max_frame,
            resume: self.resume,
            keep_warm: self.keep_warm,
            ..SessionConfig::new(agent)
        }
    }
}

/// A size: bytes, or with a K/M/G suffix (binary units), within the bounds of
/// [`crate::limits::MIN_FRAME`] and [`crate::limits::MAX_FRAME`].
pub fn parse_size(v: &str) -> Result<usize, String> {
    use crate::limits::{MAX_FRAME, MIN_FRAME};
    let t = v.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, unit) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1usize << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        _ => (lower, 1),
    };
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{v}' is not a size (bytes, or a number with K, M or G)"))?;
    let bytes = n.checked_mul(unit).ok_or_else(|| format!("'{v}' is too large"))?;
    if !(MIN_FRAME..=MAX_FRAME).contains(&bytes) {
        return Err(format!("{bytes} bytes is outside {MIN_FRAME}..={MAX_FRAME}"));
    }
    Ok(bytes)
}
