//! The terminal hooks the server runs the queue with: the accounts' (in flight, refunds,
//! notices), then the job's completion webhook, all in the transition's transaction.

use sqlx::PgConnection;

use crate::accounts::AccountHooks;
use crate::queue::hooks::{HookResult, TerminalHooks, TerminalJob};
use crate::webhooks::completion::enqueue_ending;

/// Accounts plus completion webhooks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SluiceHooks;

impl TerminalHooks for SluiceHooks {
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            AccountHooks.on_done(tx, job).await?;
            enqueue_ending(tx, job.id, "done").await
        })
    }

    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            AccountHooks.on_failed(tx, job).await?;
            enqueue_ending(tx, job.id, "failed").await
        })
    }

    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        AccountHooks.on_replayed(tx, job)
    }

    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            AccountHooks.on_canceled(tx, job).await?;
            enqueue_ending(tx, job.id, "canceled").await
        })
    }

    fn on_discarded<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        AccountHooks.on_discarded(tx, job)
    }
}
