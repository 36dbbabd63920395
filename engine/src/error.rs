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
    #[error("too many attempts; try again in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// An upload past the size limit.
    #[error("the file is larger than the limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    /// A text longer than the provider reads at once (its context).
    #[error("the document is longer than Sluice takes in one document (about {max_tokens} tokens); split it and upload the pieces")]
    TooManyTokens { max_tokens: u64 },
    /// An upload that is not a PDF, text or Markdown document (the reason says what it is).
    #[error("{0}")]
    UnsupportedType(String),
    #[error("blob storage: {0}")]
    Storage(String),
    /// The document store has no room left (a full disk, a quota): nothing was stored.
    #[error("the document store is full")]
    StoreFull,
    /// A mailed link used before, expired, or never issued (all alike: none says which).
    #[error("this link has expired or was already used; ask for a new one")]
    LinkExpired,
    /// An `Idempotency-Key` reused with a different request.
    #[error("{0}")]
    IdempotencyConflict(String),
    /// Every document reader is busy: the request is asked for again shortly.
    #[error("every document reader is busy; try again in {retry_after_secs} s")]
    ReadersBusy { retry_after_secs: u64 },
}

impl EngineError {
    /// Whether the database cannot be reached right now (restarting, shutting down, refusing
    /// connections): waiting helps, so callers answer 503 with `Retry-After`, not 500.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EngineError::Database(e) if database_unavailable(e))
    }

    /// Whether a lock the work needs was not free within its wait (55P03, `lock_timeout`: a
    /// backup listing its documents): busy for a moment, so 503 with `Retry-After`.
    pub fn is_busy(&self) -> bool {
        matches!(self, EngineError::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03"))
    }
}

/// Whether a database error means the server is unreachable or going away, as during a
/// restart, rather than a fault in the request or the query.
pub fn database_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        // Class 08: connection exception; 57P01-57P03: admin/crash shutdown, cannot connect now.
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|code| code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable_and_query_faults_are_not() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(EngineError::Database(sqlx::Error::Io(refused)).is_unavailable());
        assert!(EngineError::Database(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(!EngineError::Database(sqlx::Error::RowNotFound).is_unavailable());
        assert!(!EngineError::Database(sqlx::Error::ColumnNotFound("x".into())).is_unavailable());
        assert!(!EngineError::NotFound.is_unavailable());
    }
}

/// The engine's results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
