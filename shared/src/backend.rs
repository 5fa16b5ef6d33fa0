//! JSON shapes of the account backend (`THUNDERBOLT_CLOUD_URL`, ends in `/v1`).

use serde::{Deserialize, Serialize};

/// Body of `POST {base}/devices/bridge`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RegisterBridge {
    pub node_id: String,
    pub name: String,
}

/// Answer of `GET {base}/devices/allowlist`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Allowlist {
    pub node_ids: Vec<AllowlistEntry>,
}

/// One device of the account. `node_id` is null for devices that have not
/// paired an iroh identity yet; those are skipped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AllowlistEntry {
    pub node_id: Option<String>,
    #[serde(default)]
    pub device_type: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_shape() {
        let a: Allowlist = serde_json::from_str(
            r#"{"nodeIds":[{"nodeId":"ab","deviceType":"browser"},{"nodeId":null,"deviceType":"x"}]}"#,
        )
        .unwrap();
        assert_eq!(a.node_ids.len(), 2);
        assert_eq!(a.node_ids[1].node_id, None);
        let r =
            serde_json::to_string(&RegisterBridge { node_id: "ab".into(), name: "Bridge".into() }).unwrap();
        assert_eq!(r, r#"{"nodeId":"ab","name":"Bridge"}"#);
    }
}
