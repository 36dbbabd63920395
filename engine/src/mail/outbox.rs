//! The mail outbox: a mail is enqueued in the transaction of what it reports, then sent by any
//! process (claimed with `SKIP LOCKED` and a lease, like the webhook outbox), retried with the
//! webhooks' backoff, bounded per account, and pruned after a retention period.
//!
//! What is decided when sending, not when enqueuing: the address (read from the account, so a
//! changed or deleted one is honoured and never copied here), whether the user still wants
//! that notice, and whether a link is still worth sending (an expired reset link is not).

use std::time::Duration;

use lettre::message::Mailbox;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use super::compose::{compose, Detail, MailKind, Recipient};
use super::transport::{message, MailFolder, MailName, Sender, Transport};
use crate::error::Result;

/// How mail is sent.
#[derive(Clone, Debug)]
pub struct MailConfig {
    pub transport: Transport,
    /// The sender, like `Sluice <sluice@example.com>`.
    pub from: String,
    /// The site's public address, for the links in mails (like `https://sluice.example.com`).
    pub site: String,
    /// Attempts before a mail is given up (with the backoff, about 3 hours).
    pub max_attempts: i32,
    /// How often due mail is looked for.
    pub poll_every: Duration,
    /// How long a claimed mail is kept from other senders.
    pub lease: Duration,
    /// How long a mail folder keeps a file (it holds live links): the outbox rows' retention.
    pub folder_retention: Duration,
}

/// How long sent mail is kept, in the outbox and in a mail folder: a week, to answer "did it go out?".
pub const MAIL_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a notification on [`WAKE_CHANNEL`] says when an account is deleted: its mail in a
/// folder goes at once.
pub const FORGET_ACCOUNT: &str = "forget";

impl Default for MailConfig {
    fn default() -> Self {
        MailConfig {
            transport: Transport::Folder(".data/outbox".into()),
            from: "Sluice <sluice@localhost>".into(),
            site: "http://localhost:3000".into(),
            max_attempts: 12,
            poll_every: Duration::from_secs(2),
            lease: Duration::from_secs(120),
            folder_retention: MAIL_RETENTION,
        }
    }
}

impl MailConfig {
    /// What an operator should know about these settings (logged at start).
    pub fn warnings(&self, public_url_set: bool) -> Vec<String> {
        let mut said = Vec::new();
        if !public_url_set {
            said.push(format!("links in mails point at {}: set --public-url to the address users reach", self.site));
        }
        if let Transport::Smtp(url) = &self.transport {
            let plain = url.starts_with("smtp://") && !url.contains("tls=");
            if plain && url::Url::parse(url).is_ok_and(|u| !u.password().unwrap_or("").is_empty()) {
                said.push("--smtp-url sends a password without TLS: add ?tls=required (or use smtps://)".into());
            }
        }
        if let Transport::Folder(dir) = &self.transport {
            said.push(format!(
                "no --smtp-url: mail is written to {} (its reset links work for 30 minutes; delete old files)",
                dir.display()
            ));
        }
        said
    }

    /// A sender that is not an address, or a transport that cannot be opened, in words (the
    /// server refuses to start with them).
    pub fn check(&self) -> std::result::Result<(), String> {
        self.from.parse::<Mailbox>().map_err(|e| format!("the mail sender {:?} is not an address: {e}", self.from))?;
        url::Url::parse(&self.site).map_err(|e| format!("the public URL {:?} is not a URL: {e}", self.site))?;
        self.transport.open().map(|_| ())
    }
}

/// Mails one account may have waiting; past it a new one is given up at once, on the record
/// (a user cannot fill the outbox, or a mailbox, by asking for links).
pub const MAX_PENDING_PER_ACCOUNT: i64 = 20;

/// Notices one account may be sent in any 24 hours, whatever the transport (a folder or a fast
/// SMTP server never has any waiting): past it a new one is given up at once, on the record.
pub const MAX_NOTICES_PER_DAY: i64 = 30;

