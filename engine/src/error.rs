use thiserror::Error;

/// The engine's one error type; the web layer maps it to HTTP status in one place.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("not found")]
    NotFound,
    #[error("invalid setting: {0}")]
    InvalidSetting(String),
    /// Input a user can fix (a malformed e-mail, a short password, ...).
    #[error("{0}")]
    Invalid(String),
    #[error("an account with this e-mail address already exists")]
    EmailTaken,
    #[error("wrong e-mail address or password")]
    BadCredentials,
    #[error("too many failed attempts; try again in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// An upload past the size limit.
    #[error("the file is larger than the limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    /// An upload that is not a PDF, text or Markdown document (the reason says what it is).
    #[error("{0}")]
    UnsupportedType(String),
    #[error("blob storage: {0}")]
    Storage(String),
    /// An `Idempotency-Key` reused with a different request.
    #[error("{0}")]
    IdempotencyConflict(String),
}

/// The engine's results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
