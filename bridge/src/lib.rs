//! `thunderbolt` as a library: bridge a stdio coding agent (ACP or MCP) over
//! iroh, end-to-end encrypted, admitting only trusted peers.
//!
//! The folders are the architecture, read in the order data flows:
//! - [`serve`]: the serving core. An accepted connection passes the
//!   [`gate`](serve::gate) (rate limits before any crypto), is authorized by a
//!   [`TrustPolicy`](trust::TrustPolicy), and becomes a
//!   [`session`](serve::session): one agent process ([`agent`](serve::agent))
//!   pumped ([`pump`](serve::pump)) over one stream, plain or resumable
//!   ([`hub`](serve::hub)), or over a loopback WebSocket ([`wss`](serve::wss)).
//! - [`trust`]: who may connect. The manual allow file and the account
//!   allowlist, each a policy.
//! - [`cli`]: the `thunderbolt` commands built on the two above (`connect`, the
//!   `iroh` commands, login, the banner).
//! - Beside them, what all share: [`config`] (one configuration built from the
//!   command line), [`limits`] (every default and why), [`home`] and
//!   [`identity`] (files), [`net`] (the iroh endpoint), [`paths`] (relay or direct), [`signals`], [`redact`].
//!
//! The binary (`main.rs`) only sets up logging and the runtime and calls
//! [`cli::run`].

pub mod acp_agent;
pub mod cli;
pub mod config;
pub mod control;
pub mod devices;
pub mod home;
pub mod host;
pub mod identity;
pub mod ids;
pub mod limits;
pub mod net;
pub mod notify;
pub mod pairing;
pub mod paths;
pub mod redact;
pub mod serve;
pub mod signals;
pub mod trust;
