//! Completion webhooks: an API client registers a callback URL on its token (or sends a
//! `callback_url` with one upload); when the job ends (done, failed, canceled) its state is
//! POSTed there, signed with the token's secret. The callback travels in the job's payload as
//! `{url, token_id}`: an address and an id, never the secret.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::target::TargetPolicy;
use crate::error::{EngineError, Result};

/// Where a job's ending is reported, as kept in its payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callback {
    pub url: String,
    pub token_id: i64,
}

/// A token's registered callback (the secret is shown when it is set, and on rotation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Registered {
    pub url: String,
    pub secret: String,
}

/// Register (or replace) the callback URL of one of `user_id`'s tokens, with a new secret.
pub async fn register(
    pool: &PgPool,
    policy: &TargetPolicy,
    user_id: i64,
    token_id: i64,
    url: &str,
) -> Result<Registered> {
    let url = policy.check_url(url).map_err(EngineError::Invalid)?.to_string();
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret = format!("whsec_{}", hex::encode(bytes));
    let updated = sqlx::query(
        "UPDATE api_tokens SET callback_url = $3, callback_secret = $4
         WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL",
    )
    .bind(token_id)
    .bind(user_id)
    .bind(&url)
    .bind(&secret)
    .execute(pool)
    .await?;
    if updated.rows_affected() == 0 {
        return Err(EngineError::NotFound);
    }
    Ok(Registered { url, secret })
}

/// Remove a token's callback (its secret too).
pub async fn unregister(pool: &PgPool, user_id: i64, token_id: i64) -> Result<()> {
    sqlx::query("UPDATE api_tokens SET callback_url = NULL, callback_secret = NULL WHERE id = $1 AND user_id = $2")
        .bind(token_id)
        .bind(user_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// The callback for an upload: the one sent with it, else the token's registered one. A
/// callback needs a token (its secret signs the deliveries).
pub async fn for_upload(
    pool: &PgPool,
    policy: &TargetPolicy,
    token_id: Option<i64>,
    given: Option<&str>,
) -> Result<Option<Callback>> {
    match (token_id, given) {
        (None, Some(_)) => {
            Err(EngineError::Invalid("a callback_url needs an API token (Authorization: Bearer)".into()))
        }
        (None, None) => Ok(None),
        (Some(token_id), Some(url)) => {
            let url = policy.check_url(url).map_err(EngineError::Invalid)?.to_string();
            let has_secret: Option<bool> =
                sqlx::query_scalar("SELECT callback_secret IS NOT NULL FROM api_tokens WHERE id = $1")
                    .bind(token_id)
                    .fetch_optional(pool)
                    .await?;
            if has_secret != Some(true) {
                return Err(EngineError::Invalid(
                    "register a callback on this token first (PUT /api/v1/webhook): its secret signs the deliveries"
                        .into(),
                ));
            }
            Ok(Some(Callback { url, token_id }))
        }
        (Some(token_id), None) => {
            let url: Option<Option<String>> = sqlx::query_scalar("SELECT callback_url FROM api_tokens WHERE id = $1")
                .bind(token_id)
                .fetch_optional(pool)
                .await?;
            Ok(url.flatten().map(|url| Callback { url, token_id }))
        }
    }
}

/// Inside a job's terminal transition: queue the delivery of its ending, if it has a
/// callback. Keyed by the job, its ending and its attempt count, so an ending is sent once
/// (a job replayed from the DLQ that ends again reports that second ending too).
pub async fn enqueue_ending(
    conn: &mut PgConnection,
    job_id: Uuid,
    ending: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO webhook_deliveries (event_key, url, token_id, body, gave_up_at, last_error)
         SELECT format('job:%s:%s:%s:%s', j.id, $2, j.attempts, j.replays),
                j.payload #>> '{callback,url}',
                (j.payload #>> '{callback,token_id}')::bigint,
                jsonb_build_object(
                    'event', 'job.ended',
                    'job', jsonb_build_object(
                        'id', j.id, 'state', $2, 'attempts', j.attempts,
                        'file_name', j.payload #>> '{document,name}',
                        'preset', j.payload ->> 'preset',
                        'failure_kind', j.failure_kind, 'failure_reason', j.failure_reason,
                        'cost', j.cost, 'accepted_at', j.accepted_at, 'finished_at', coalesce(j.finished_at, now()),
                        'status_url', '/api/v1/jobs/' || j.id,
                        'result_url', CASE WHEN $2 = 'done' THEN '/api/v1/jobs/' || j.id || '/result' END)),
                -- An account with the most deliveries waiting gets this one given up, on the record.
                CASE WHEN pending.n >= $3 THEN now() END,
                CASE WHEN pending.n >= $3 THEN format('%s deliveries were already waiting for this account', $3) END
         FROM jobs j
         CROSS JOIN LATERAL (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM webhook_deliveries d
                 WHERE d.token_id IN (SELECT t.id FROM api_tokens t WHERE t.user_id = j.owner_id)
                   AND d.delivered_at IS NULL AND d.gave_up_at IS NULL LIMIT $3) p) pending
         WHERE j.id = $1 AND j.payload #>> '{callback,url}' IS NOT NULL
           AND EXISTS (SELECT 1 FROM api_tokens t WHERE t.id = (j.payload #>> '{callback,token_id}')::bigint)
         ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(job_id)
    .bind(ending)
    .bind(super::outbox::MAX_PENDING_PER_ACCOUNT)
    .execute(conn)
    .await?;
    Ok(())
}
