//! The web layer's one error type, shared by server functions and the REST API, with its
//! mapping to HTTP status in one place ([`AppError::status`]).

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum AppError {
    #[error("please log in first")]
    Unauthenticated,
    #[error("not found")]
    NotFound,
    #[error("this request came from another site and was refused")]
    CrossSite,
    #[error("{message}")]
    Invalid { message: String },
    #[error("an account with this e-mail address already exists")]
    EmailTaken,
    #[error("wrong e-mail address or password")]
    BadCredentials,
    #[error("too many attempts; try again in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    #[error("out of credits: this document costs {cost}, your balance is {balance}")]
    OutOfCredits { balance: i64, cost: i64 },
    #[error("you have {in_flight} of {limit} documents in progress; try again in {retry_after_secs} s")]
    TooManyInFlight { in_flight: i32, limit: i32, retry_after_secs: u64 },
    #[error("Sluice is not accepting new documents right now (nothing was stored); try again in {retry_after_secs} s")]
    Overloaded { retry_after_secs: u64 },
    #[error("you have {limit} uploads in progress already; try again in {retry_after_secs} s")]
    TooManyUploads { limit: usize, retry_after_secs: u64 },
    #[error("the file is larger than the limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    /// A request other than an upload carried more than its route takes.
    #[error("the request is larger than the {limit_bytes} bytes this address takes")]
    BodyTooLarge { limit_bytes: u64 },
    #[error("your stored documents take {} of your {} of storage; this one would pass it (nothing was stored)", crate::format::size_text(*used_bytes), crate::format::size_text(*quota_bytes))]
    StorageFull { used_bytes: u64, quota_bytes: u64 },
    #[error("the document is longer than Sluice takes in one document (about {max_tokens} tokens); split it and upload the pieces")]
    TooManyTokens { max_tokens: u64 },
    #[error("{message}")]
    UnsupportedType { message: String },
    #[error("{message}")]
    IdempotencyConflict { message: String },
    #[error("the job is not done yet (it is {state})")]
    NotReady { state: String },
    #[error("the job has already ended (it is {state})")]
    AlreadyEnded { state: String },
    /// "Retry now" for a job that is not waiting to retry.
    #[error("only a job waiting to retry can retry now (this one is {state})")]
    NotRetrying { state: String },
    /// "Run next" for a job that is not waiting.
    #[error("only a waiting job can be put first in line (this one is {state})")]
    NotWaiting { state: String },
    /// Deleting a job that has not ended.
    #[error("the job has not ended (it is {state}); cancel it first")]
    NotEnded { state: String },
    /// A download that cannot be made from what the job holds: a translated file whose
    /// paragraphs do not line up, parts of a job with none answered.
    #[error("{message}")]
    CannotDownload { message: String },
    /// A job's document is no longer kept (retention), so it cannot be run again.
    #[error("the original document is no longer kept; upload it again")]
    Gone,
    /// A mailed link used before, expired, or never issued.
    #[error("this link has expired or was already used; ask for a new one")]
    LinkExpired,
    /// Its owner deleted the job's document and result.
    #[error("this job's document and result were deleted by their owner")]
    Deleted,
    /// The database cannot be reached (a restart): nothing was changed, waiting helps.
    #[error("Sluice is restarting, try again in a few seconds")]
    Unavailable { retry_after_secs: u64 },
    /// A lock the work needs was busy past its wait (a backup listing its documents).
    #[error("Sluice is busy for a moment; try again in {retry_after_secs} s")]
    Busy { retry_after_secs: u64 },
    /// The document store has no room left: nothing was stored or charged.
    #[error("Sluice's document store is full right now, so nothing was stored or charged; try again in {retry_after_secs} s")]
    StoreFull { retry_after_secs: u64 },
    #[error("something went wrong on our side")]
    Internal,
    #[error("{0}")]
    ServerFn(ServerFnErrorErr),
}

impl AppError {
    /// Seconds a client is told to wait while the database restarts.
    pub const RESTART_RETRY_SECS: u64 = 5;

    pub fn unavailable() -> AppError {
        AppError::Unavailable { retry_after_secs: Self::RESTART_RETRY_SECS }
    }

    /// Seconds a client is told to wait while the document store is full (an operator frees
    /// room, or released documents do).
    pub const STORE_FULL_RETRY_SECS: u64 = 60;

    pub fn store_full() -> AppError {
        AppError::StoreFull { retry_after_secs: Self::STORE_FULL_RETRY_SECS }
    }

    pub fn invalid(message: impl Into<String>) -> AppError {
        AppError::Invalid { message: message.into() }
    }

