//! Browser client for thunderbolt-iroh bridges: Rust compiled to wasm, dialing
//! a bridge through an iroh relay (browsers have no UDP, so it is relay-only).
//!
//! JavaScript API (ES module built by `client-wasm/build.sh` into `pkg/`):
//!
//! ```js
//! import init, { IrohClient } from "./pkg/thunderbolt_client_wasm.js";
//! await init();
//! const client = await IrohClient.create(localStorage.secret, "https://relay.example");
//! localStorage.secret = client.secretKeyHex();        // stable NodeId across reloads
//! // Once, with a pairing link's #ticket=…&pair=… (`thunderbolt iroh pair`):
//! await client.pair(ticket, code, "Chrome on Linux");   // → {paired: true, name}
//! // Byte API (drop-in for the app's client):
//! const conn = await client.connect(ticket, "thunderbolt/acp/0");
//! await conn.send(new TextEncoder().encode('{"jsonrpc":"2.0",...}\n'));
//! const reader = conn.readable().getReader();
//! // Framed API: JSON-RPC messages in, parsed messages out.
//! const acp = await client.connectProtocol(ticket, "acp");
//! await acp.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } });
//! for await (const msg of acp.messages()) { ... }
//! ```
//!
//! When the bridge refuses or ends a session, promises reject (and streams
//! error) with an `Error` whose `kind` is `"closed"` and which carries the
//! bridge's `code` and `reason` (`not allowlisted`, `bridge at capacity`, …),
//! distinguishable from `"timeout"` (dial timeout) and `"network"`.
//!
//! `connectProtocol` sessions resume by default (ALPN `thunderbolt/<p>/r1`
//! offered ahead of `/0`): after a lost connection the client redials by itself
//! and the page's message stream goes on, every message once and in order.
//! `connectProtocol(target, protocol, timeoutMs, maxFrame, { onEvent, session,
//! resume })`: `onEvent({type})` hears `reconnecting`, `resumed` and `gone`;
//! `session` is a stored `conn.sessionState()` (resume after a page reload);
//! `resume: false` offers the plain protocol only. When the bridge no longer
//! holds the session, the stream errors with `kind: "session_gone"`.
//!
//! One session on several devices: `client.sessions(ticket)` lists the
//! sessions this device may join (its own; for one of the owner's own
//! devices also those of the owner's other devices), `client.attach(ticket,
//! id, { observe, history })` joins one as a `FramedConnection` of this
//! device's own (it resumes on its own token), `conn.takeControl()` /
//! `conn.observe()` ask for a role, and `onEvent` hears `role` and
//! `answered` (docs/browser.md, "One session on several devices").

pub mod errors;

#[cfg(target_arch = "wasm32")]
mod batching;
#[cfg(target_arch = "wasm32")]
mod client;
#[cfg(any(target_arch = "wasm32", test))]
mod crypto;
#[cfg(target_arch = "wasm32")]
mod dialing;
#[cfg(target_arch = "wasm32")]
mod files;
#[cfg(target_arch = "wasm32")]
mod js;
#[cfg(target_arch = "wasm32")]
mod relays;
#[cfg(target_arch = "wasm32")]
mod resumable;
#[cfg(target_arch = "wasm32")]
mod wasm;
