//! `thunderbolt` as a library: bridge a stdio coding agent (ACP or MCP) over
//! iroh, end-to-end encrypted, admitting only trusted peers.
//!
//! The folders are the architecture, one room each, read in the order data
//! flows:
//! - [`serve`]: the serving core. A connection's walk: [`accept`](serve::accept)
//!   (the door its ALPN opens) → [`gate`](serve::gate) (rate limits before any
//!   crypto) → [`admit`](serve::admit) (handshake, trust, registration) →
//!   [`enter`](serve::enter) (attach or start, in a [`slot`](serve::slots)) →
//!   [`sessions`](serve::sessions) (resumable and warm sessions' hubs) →
//!   [`session`](serve::session) (one agent process) over [`pump`](serve::pump).
//!   [`taps`](serve::taps) is how status and notices observe a session.
//! - [`trust`]: who may connect: the manual allow file and the account
//!   allowlist, each a policy.
//! - [`host`]: `thunderbolt host` (manifests, the watched `agents.d`) and the
//!   one builder of a served agent ([`host::plan`]), which the single-agent
//!   bridge uses too.
//! - [`control`]: the local API (its typed contract, codec, server and
//!   client), systemd readiness, the user service.
//! - [`notify`]: notices to the owner (Web Push, a webhook), a session tap.
//! - [`journal`]: resumable sessions on disk, so they survive a restart of the
//!   bridge (taken back by [`serve::sessions::restore`]).
//! - [`devices`] and [`pairing`]: named devices and one-time pairing codes.
//! - [`files`]: files devices put on the workstation and get from it
//!   (served by `serve::files`, sent by `thunderbolt files`).
//! - [`reach`]: messages from anything on the workstation to the owner's
//!   devices and their replies (the local socket, `thunderbolt reach`'s MCP
//!   server; read and answered over `serve::reach_door`).
//! - [`shapes`]: agents of other shapes (a contract program per turn, a
//!   webhook) served as ACP by `thunderbolt adapt`, which a manifest runs.
//! - [`cli`]: the `thunderbolt` commands built on the above.
//! - Beside them, what all share: [`config`] (one configuration built from the
//!   command line), [`limits`] (every default and why), [`home`],
//!   [`identity`] and [`ids`] (files, random ids), [`net`] (the iroh
//!   endpoint), [`paths`] (relay or direct), [`signals`], [`redact`],
//!   [`acp_agent`] (the built-in ACP agent).
//!
//! The binary (`main.rs`) only sets up logging and the runtime and calls
//! [`cli::run`]. `docs/code-layout.md` has the tree, a line per file.

pub mod acp_agent;
pub mod cli;
pub mod config;
pub mod control;
pub mod devices;
pub mod dns;
pub mod files;
pub mod home;
pub mod host;
pub mod identity;
pub mod ids;
pub mod journal;
pub mod json_out;
pub mod limits;
pub mod net;
pub mod notify;
pub mod pairing;
pub mod paths;
pub mod reach;
pub mod redact;
pub mod serve;
pub mod shapes;
pub mod signals;
pub mod trust;
