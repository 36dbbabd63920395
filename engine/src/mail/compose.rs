//! What each mail says. Pure: a kind, its details and the site's address in, a letter out.
//! No mail carries a document's text or file name: a notice says what happened and links to
//! the job's page, where the owner (logged in) sees the rest.

use serde::{Deserialize, Serialize};

/// The mails Sluice sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MailKind {
    /// "Confirm your address" after sign-up.
    Verify,
    /// "Reset your password", asked for on the log-in page.
    Reset,
    /// A document that took longer than a minute is done.
    Done,
    /// A document failed and what it cost was refunded.
    Failed,
    /// The balance fell below [`LOW_CREDITS`].
    CreditsLow,
}

/// Below this balance a user who chose it is told by mail (once per fall below it).
pub const LOW_CREDITS: i64 = 5;

/// Pure: whether a debit from `before` to `after` took the balance below [`LOW_CREDITS`] (a
/// user is told once per fall, not at every upload while low).
pub fn fell_low(before: i64, after: i64) -> bool {
    before >= LOW_CREDITS && after < LOW_CREDITS
}

impl MailKind {
    pub const ALL: [MailKind; 5] =
        [MailKind::Verify, MailKind::Reset, MailKind::Done, MailKind::Failed, MailKind::CreditsLow];

    /// The name stored in the outbox and used in unsubscribe links.
    pub fn as_str(self) -> &'static str {
        match self {
            MailKind::Verify => "verify",
            MailKind::Reset => "reset",
            MailKind::Done => "done",
            MailKind::Failed => "failed",
            MailKind::CreditsLow => "credits_low",
        }
    }

    pub fn parse(name: &str) -> Option<MailKind> {
        MailKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether this is a notice the user chose (and can unsubscribe from), not a mail the
    /// account needs.
    pub fn is_notice(self) -> bool {
        matches!(self, MailKind::Done | MailKind::Failed | MailKind::CreditsLow)
    }
}

/// What one mail carries, beyond its kind (stored as the outbox row's `detail`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Detail {
    /// A link's secret (verify, reset); removed from the row once the mail is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// How long the link is good for, in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_minutes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// How long a done document took, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_secs: Option<i64>,
    /// A failed document's credits refunded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded: Option<i64>,
    /// The balance after the debit that took it low.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
}

/// A mail ready to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Letter {
    pub subject: String,
    pub text: String,
    /// The one-click unsubscribe address (notices only): `List-Unsubscribe` and
    /// `List-Unsubscribe-Post` (RFC 8058).
    pub unsubscribe: Option<String>,
}

/// The part of the account a mail needs.
#[derive(Clone, Debug)]
pub struct Recipient {
    pub user_id: i64,
    pub mail_key: String,
}

/// Pure: the unsubscribe address of `kind` for this recipient.
pub fn unsubscribe_url(site: &str, to: &Recipient, kind: MailKind) -> String {
    format!("{}/unsubscribe?u={}&k={}&what={}", site.trim_end_matches('/'), to.user_id, to.mail_key, kind.as_str())
}

fn duration_text(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s} seconds"),
        s if s < 7200 => format!("{} minutes", s / 60),
        s => format!("{} hours {} minutes", s / 3600, (s % 3600) / 60),
    }
}

fn credits(n: i64) -> String {
    if n == 1 {
        "1 credit".into()
    } else {
        format!("{n} credits")
    }
}

