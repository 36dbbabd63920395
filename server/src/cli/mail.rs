//! Mail: where it is sent (an SMTP server, or a folder of `.eml` files by default), who it is
//! from, the site's public address for the links in it, and whether new accounts must verify
//! their address (turned into `MailConfig` and the web settings).

use std::net::SocketAddr;
use std::path::Path;

use clap::{ArgAction, Args};

use engine::mail::{MailConfig, Transport};

use super::Secret;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Mail")]
pub struct MailArgs {
    /// The SMTP server: `smtp://user:pass@host:587?tls=required` (STARTTLS), `smtps://...:465`
    /// (TLS) or `smtp://host:25` (a local relay). Unset: mail is written to `DATA_DIR/outbox`.
    #[arg(long, env = "SLUICE_SMTP_URL", global = true, hide_env_values = true)]
    pub smtp_url: Option<Secret>,
    /// The sender of every mail.
    #[arg(long, env = "SLUICE_MAIL_FROM", default_value = "Sluice <sluice@localhost>", global = true)]
    pub mail_from: String,
    /// The address users reach the site at, for the links in mails (unset: `http://` and the
    /// bind address).
    #[arg(long, env = "SLUICE_PUBLIC_URL", global = true)]
    pub public_url: Option<String>,
    /// New accounts prove their address by a mailed link before they get the sign-up grant.
    #[arg(long, env = "SLUICE_REQUIRE_EMAIL_VERIFICATION", default_value_t = true, action = ArgAction::Set, global = true)]
    pub require_email_verification: bool,
}

impl MailArgs {
    /// How mail is sent, its links under the public address (the bind address by default).
    pub fn mail_config(&self, data_dir: &Path, bind: SocketAddr) -> MailConfig {
        let transport = match &self.smtp_url {
            Some(url) => Transport::Smtp(url.expose().to_string()),
            None => Transport::Folder(data_dir.join("outbox")),
        };
        let site = self.public_url.clone().unwrap_or_else(|| {
            let host = if bind.ip().is_unspecified() { "localhost".to_string() } else { bind.ip().to_string() };
            format!("http://{host}:{}", bind.port())
        });
        MailConfig { transport, from: self.mail_from.clone(), site, ..MailConfig::default() }
    }
}
