//! The wire contract of thunderbolt-iroh, shared by the bridge (native) and the
//! browser client (wasm32).
//!
//! Everything a peer must agree on lives here and nowhere else: protocol names and
//! the ALPN derived from them ([`protocol`]), how a dial target is written
//! ([`target`]), the close code and reasons a bridge refuses with ([`close`]), the
//! ndjson framing with its frame cap ([`ndjson`]), the JSON-RPC error the bridge
//! answers unparsable lines with ([`jsonrpc`]), the resumable session protocol
//! ([`resume`]) and the account backend's JSON shapes ([`backend`]).
//!
//! It is runtime-free (no tokio, no filesystem) so it compiles for
//! `wasm32-unknown-unknown`.
//!
//! ```
//! use thunderbolt_shared::protocol::Protocol;
//!
//! let acp: Protocol = "acp".parse().unwrap();
//! assert_eq!(acp.alpn(), b"thunderbolt/acp/0");
//! ```

#[cfg(unix)]
pub mod allow_file;
pub mod allowlist;
pub mod answer;
pub mod backend;
pub mod close;
pub mod devices;
pub mod files;
pub mod jsonrpc;
pub mod multi_client;
pub mod ndjson;
pub mod pairing;
#[cfg(unix)]
pub mod pem;
pub mod protocol;
pub mod reach;
pub mod restart;
pub mod resume;
pub mod resume_bridge;
pub mod resume_client;
pub mod silence;
pub mod stderr_line;
pub mod target;
pub mod words;

pub use iroh_base::{EndpointAddr, EndpointId};
pub use iroh_tickets::endpoint::EndpointTicket;
pub use protocol::{alpn_for, Protocol};
pub use target::{node_id_base32, parse_node_id, Target};
