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
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
