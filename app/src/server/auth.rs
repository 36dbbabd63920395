//! Sign up, log in, log out, and who is logged in.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::UserInfo;
#[cfg(feature = "ssr")]
use crate::server::session::{
    answer, client_address, context, device_token, end_session, keep_device_token, require_user, session, session_user,
    start_session,
};
#[cfg(feature = "ssr")]
use engine::accounts::recovery;

/// Create an account and log it in (throttled per address and overall). The sign-up grant
/// comes with it, or, when addresses must be verified, with the link mailed to it.
#[server(endpoint = "sign_up")]
pub async fn sign_up(email: String, password: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let settings = &ctx.settings;
        let client = client_address(&settings.trusted_proxies).await;
        let (grant, limits, verify) =
            (settings.signup_grant, settings.signup_limits, settings.require_email_verification);
        let user =
            engine::accounts::signup::sign_up(&ctx.pool, &email, &password, grant, &client, limits, verify).await?;
        start_session(&session().await?, &user).await?;
        let device = engine::accounts::login::issue_device_token(&ctx.pool, user.id).await?;
        keep_device_token(&device, settings.secure_cookies);
        Ok(user.into())
    })
    .await
}

/// Check the password (throttled) and log in.
#[server(endpoint = "log_in")]
pub async fn log_in(email: String, password: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let client = client_address(&ctx.settings.trusted_proxies).await;
        let limits = ctx.settings.login_limits;
        let device = device_token().await;
        let logged_in =
            engine::accounts::login::log_in(&ctx.pool, &email, &password, &client, device.as_deref(), limits).await?;
        start_session(&session().await?, &logged_in.user).await?;
        keep_device_token(&logged_in.device_token, ctx.settings.secure_cookies);
        Ok(logged_in.user.into())
    })
    .await
}

/// End the session on the server.
#[server(endpoint = "log_out")]
pub async fn log_out() -> Result<(), AppError> {
    answer(async move { end_session(&session().await?).await }).await
}

/// The logged-in user, if any.
#[server(endpoint = "me")]
pub async fn me() -> Result<Option<UserInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        // The header shows the balance: as it is now, not as cached.
        match session_user(&ctx, &session().await?).await? {
            Some(user) => Ok(Some(crate::server::session::fresh(&ctx, &user).await?.into())),
            None => Ok(None),
        }
    })
    .await
}

/// Ask for a password reset link by mail. Answers the same whether or not an account uses the
/// address (throttled per address and per account: 429 alike for both).
#[server(endpoint = "forgot_password")]
pub async fn forgot_password(email: String) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let client = client_address(&ctx.settings.trusted_proxies).await;
        Ok(recovery::request_reset(&ctx.pool, &email, &client, ctx.settings.link_limits).await?)
    })
    .await
}

/// Set a new password with a reset link (once, within 30 minutes): every session, device and
/// API token of the account ends, and this browser is logged in afresh.
#[server(endpoint = "reset_password")]
pub async fn reset_password(token: String, password: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = recovery::reset_password(&ctx.pool, &token, &password, ctx.settings.signup_grant).await?;
        start_session(&session().await?, &user).await?;
        let device = engine::accounts::login::issue_device_token(&ctx.pool, user.id).await?;
        keep_device_token(&device, ctx.settings.secure_cookies);
        Ok(user.into())
    })
    .await
}

/// Prove the address with the link mailed at sign-up: the sign-up grant is given (once).
#[server(endpoint = "verify_email")]
pub async fn verify_email(token: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        Ok(recovery::verify(&ctx.pool, &token, ctx.settings.signup_grant).await?.into())
    })
    .await
}

/// Mail the verification link again (throttled).
#[server(endpoint = "resend_verification")]
pub async fn resend_verification() -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let client = client_address(&ctx.settings.trusted_proxies).await;
        Ok(recovery::resend_verification(&ctx.pool, &user, &client, ctx.settings.link_limits).await?)
    })
    .await
}

/// Change the password, knowing the current one. Every other session and device of the
/// account ends; its API tokens are revoked unless `keep_api_tokens`. This session stays.
#[server(endpoint = "change_password")]
pub async fn change_password(current: String, password: String, keep_api_tokens: bool) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let changed = recovery::change_password(&ctx.pool, user.id, &current, &password, keep_api_tokens).await?;
        // This session takes on the new epoch (with a new id); every other one is over.
        start_session(&session().await?, &changed).await?;
        let device = engine::accounts::login::issue_device_token(&ctx.pool, changed.id).await?;
        keep_device_token(&device, ctx.settings.secure_cookies);
        Ok(())
    })
    .await
}
