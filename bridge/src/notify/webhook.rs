//! `--notify-url`: every notice POSTed to one URL, for owners whose phone does
//! not run the browser client — a webhook (a small JSON document) or an ntfy
//! topic (its plain-text form: the body is the message, the title a header).

use reqwest::Url;

use crate::notify::Notice;

/// What the POST carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `{"agent", "label", "event", "detail", "title", "body", "session", "device", "at", …}`.
    Json,
    /// ntfy's: the body in plain text; `Title`, `Priority` and `Tags` headers.
    Ntfy,
}

#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: Url,
    pub format: Format,
}

impl Webhook {
    /// Checks `raw`: https, or plain http only to loopback (a notice names
    /// the agent and what it waits for; it does not cross a network in the clear).
    pub fn parse(raw: &str, format: Format) -> Result<Self, String> {
        let url = Url::parse(raw.trim()).map_err(|e| format!("--notify-url '{raw}' is not a URL: {e}"))?;
        match url.scheme() {
            "https" => {}
            "http" if crate::trust::account::credential::is_loopback_host(&url) => {}
            "http" => {
                return Err(format!(
                    "--notify-url {url}: plain http is only allowed to this machine (127.0.0.1, ::1, \
                     localhost); use https"
                ))
            }
            s => return Err(format!("--notify-url {url}: scheme {s} is not https")),
        }
        Ok(Self { url, format })
    }

    /// The URL as logs show it: no user, password or query (an ntfy token
    /// may be in either).
    pub fn shown(&self) -> String {
        format!("{}{}", self.url.origin().ascii_serialization(), self.url.path())
    }

    pub fn request(&self, http: &reqwest::Client, notice: &Notice) -> reqwest::RequestBuilder {
        match self.format {
            Format::Json => http.post(self.url.clone()).json(notice),
            Format::Ntfy => http
                .post(self.url.clone())
                .header("Title", &notice.title)
                .header("Priority", if notice.event == "needs_answer" { "high" } else { "default" })
                .header("Tags", "robot")
                // The agent's own words, unless the body says them already.
                .body(match &notice.text {
                    Some(t) if !notice.body.contains(t.as_str()) => format!("{}\n{t}", notice.body),
                    _ => notice.body.clone(),
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback() {
        assert!(Webhook::parse("https://ntfy.example/topic", Format::Ntfy).is_ok());
        assert!(Webhook::parse("http://127.0.0.1:8080/hook", Format::Json).is_ok());
        assert!(Webhook::parse("http://localhost/hook", Format::Json).is_ok());
        let e = Webhook::parse("http://example.com/hook", Format::Json).unwrap_err();
        assert!(e.contains("use https"), "{e}");
        assert!(Webhook::parse("ftp://x/y", Format::Json).is_err());
        let secret = Webhook::parse("https://u:pw@ntfy.example/t?auth=tok", Format::Ntfy).unwrap();
        assert_eq!(secret.shown(), "https://ntfy.example/t");
    }
}
