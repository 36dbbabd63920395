//! Acknowledgements: an admin says they have seen an alert firing or a reconciliation report
//! (who, when, an optional note). The admin page shows it, and an alert's resolving webhook
//! carries it (the firing row is sent whole).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::audit::audit;
use crate::error::{EngineError, Result};

/// What is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acked {
    Alert(i64),
    Report(i64),
}

/// Who acknowledged it, when, and what they said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Acknowledgement {
    pub by: String,
    pub at: DateTime<Utc>,
    pub note: Option<String>,
}

/// Acknowledge `what`. Acknowledging again replaces the note and the name (the newest word
/// stands). Audited. Not found for an id that is none.
pub async fn acknowledge(pool: &PgPool, what: Acked, note: &str, actor: &str) -> Result<Acknowledgement> {
    let note = note.trim();
    if note.chars().count() > crate::queue::reviews::NOTE_MAX {
        return Err(EngineError::Invalid(format!("a note is at most {} characters", crate::queue::reviews::NOTE_MAX)));
    }
    let note = (!note.is_empty()).then(|| note.to_string());
    let (table, id, subject) = match what {
        Acked::Alert(id) => ("alert_firings", id, format!("alert {id}")),
        Acked::Report(id) => ("reconciliation_reports", id, format!("reconciliation report {id}")),
    };
    let mut tx = pool.begin().await?;
    let at: Option<DateTime<Utc>> = sqlx::query_scalar(&format!(
        "UPDATE {table} SET acked_by = $2, acked_at = now(), ack_note = $3 WHERE id = $1 RETURNING acked_at"
    ))
    .bind(id)
    .bind(actor)
    .bind(&note)
    .fetch_optional(&mut *tx)
    .await?;
    let at = at.ok_or(EngineError::NotFound)?;
    audit(&mut tx, actor, "acknowledge", Some(&subject), "", note.as_deref().unwrap_or("")).await?;
    tx.commit().await?;
    Ok(Acknowledgement { by: actor.to_string(), at, note })
}

/// Pure: the acknowledgement a row's three columns hold, if any.
pub fn from_columns(by: Option<String>, at: Option<DateTime<Utc>>, note: Option<String>) -> Option<Acknowledgement> {
    Some(Acknowledgement { by: by?, at: at?, note })
}
