//! Sign up, log in, log out, and who is logged in.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::UserInfo;
#[cfg(feature = "ssr")]
use crate::server::session::{
    answer, client_address, context, device_token, end_session, keep_device_token, session, session_user, start_session,
};

/// Create an account with the sign-up grant and log it in (throttled per address and overall).
#[server(endpoint = "sign_up")]
pub async fn sign_up(email: String, password: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let settings = &ctx.settings;
        let client = client_address(&settings.trusted_proxies).await;
        let (grant, limits) = (settings.signup_grant, settings.signup_limits);
        let user = engine::accounts::users::sign_up(&ctx.pool, &email, &password, grant, &client, limits).await?;
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