/// Queue a mail inside the caller's transaction; a second one with the same `event_key` is
/// ignored (each event mails once). Notices count against [`MAX_PENDING_PER_ACCOUNT`] and
/// [`MAX_NOTICES_PER_DAY`]; an
/// account's own mail (a reset or verification link) is bounded by its request throttles
/// instead, so a backlog of notices never drops it.
pub async fn enqueue(
    conn: &mut PgConnection,
    user_id: i64,
    kind: MailKind,
    event_key: &str,
    detail: &Detail,
) -> std::result::Result<(), sqlx::Error> {
    let detail = serde_json::to_value(detail).expect("a detail serialises");
    sqlx::query(
        "WITH pending AS (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM mail_outbox WHERE user_id = $1 AND sent_at IS NULL AND gave_up_at IS NULL LIMIT $5) p),
         today AS (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM mail_outbox
                 WHERE user_id = $1 AND kind = ANY($8) AND gave_up_at IS NULL AND created_at > now() - interval '1 day'
                 LIMIT $7) t)
         INSERT INTO mail_outbox (user_id, kind, event_key, detail, gave_up_at, last_error)
         SELECT $1, $2, $3, $4, CASE WHEN over_bound OR over_day THEN now() END,
                CASE WHEN over_bound THEN format('%s mails were already waiting for this account', $5)
                     WHEN over_day THEN format('%s notices were already sent to this account today', $7) END
         FROM (SELECT $6 AND pending.n >= $5 AS over_bound, $6 AND today.n >= $7 AS over_day FROM pending, today) f
         ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(user_id)
    .bind(kind.as_str())
    .bind(event_key)
    .bind(detail)
    .bind(MAX_PENDING_PER_ACCOUNT)
    .bind(kind.is_notice())
    .bind(MAX_NOTICES_PER_DAY)
    .bind(MailKind::ALL.into_iter().filter(|k| k.is_notice()).map(MailKind::as_str).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    // The senders wake when this commits: a reset link arrives at once, not at the next poll.
    sqlx::query("SELECT pg_notify($1, '')").bind(WAKE_CHANNEL).execute(conn).await?;
    Ok(())
}

/// Senders listen here for mail to send (the poll is the backstop).
pub const WAKE_CHANNEL: &str = "sluice_mail";

#[derive(sqlx::FromRow)]
struct Claimed {
    id: i64,
    user_id: i64,
    kind: String,
    detail: Value,
    attempts: i32,
    created_at: chrono::DateTime<chrono::Utc>,
    /// None when the account is deleted.
    email: Option<String>,
    verified: bool,
    wanted: bool,
    mail_key: String,
}

/// Claim up to `max` due mails, oldest first, each leased so no other sender takes it.
async fn claim_due(pool: &PgPool, config: &MailConfig, max: i64) -> Result<Vec<Claimed>> {
    Ok(sqlx::query_as(
        "WITH claimed AS (
             UPDATE mail_outbox m SET attempts = m.attempts + 1, next_attempt_at = now() + make_interval(secs => $1)
             WHERE m.id IN (SELECT id FROM mail_outbox
                            WHERE sent_at IS NULL AND gave_up_at IS NULL AND next_attempt_at <= now()
                            ORDER BY next_attempt_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING m.id, m.user_id, m.kind, m.detail, m.attempts, m.created_at)
         SELECT c.*, CASE WHEN u.deleted_at IS NULL THEN u.email END AS email,
                u.email_verified_at IS NOT NULL AS verified,
                CASE c.kind WHEN 'done' THEN u.mail_done WHEN 'failed' THEN u.mail_failed
                            WHEN 'credits_low' THEN u.mail_credits_low ELSE true END AS wanted,
                u.mail_key::text AS mail_key
         FROM claimed c JOIN users u ON u.id = c.user_id",
    )
    .bind(config.lease.as_secs_f64())
    .bind(max.max(0))
    .fetch_all(pool)
    .await?)
}

/// What became of one mail.
enum Outcome {
    Sent,
    /// Worth another try later.
    Failed(String),
    /// Not to be sent at all (the account is gone, the user turned the notice off, the link
    /// has expired).
    Dropped(String),
}

/// Mails sent at once by one process.
const LANES: usize = 4;

/// Claim up to `max` due mails, send them, record what happened; returns how many were tried.
pub async fn send_due(pool: &PgPool, config: &MailConfig, sender: &Sender, max: i64) -> Result<usize> {
    use futures::StreamExt;
    let from: Mailbox = match config.from.parse() {
        Ok(from) => from,
        Err(e) => {
            tracing::error!(from = %config.from, error = %e, "the mail sender address is not usable");
            return Ok(0);
        }
    };
    let claimed = claim_due(pool, config, max).await?;
    let tried = claimed.len();
    let results: Vec<Result<()>> = futures::stream::iter(claimed)
        .map(|mail| {
            let from = from.clone();
            async move {
                let outcome = attempt(config, sender, &from, &mail).await;
                record(pool, config, &mail, outcome).await
            }
        })
        .buffer_unordered(LANES)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(tried)
}

async fn attempt(config: &MailConfig, sender: &Sender, from: &Mailbox, mail: &Claimed) -> Outcome {
    let Some(kind) = MailKind::parse(&mail.kind) else { return Outcome::Dropped("unknown kind".into()) };
    let Some(to) = &mail.email else { return Outcome::Dropped("the account was deleted".into()) };
    if kind.is_notice() && !mail.verified {
        return Outcome::Dropped("notices go only to a verified address".into());
    }
    if !mail.wanted {
        return Outcome::Dropped("the user turned this notice off".into());
    }
    let detail: Detail = serde_json::from_value(mail.detail.clone()).unwrap_or_default();
    if let Some(minutes) = detail.valid_minutes {
        if chrono::Utc::now() > mail.created_at + chrono::Duration::minutes(minutes) {
            return Outcome::Dropped("its link expired before it could be sent".into());
        }
    }
    let recipient = Recipient { user_id: mail.user_id, mail_key: mail.mail_key.clone() };
    let Some(letter) = compose(kind, &detail, &config.site, &recipient) else {
        return Outcome::Dropped("nothing to say".into());
    };
    let message = match message(from, to, &letter) {
        Ok(message) => message,
        Err(e) => return Outcome::Dropped(e),
    };
    match sender.send(MailName { user_id: mail.user_id, mail_id: mail.id }, message).await {
        Ok(()) => Outcome::Sent,
        Err(e) => Outcome::Failed(e),
    }
}

async fn record(pool: &PgPool, config: &MailConfig, mail: &Claimed, outcome: Outcome) -> Result<()> {
    let (sent, error, give_up) = match outcome {
        Outcome::Sent => (true, None, false),
        Outcome::Failed(e) => (false, Some(e), mail.attempts >= config.max_attempts),
        Outcome::Dropped(e) => (false, Some(e), true),
    };
    metrics::counter!("sluice_mail_attempts_total",
        "outcome" => if sent { "sent" } else if give_up { "gave_up" } else { "retry" })
    .increment(1);
    if let (Some(error), false) = (&error, give_up) {
        tracing::warn!(mail = mail.id, attempt = mail.attempts, %error, "sending a mail failed; it is tried again");
    }
    // A link's secret leaves the row once the mail is sent or given up: only its hash stays
    // (with the link itself).
    sqlx::query(
        "UPDATE mail_outbox SET last_error = $2,
                sent_at = CASE WHEN $3 THEN now() END,
                gave_up_at = CASE WHEN $4 THEN now() END,
                detail = CASE WHEN $3 OR $4 THEN detail - 'token' ELSE detail END,
                next_attempt_at = now() + make_interval(secs => $5)
         WHERE id = $1 AND attempts = $6 AND sent_at IS NULL AND gave_up_at IS NULL",
    )
    .bind(mail.id)
    .bind(error)
    .bind(sent)
    .bind(give_up)
    .bind(crate::webhooks::outbox::retry_delay(mail.attempts).as_secs_f64())
    .bind(mail.attempts)
    .execute(pool)
    .await?;
    Ok(())
}

/// Send due mail until aborted (every process runs one; claims keep them apart).
pub async fn run(pool: PgPool, config: MailConfig) {
    let sender = match config.transport.open() {
        Ok(sender) => sender,
        Err(e) => {
            tracing::error!(error = %e, "mail cannot be sent; it waits in the outbox");
            return;
        }
    };
    tracing::info!("mail goes to {}", config.transport.describe());
    let mut tick = tokio::time::interval(config.poll_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prune_tick = tokio::time::interval(FOLDER_PRUNE_EVERY);
    prune_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut listener = None;
    const BATCH: i64 = LANES as i64 * 4;
    loop {
        if listener.is_none() {
            listener = listen(&pool).await;
        }
        let mut prune = false;
        match listener.as_mut() {
            Some(l) => tokio::select! {
                _ = tick.tick() => {}
                _ = prune_tick.tick() => prune = true,
                note = l.recv() => match note {
                    Ok(note) => prune = note.payload() == FORGET_ACCOUNT,
                    Err(_) => listener = None,
                },
            },
            None => tokio::select! {
                _ = tick.tick() => {}
                _ = prune_tick.tick() => prune = true,
            },
        }
        if let (true, Some(folder)) = (prune, sender.folder()) {
            if let Err(e) = prune_folder(&pool, folder, config.folder_retention).await {
                tracing::warn!(error = %e, "pruning the mail folder failed");
            }
        }
        loop {
            match send_due(&pool, &config, &sender, BATCH).await {
                Ok(n) if n as i64 == BATCH => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "sending mail failed");
                    break;
                }
            }
        }
    }
}

