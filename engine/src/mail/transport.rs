//! Where mail goes: an SMTP server (lettre: STARTTLS or TLS, with authentication), or a folder
//! of `.eml` files when none is configured.

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::header::{ContentTransferEncoding, ContentType, Header, HeaderName, HeaderValue};
use lettre::message::Body;
use lettre::message::Mailbox;
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::compose::Letter;

/// Where mail is sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Transport {
    /// `smtp://user:pass@host:587?tls=required` (STARTTLS), `smtps://user:pass@host:465`
    /// (TLS), or `smtp://host:25` (plain, for a relay on the same machine).
    Smtp(String),
    /// `.eml` files in this folder.
    Folder(PathBuf),
}

/// A transport opened once and used for every mail.
pub enum Sender {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Folder(AsyncFileTransport<Tokio1Executor>),
}

/// How long one SMTP conversation may take.
pub const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

impl Transport {
    /// Open it: a malformed SMTP URL, or a folder that cannot be made, is a setting error.
    pub fn open(&self) -> Result<Sender, String> {
        match self {
            Transport::Smtp(url) => AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                .map(|b| Sender::Smtp(b.timeout(Some(SMTP_TIMEOUT)).build()))
                .map_err(|e| format!("the SMTP URL is not usable: {e}")),
            Transport::Folder(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| format!("making the mail folder {}: {e}", dir.display()))?;
                Ok(Sender::Folder(AsyncFileTransport::new(dir)))
            }
        }
    }

    /// Where mail goes, in words for the log (an SMTP URL's password left out).
    pub fn describe(&self) -> String {
        match self {
            Transport::Smtp(url) => match url::Url::parse(url) {
                Ok(u) => format!("SMTP {}:{}", u.host_str().unwrap_or("?"), u.port().unwrap_or(25)),
                Err(_) => "SMTP (malformed URL)".into(),
            },
            Transport::Folder(dir) => format!("the folder {} (no --smtp-url is set)", dir.display()),
        }
    }
}

/// `List-Unsubscribe: <url>`
#[derive(Clone)]
struct ListUnsubscribe(String);

impl Header for ListUnsubscribe {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe")
    }
    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(ListUnsubscribe(s.trim_start_matches('<').trim_end_matches('>').to_string()))
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), format!("<{}>", self.0))
    }
}

/// `List-Unsubscribe-Post: List-Unsubscribe=One-Click` (RFC 8058).
#[derive(Clone)]
struct OneClick;

impl Header for OneClick {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe-Post")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(OneClick)
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "List-Unsubscribe=One-Click".into())
    }
}

/// Pure (but for the date and id lettre adds): the message for `letter` from `from` to `to`.
pub fn message(from: &Mailbox, to: &str, letter: &Letter) -> Result<Message, String> {
    // The address alone: never a display name a crafted address could smuggle in.
    let to =
        Mailbox::new(None, to.parse::<lettre::Address>().map_err(|e| format!("the address cannot be mailed: {e}"))?);
    let mut builder = Message::builder().from(from.clone()).to(to).subject(&letter.subject);
    if let Some(url) = &letter.unsubscribe {
        builder = builder.header(ListUnsubscribe(url.clone())).header(OneClick);
    }
    // Quoted-printable whatever the text: readable as it is, and links survive long lines.
    let body = Body::new_with_encoding(letter.text.clone(), ContentTransferEncoding::QuotedPrintable)
        .map_err(|_| "the text cannot be encoded".to_string())?;
    builder.header(ContentType::TEXT_PLAIN).body(body).map_err(|e| format!("building the mail: {e}"))
}

impl Sender {
    /// Send one message; the error in words.
    pub async fn send(&self, message: Message) -> Result<(), String> {
        match self {
            Sender::Smtp(smtp) => smtp.send(message).await.map(|_| ()).map_err(|e| e.to_string()),
            Sender::Folder(folder) => folder.send(message).await.map(|_| ()).map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_carry_one_click_unsubscribe_headers() {
        let from: Mailbox = "Sluice <mail@sluice.example>".parse().unwrap();
        let letter = Letter {
            subject: "Your document is ready".into(),
            text: "done".into(),
            unsubscribe: Some("https://s.example/unsubscribe?u=1&k=x&what=done".into()),
        };
        let raw = String::from_utf8(message(&from, "ada@example.com", &letter).unwrap().formatted()).unwrap();
        assert!(raw.contains("List-Unsubscribe: <https://s.example/unsubscribe?u=1&k=x&what=done>"), "{raw}");
        assert!(raw.contains("List-Unsubscribe-Post: List-Unsubscribe=One-Click"), "{raw}");
        let plain = Letter { unsubscribe: None, ..letter };
        let raw = String::from_utf8(message(&from, "ada@example.com", &plain).unwrap().formatted()).unwrap();
        assert!(!raw.contains("List-Unsubscribe"), "{raw}");
        assert!(message(&from, "not an address", &plain).is_err());
        assert!(message(&from, "\"ceo@bank.com\" <me@evil.com>", &plain).is_err(), "only a bare address");
    }

    #[test]
    fn a_password_in_the_smtp_url_never_reaches_the_log() {
        let described = Transport::Smtp("smtp://me:hunter2@mail.example:587?tls=required".into()).describe();
        assert_eq!(described, "SMTP mail.example:587");
    }
}
