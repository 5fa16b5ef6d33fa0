//! Browser client for thunderbolt-iroh bridges (Rust → wasm, relay-only).
//!
//! Builds on the shared wire contract; the wasm-bindgen API lands with the
//! browser-client work.

pub use thunderbolt_shared::{alpn_for, Protocol};
