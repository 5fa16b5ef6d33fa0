//! Devices: the peers a bridge knows by name.
//!
//! Names live beside the allow file, never inside it (the reference tool
//! compares each allow-file line whole: a user switching back keeps every
//! pairing). This is how the rest of the bridge asks about them.

use iroh::EndpointId;
use thunderbolt_shared::parse_node_id;

/// The NodeId a kick or deny target names: a NodeId (hex, base32 or a
/// ticket) or a device name.
pub fn resolve(target: &str) -> Option<EndpointId> {
    let t = target.trim();
    if let Ok(id) = parse_node_id(t) {
        return Some(id);
    }
    t.parse::<thunderbolt_shared::Target>().ok().map(|t| t.id())
}

/// The name a device was given, if any.
pub fn name_of(_peer: &EndpointId) -> Option<String> {
    None
}
