//! The account's side: notices, credits, API tokens, and the site's public terms.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::{CreditSummary, MailChoicesInfo, NewToken, NoticeInfo, SiteTerms, TokenInfo};
#[cfg(feature = "ssr")]
use crate::server::session::{answer, context, require_user};

/// The caller's newest notices.
#[server(endpoint = "notices")]
pub async fn notices() -> Result<Vec<NoticeInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::notices::list(&ctx.pool, user.id, 100).await?.into_iter().map(Into::into).collect())
    })
    .await
}

/// How many of the caller's notices are unread (the header's count).
#[server(endpoint = "unread_notices")]
pub async fn unread_notices() -> Result<i64, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::notices::unread_count(&ctx.pool, user.id).await?)
    })
    .await
}

/// Mark one notice (or all, with `None`) as read.
#[server(endpoint = "mark_notices_read")]
pub async fn mark_notices_read(id: Option<i64>) -> Result<u64, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::notices::mark_read(&ctx.pool, user.id, id).await?)
    })
    .await
}

/// The balance and the ledger.
#[server(endpoint = "credits")]
pub async fn credits() -> Result<CreditSummary, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = crate::server::session::fresh(&ctx, &require_user(&ctx).await?).await?;
        let history = engine::accounts::ledger::history(&ctx.pool, user.id, 200).await?;
        let months = engine::accounts::ledger::monthly_totals(&ctx.pool, user.id, 12).await?;
        Ok(CreditSummary { balance: user.balance, history: history.into_iter().map(Into::into).collect(), months })
    })
    .await
}

/// A new API token; its secret is in this answer only.
#[server(endpoint = "create_token")]
pub async fn create_token(name: String) -> Result<NewToken, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let (token, secret) = engine::accounts::tokens::create(&ctx.pool, user.id, &name).await?;
        Ok(NewToken { token: token.into(), secret })
    })
    .await
}

/// The caller's API tokens.
#[server(endpoint = "list_tokens")]
pub async fn list_tokens() -> Result<Vec<TokenInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::tokens::list(&ctx.pool, user.id).await?.into_iter().map(Into::into).collect())
    })
    .await
}

/// Delete the caller's account, after their password: sessions and tokens stop working on
/// every process, waiting jobs are canceled and running ones stopped, documents, results,
/// file names and the e-mail address are erased; the credit history stays for the books.
#[server(endpoint = "delete_account")]
pub async fn delete_account(password: String) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        // Guesses here count like guesses at the log-in (a stolen session must not try freely).
        let limits = ctx.settings.login_limits;
        let key = format!("delete_account:{}", user.id);
        let taken = engine::accounts::throttle::take(&ctx.pool, &key, limits.per_account, limits.window).await?;
        if !engine::accounts::users::password_matches(&ctx.pool, user.id, &password).await? {
            return Err(AppError::BadCredentials);
        }
        engine::accounts::throttle::give_back(&ctx.pool, taken).await?;
        engine::accounts::deletion::delete_account(&ctx.pool, &ctx.blobs, user.id).await?;
        crate::server::session::end_session(&crate::server::session::session().await?).await
    })
    .await
}

/// Revoke one of the caller's tokens (anyone else's is 404).
#[server(endpoint = "revoke_token")]
pub async fn revoke_token(id: i64) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::tokens::revoke(&ctx.pool, user.id, id).await?)
    })
    .await
}

/// What this server offers and charges: its presets (language-model presets need a
/// provider), the cost per document, the upload cap and the sign-up grant. Public.
#[server(endpoint = "terms")]
pub async fn terms() -> Result<SiteTerms, AppError> {
    use crate::model::PresetInfo;
    answer(async move {
        let ctx = context()?;
        let settings = &ctx.settings;
        let ocr = settings.survey_reader.as_ref().and_then(|reader| reader.ocr.as_deref());
        Ok(SiteTerms {
            presets: settings.presets.iter().map(|&p| PresetInfo { id: p, label: p.label().to_string() }).collect(),
            cost: settings.admission.prices.cheapest(),
            prices: settings.admission.prices.clone(),
            max_document_tokens: settings.admission.max_document_tokens,
            max_upload_bytes: settings.max_upload_bytes,
            signup_grant: settings.signup_grant,
            verify_email: settings.require_email_verification,
            economy: settings.admission.economy,
            ocr_languages: ocr.map(|o| o.languages.clone()).unwrap_or_default(),
            detect_language: ocr.is_some_and(|o| o.detect_language),
        })
    })
    .await
}

/// The names of the glossaries saved in the caller's account (for the upload page's choice).
#[server(endpoint = "glossary_names")]
pub async fn glossary_names() -> Result<Vec<String>, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::documents::glossaries::list(&ctx.pool, user.id).await?.into_iter().map(|g| g.name).collect())
    })
    .await
}

/// Which notices also come by e-mail.
#[server(endpoint = "mail_choices")]
pub async fn mail_choices() -> Result<MailChoicesInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        Ok(engine::accounts::recovery::mail_choices(&ctx.pool, user.id).await?.into())
    })
    .await
}

/// Choose which notices also come by e-mail.
#[server(endpoint = "set_mail_choices")]
pub async fn set_mail_choices(done: bool, failed: bool, credits_low: bool) -> Result<MailChoicesInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let choices = engine::accounts::recovery::MailChoices { done, failed, credits_low };
        Ok(engine::accounts::recovery::set_mail_choices(&ctx.pool, user.id, choices).await?.into())
    })
    .await
}