/// Pure: the letter for `kind` with `detail`, its links under `site` (the public address, like
/// `https://sluice.example.com`). None when the detail lacks what the kind needs.
pub fn compose(kind: MailKind, detail: &Detail, site: &str, to: &Recipient) -> Option<Letter> {
    let site = site.trim_end_matches('/');
    let job_link = || detail.job_id.as_ref().map(|id| format!("{site}/jobs/{id}"));
    let footer = |kind: MailKind| {
        format!(
            "\n\n--\nYou get this because you chose it in your account ({site}/account).\n\
             Stop these mails: {}\n",
            unsubscribe_url(site, to, kind)
        )
    };
    let (subject, text) = match kind {
        MailKind::Verify => {
            let token = detail.token.as_ref()?;
            (
                "Confirm your e-mail address for Sluice".to_string(),
                format!(
                    "Welcome to Sluice.\n\nConfirm that this address is yours, and your free credits are added to \
                     your account:\n\n{site}/verify?token={token}\n\nThe link works once, for {} hours. If you did \
                     not sign up, ignore this mail: nothing happens without the link.\n",
                    detail.valid_minutes.unwrap_or(0) / 60
                ),
            )
        }
        MailKind::Reset => {
            let token = detail.token.as_ref()?;
            (
                "Reset your Sluice password".to_string(),
                format!(
                    "Someone (we hope you) asked to reset the password of the Sluice account at this address.\n\n\
                     Choose a new password here:\n\n{site}/reset?token={token}\n\nThe link works once, for {} \
                     minutes. Setting a new password signs out every other session and revokes the account's API \
                     tokens. If you did not ask, ignore this mail: your password stays as it is.\n",
                    detail.valid_minutes.unwrap_or(0)
                ),
            )
        }
        MailKind::Done => (
            "Your document is ready".to_string(),
            format!(
                "Your document is done (it took {}). See and download the result:\n\n{}{}",
                duration_text(detail.took_secs.unwrap_or(0)),
                job_link()?,
                footer(kind)
            ),
        ),
        MailKind::Failed => {
            let refunded = detail.refunded.unwrap_or(0);
            let money = if refunded > 0 { format!(" {} refunded.", credits(refunded)) } else { String::new() };
            (
                "Your document could not be processed".to_string(),
                format!(
                    "Your document could not be processed.{money} What went wrong, and what you can do:\n\n{}{}",
                    job_link()?,
                    footer(kind)
                ),
            )
        }
        MailKind::CreditsLow => (
            "Your Sluice credits are running low".to_string(),
            format!(
                "Your balance is {}. Documents you upload past it are refused until you have credits again.\n\n\
                 Your credits: {site}/account{}",
                credits(detail.balance?),
                footer(kind)
            ),
        ),
    };
    Some(Letter { subject, text, unsubscribe: kind.is_notice().then(|| unsubscribe_url(site, to, kind)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to() -> Recipient {
        Recipient { user_id: 7, mail_key: "k-e-y".into() }
    }

    #[test]
    fn links_point_at_the_site_and_notices_carry_their_unsubscribe() {
        let reset = Detail { token: Some("abc".into()), valid_minutes: Some(30), ..Detail::default() };
        let letter = compose(MailKind::Reset, &reset, "https://s.example/", &to()).unwrap();
        assert!(letter.text.contains("https://s.example/reset?token=abc"), "{}", letter.text);
        assert!(letter.text.contains("30 minutes"));
        assert_eq!(letter.unsubscribe, None, "an account's own mail has no unsubscribe");

        let done = Detail { job_id: Some("j-1".into()), took_secs: Some(185), ..Detail::default() };
        let letter = compose(MailKind::Done, &done, "https://s.example", &to()).unwrap();
        assert!(letter.text.contains("https://s.example/jobs/j-1") && letter.text.contains("3 minutes"));
        assert_eq!(letter.unsubscribe.as_deref(), Some("https://s.example/unsubscribe?u=7&k=k-e-y&what=done"));
        assert!(letter.text.contains("https://s.example/unsubscribe?u=7&k=k-e-y&what=done"));
    }

    #[test]
    fn a_letter_without_what_its_kind_needs_is_not_made() {
        for kind in MailKind::ALL {
            assert_eq!(compose(kind, &Detail::default(), "https://s.example", &to()), None, "{kind:?}");
        }
    }

    #[test]
    fn a_balance_falls_low_once() {
        assert!(fell_low(10, 4) && fell_low(5, 0));
        assert!(!fell_low(4, 2), "already low: no second mail");
        assert!(!fell_low(20, 5), "five is not low yet");
    }

    #[test]
    fn kinds_read_back() {
        for kind in MailKind::ALL {
            assert_eq!(MailKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(MailKind::parse("spam"), None);
        assert!(!MailKind::Verify.is_notice() && !MailKind::Reset.is_notice() && MailKind::Done.is_notice());
    }

    #[test]
    fn failures_say_what_was_refunded() {
        let failed = Detail { job_id: Some("j".into()), refunded: Some(1), ..Detail::default() };
        let letter = compose(MailKind::Failed, &failed, "http://x", &to()).unwrap();
        assert!(letter.text.contains("1 credit refunded."), "{}", letter.text);
        let low = Detail { balance: Some(3), ..Detail::default() };
        assert!(compose(MailKind::CreditsLow, &low, "http://x", &to()).unwrap().text.contains("3 credits"));
    }
}
