//! The agent's last stderr line, as it travels with its end to the client.
//!
//! An agent that dies at start usually says why on stderr (`missing API key
//! ANTHROPIC_API_KEY`) and exits non-zero: the device is told that line with
//! the exit code, so the person holding it knows what to fix. It is printable
//! text of bounded size; masking secrets is the bridge's job before it builds
//! one (it knows its masking rules; a client only reads).

/// The most bytes of the line that are carried. The line rides in the QUIC
/// close reason, which must fit in one packet (about 1200 bytes, less through
/// a relay) and is cut by the QUIC stack wherever the byte count falls, maybe
/// inside a character; 200 bytes stay far from that, and are about what a
/// phone shows in two lines: enough for the cause, never a stack trace.
pub const MAX_STDERR_LINE: usize = 200;

/// Ends a line that was cut at [`MAX_STDERR_LINE`].
const CUT_MARK: &str = "…";

/// One line of printable text, at most [`MAX_STDERR_LINE`] bytes. Stored
/// inline so that what carries it (the agent's end) stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StderrLine {
    len: u8,
    bytes: [u8; MAX_STDERR_LINE],
}

// `len` is a u8: the bound must fit.
const _: () = assert!(MAX_STDERR_LINE <= u8::MAX as usize);

impl StderrLine {
    /// The line as shown: terminal escapes (colours) and other control
    /// characters dropped, blanks at either end trimmed, cut at a character
    /// boundary with `…` when longer than [`MAX_STDERR_LINE`]. `None` when
    /// nothing printable is left.
    pub fn new(text: &str) -> Option<Self> {
        let clean = printable(text);
        let clean = clean.trim();
        if clean.is_empty() {
            return None;
        }
        let mut line = Self { len: 0, bytes: [0; MAX_STDERR_LINE] };
        if clean.len() <= MAX_STDERR_LINE {
            line.push(clean);
        } else {
            let mut cut = MAX_STDERR_LINE - CUT_MARK.len();
            while !clean.is_char_boundary(cut) {
                cut -= 1;
            }
            line.push(clean[..cut].trim_end());
            line.push(CUT_MARK);
        }
        Some(line)
    }

    fn push(&mut self, s: &str) {
        let at = self.len as usize;
        self.bytes[at..at + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len() as u8;
    }

    pub fn as_str(&self) -> &str {
        // Only whole `str`s cut at character boundaries are ever pushed.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or_default()
    }
}

/// `text` without terminal escape sequences (`ESC [ … letter`, `ESC x`), with
/// every other control character (tabs, a stray `\r`) made a space.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // A control sequence runs to its final byte (`@` to `~`); any
            // other escape is two characters.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else if c.is_control() {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

impl std::fmt::Display for StderrLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for StderrLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_line_is_kept_as_it_is() {
        let l = StderrLine::new("  missing API key ANTHROPIC_API_KEY\n").unwrap();
        assert_eq!(l.as_str(), "missing API key ANTHROPIC_API_KEY");
        assert_eq!(StderrLine::new(" \t\r\n"), None);
    }

    #[test]
    fn a_long_line_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_STDERR_LINE);
        let l = StderrLine::new(&long).unwrap();
        assert!(l.as_str().len() <= MAX_STDERR_LINE, "{}", l.as_str().len());
        assert!(l.as_str().ends_with('…'));
        assert!(l.as_str().trim_end_matches('…').chars().all(|c| c == 'é'));
        let exact = "x".repeat(MAX_STDERR_LINE);
        assert_eq!(StderrLine::new(&exact).unwrap().as_str(), exact);
    }

    #[test]
    fn escapes_and_controls_are_dropped() {
        let l = StderrLine::new("\u{1b}[1;31merror:\u{1b}[0m bad\tinput\r").unwrap();
        assert_eq!(l.as_str(), "error: bad input");
    }
}
