//! The allow-file format, shared by the bridge (`$THUNDERBOLT_HOME/iroh/allowlist`)
//! and the self-hosted relay's `allow_file` access mode.
//!
//! One NodeId per line; lines trimmed, blank lines ignored, duplicates collapse,
//! `#` starts a comment. Lines that are none of these are reported with their
//! line number rather than silently ignored.

use std::collections::HashSet;

use iroh_base::EndpointId;

use crate::target::parse_node_id;

/// A line that is neither blank, a comment, nor a NodeId.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line_no: usize,
    pub error: String,
}

/// A parsed allow file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// In file order, without duplicates.
    pub ids: Vec<EndpointId>,
    pub bad_lines: Vec<BadLine>,
    /// The same ids for lookups: a check runs per handshake and per heartbeat,
    /// and a long file must not make each one a scan.
    index: HashSet<EndpointId>,
}

impl Allowed {
    pub fn contains(&self, id: &EndpointId) -> bool {
        self.index.contains(id)
    }
}

/// What one line of the file means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Skip,
    Id(EndpointId),
    Bad(String),
}

/// Classifies one line.
pub fn classify(raw: &str) -> Line {
    let content = raw.split('#').next().unwrap_or("").trim();
    if content.is_empty() {
        return Line::Skip;
    }
    match parse_node_id(content) {
        Ok(id) => Line::Id(id),
        Err(e) => Line::Bad(e.to_string()),
    }
}

/// Parses a whole file.
pub fn parse(text: &str) -> Allowed {
    let mut out = Allowed::default();
    let seen = &mut out.index;
    for (i, raw) in text.lines().enumerate() {
        match classify(raw) {
            Line::Skip => {}
            Line::Id(id) => {
                if seen.insert(id) {
                    out.ids.push(id);
                }
            }
            Line::Bad(error) => out.bad_lines.push(BadLine { line_no: i + 1, error }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EndpointId {
        iroh_base::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[test]
    fn parse_rules() {
        let text = format!(
            "# my laptop\n  {a}  \n\n{a}\n{b} # phone\nnot-an-id\n{upper}\n",
            a = id(1),
            b = id(2),
            upper = id(3).to_string().to_uppercase()
        );
        let p = parse(&text);
        assert_eq!(p.ids, vec![id(1), id(2), id(3)]);
        assert_eq!(p.bad_lines.len(), 1);
        assert_eq!(p.bad_lines[0].line_no, 6);
    }
}