/// How often a mail folder is pruned (also at start, and whenever an account is deleted).
const FOLDER_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Delete a mail folder's files older than `age` and every file of an account that is
/// deleted (or gone); returns how many went.
pub async fn prune_folder(pool: &PgPool, folder: &MailFolder, age: Duration) -> Result<usize> {
    let held = folder.accounts().map_err(|e| crate::error::EngineError::Storage(format!("the mail folder: {e}")))?;
    let gone: Vec<i64> = sqlx::query_scalar(
        "SELECT x FROM unnest($1::int8[]) x
         WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = x AND u.deleted_at IS NULL)",
    )
    .bind(&held)
    .fetch_all(pool)
    .await?;
    folder
        .prune(age, &|id| gone.contains(&id))
        .map_err(|e| crate::error::EngineError::Storage(format!("the mail folder: {e}")))
}

/// Tell every process's mail sender that an account is gone (in the deletion's transaction):
/// its mail in a folder is deleted at once.
pub async fn forget_account(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(WAKE_CHANNEL).bind(FORGET_ACCOUNT).execute(conn).await?;
    Ok(())
}

/// A listener on [`WAKE_CHANNEL`], or None (the poll still sends).
async fn listen(pool: &PgPool) -> Option<sqlx::postgres::PgListener> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await.ok()?;
    listener.listen(WAKE_CHANNEL).await.ok()?;
    Some(listener)
}

/// Delete mails sent or given up more than `age` ago (maintenance).
pub async fn prune(pool: &PgPool, age: Duration) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM mail_outbox WHERE (sent_at IS NOT NULL OR gave_up_at IS NOT NULL)
           AND coalesce(sent_at, gave_up_at) < now() - make_interval(secs => $1)",
    )
    .bind(age.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}
