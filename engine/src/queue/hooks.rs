//! The seam where other parts of Sluice join a job's terminal transitions.
//!
//! Each hook runs inside the engine's transaction for that transition, so its writes
//! (in-flight counters, refunds, notices) commit or roll back together with the job's state.

use futures::future::BoxFuture;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::FailureKind;

/// The job at a terminal transition (or when a replay makes it live again).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TerminalJob {
    pub id: Uuid,
    pub owner_id: i64,
    pub cost: i32,
    pub attempts: i32,
    /// Set for `failed`: the kind and the reason.
    #[sqlx(skip)]
    pub failure: Option<(FailureKind, String)>,
}

/// What a hook returns: its writes happen in the caller's transaction.
pub type HookResult<'a> = BoxFuture<'a, Result<(), sqlx::Error>>;

/// Writes that must commit with a job's terminal transition.
pub trait TerminalHooks: Send + Sync + 'static {
    /// The job reached `done`.
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a>;
    /// The job reached `failed` (from any path: permanent error, exhaustion, rescue).
    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a>;
    /// A failed job was replayed from the dead-letter queue and is live again.
    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a>;
    /// The job reached `canceled` (waiting, or running with a cancellation request).
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a>;
    /// A failed job was discarded from the dead-letter queue (it stays failed; its money was
    /// settled when it failed, so by default nothing happens).
    fn on_discarded<'a>(&'a self, _: &'a mut PgConnection, _: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// Hooks that do nothing (the engine on its own, tests, benchmarks).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl TerminalHooks for NoHooks {
    fn on_done<'a>(&'a self, _: &'a mut PgConnection, _: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async { Ok(()) })
    }
    fn on_failed<'a>(&'a self, _: &'a mut PgConnection, _: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async { Ok(()) })
    }
    fn on_replayed<'a>(&'a self, _: &'a mut PgConnection, _: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async { Ok(()) })
    }
    fn on_canceled<'a>(&'a self, _: &'a mut PgConnection, _: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async { Ok(()) })
    }
}
