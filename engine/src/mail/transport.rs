//! Where mail goes: an SMTP server (lettre: STARTTLS or TLS, with authentication), or a folder
//! of `.eml` files when none is configured.
//!
//! The folder holds live reset and verification links (an admin's too), so it is private: the
//! folder 0700 and each file 0600 whatever the umask, each file named by its account and
//! outbox row (`<user>-<mail>.eml`), pruned with the outbox rows and at once when the account
//! is deleted (`outbox::forget_account`).

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::header::{ContentTransferEncoding, ContentType, Header, HeaderName, HeaderValue};
use lettre::message::Body;
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

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
    Folder(MailFolder),
}

/// Which mail a message is: its account and its outbox row (names its file in a folder).
#[derive(Clone, Copy, Debug)]
pub struct MailName {
    pub user_id: i64,
    pub mail_id: i64,
}

/// A private folder of `.eml` files.
#[derive(Clone, Debug)]
pub struct MailFolder {
    dir: PathBuf,
}

impl MailFolder {
    /// Make the folder (or take an existing one) and make it private to this user.
    pub fn open(dir: &std::path::Path) -> std::io::Result<MailFolder> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        // An existing folder made before (with the umask) is made private too.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(MailFolder { dir: dir.to_path_buf() })
    }

    fn path_of(&self, name: MailName) -> PathBuf {
        self.dir.join(format!("{}-{}.eml", name.user_id, name.mail_id))
    }

    /// Write one message, readable by this user only. A second write of the same mail (a
    /// retried attempt) replaces the first.
    pub async fn write(&self, name: MailName, bytes: Vec<u8>) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path_of(name);
        let partial = path.with_extension("eml.partial");
        tokio::task::spawn_blocking(move || {
            let mut file =
                std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&partial)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&partial, &path)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Each file in the folder, the account and mail its name says (`None` for another name: an
    /// older release's, a partial write), and its age. A file gone meanwhile (another process
    /// pruned it) is skipped.
    fn files(&self) -> std::io::Result<Vec<(PathBuf, Option<MailName>, Duration)>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            let modified = match entry.metadata().and_then(|m| m.modified()) {
                Ok(modified) => modified,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let name = path.file_name().and_then(|n| n.to_str()).and_then(parse_file_name);
            found.push((path, name, modified.elapsed().unwrap_or_default()));
        }
        Ok(found)
    }

    /// Delete every file older than `age` (whatever its name), and those of accounts `gone`
    /// says are deleted; returns how many went.
    pub fn prune(&self, age: Duration, gone: &dyn Fn(i64) -> bool) -> std::io::Result<usize> {
        let mut removed = 0;
        for (path, name, file_age) in self.files()? {
            if file_age > age || name.is_some_and(|n| gone(n.user_id)) {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }

    /// The account ids the folder holds mail of.
    pub fn accounts(&self) -> std::io::Result<Vec<i64>> {
        let mut ids: Vec<i64> = self.files()?.into_iter().filter_map(|(_, name, _)| name.map(|n| n.user_id)).collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

/// `<user>-<mail>.eml` as a [`MailName`]; anything else (lettre's older names, a partial
/// write) is not ours to prune by account.
fn parse_file_name(name: &str) -> Option<MailName> {
    let (user, mail) = name.strip_suffix(".eml")?.split_once('-')?;
    Some(MailName { user_id: user.parse().ok()?, mail_id: mail.parse().ok()? })
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
            Transport::Folder(dir) => MailFolder::open(dir)
                .map(Sender::Folder)
                .map_err(|e| format!("making the mail folder {} private: {e}", dir.display())),
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
    /// Send one message (`name` says which mail it is); the error in words.
    pub async fn send(&self, name: MailName, message: Message) -> Result<(), String> {
        match self {
            Sender::Smtp(smtp) => smtp.send(message).await.map(|_| ()).map_err(|e| e.to_string()),
            Sender::Folder(folder) => folder.write(name, message.formatted()).await.map_err(|e| e.to_string()),
        }
    }

    /// The mail folder, when mail goes to one.
    pub fn folder(&self) -> Option<&MailFolder> {
        match self {
            Sender::Folder(folder) => Some(folder),
            Sender::Smtp(_) => None,
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