    /// The HTTP status for this error: the one mapping for the UI and the API.
    pub fn status(&self) -> u16 {
        match self {
            AppError::Unauthenticated | AppError::BadCredentials => 401,
            AppError::OutOfCredits { .. } => 402,
            AppError::CrossSite => 403,
            AppError::NotFound => 404,
            AppError::NotReady { .. }
            | AppError::AlreadyEnded { .. }
            | AppError::NotEnded { .. }
            | AppError::NotRetrying { .. }
            | AppError::NotWaiting { .. }
            | AppError::CannotDownload { .. } => 409,
            AppError::EmailTaken => 409,
            AppError::Gone | AppError::Deleted | AppError::LinkExpired => 410,
            AppError::TooLarge { .. }
            | AppError::BodyTooLarge { .. }
            | AppError::TooManyTokens { .. }
            | AppError::StorageFull { .. } => 413,
            AppError::UnsupportedType { .. } => 415,
            AppError::Invalid { .. } | AppError::IdempotencyConflict { .. } => 422,
            AppError::RateLimited { .. } | AppError::TooManyInFlight { .. } | AppError::TooManyUploads { .. } => 429,
            AppError::Internal => 500,
            AppError::StoreFull { .. } => 507,
            AppError::Overloaded { .. } | AppError::Unavailable { .. } | AppError::Busy { .. } => 503,
            AppError::ServerFn(ServerFnErrorErr::Args(_) | ServerFnErrorErr::Deserialization(_)) => 400,
            AppError::ServerFn(_) => 500,
        }
    }

    /// Seconds for a `Retry-After` header, where waiting helps.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            AppError::RateLimited { retry_after_secs }
            | AppError::TooManyInFlight { retry_after_secs, .. }
            | AppError::TooManyUploads { retry_after_secs, .. }
            | AppError::Overloaded { retry_after_secs }
            | AppError::Unavailable { retry_after_secs }
            | AppError::StoreFull { retry_after_secs }
            | AppError::Busy { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        AppError::ServerFn(value)
    }
}

#[cfg(feature = "ssr")]
mod ssr {
    use super::AppError;
    use engine::accounts::admission::Refusal;
    use engine::EngineError;

    impl From<EngineError> for AppError {
        fn from(e: EngineError) -> Self {
            if e.is_unavailable() {
                tracing::warn!(error = %e, "the database is unreachable; answering 503");
                return AppError::unavailable();
            }
            if e.is_busy() {
                return AppError::Busy { retry_after_secs: AppError::RESTART_RETRY_SECS };
            }
            match e {
                EngineError::NotFound => AppError::NotFound,
                EngineError::Invalid(message) | EngineError::InvalidSetting(message) => AppError::Invalid { message },
                EngineError::EmailTaken => AppError::EmailTaken,
                EngineError::LinkExpired => AppError::LinkExpired,
                EngineError::BadCredentials => AppError::BadCredentials,
                EngineError::RateLimited { retry_after_secs } => AppError::RateLimited { retry_after_secs },
                EngineError::IdempotencyConflict(message) => AppError::IdempotencyConflict { message },
                EngineError::ReadersBusy { retry_after_secs } => AppError::Overloaded { retry_after_secs },
                EngineError::TooLarge { limit_bytes } => AppError::TooLarge { limit_bytes },
                EngineError::TooManyTokens { max_tokens } => AppError::TooManyTokens { max_tokens },
                EngineError::UnsupportedType(message) => AppError::UnsupportedType { message },
                EngineError::StoreFull => {
                    tracing::error!("the document store is full: uploads are refused until there is room");
                    AppError::store_full()
                }
                EngineError::Database(_) | EngineError::Migrate(_) | EngineError::Storage(_) => {
                    tracing::error!(error = %e, "engine failure");
                    AppError::Internal
                }
            }
        }
    }

    impl From<Refusal> for AppError {
        fn from(r: Refusal) -> Self {
            match r {
                Refusal::OutOfCredits { balance, cost } => AppError::OutOfCredits { balance, cost },
                Refusal::TooManyInFlight { in_flight, limit, retry_after_secs } => {
                    AppError::TooManyInFlight { in_flight, limit, retry_after_secs }
                }
                Refusal::Overloaded { retry_after_secs } => AppError::Overloaded { retry_after_secs },
                Refusal::StorageFull { used_bytes, quota_bytes } => AppError::StorageFull { used_bytes, quota_bytes },
            }
        }
    }

    /// Put the error's status (and `Retry-After`) on a server function's response.
    pub fn respond(err: AppError) -> AppError {
        if let Some(options) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>() {
            options.set_status(
                http::StatusCode::from_u16(err.status()).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
            );
            if let Some(secs) = err.retry_after() {
                options.insert_header(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
            }
        }
        err
    }
}

#[cfg(feature = "ssr")]
pub use ssr::respond;
