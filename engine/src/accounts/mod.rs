//! Accounts: who may submit work and what it costs them. Users and log-in, API tokens, the
//! credit ledger, notices, admission (the one conditional write that takes the credits and
//! counts the job in flight) and the hooks that settle accounts when a job ends.

pub mod admission;
pub mod auth_cache;
pub mod backlog;
pub mod deletion;
mod hooks;
pub mod ledger;
pub mod links;
pub mod login;
pub mod notices;
pub mod recovery;
pub mod signup;
pub mod staff;
pub mod throttle;
pub mod tokens;
pub mod users;

pub use hooks::AccountHooks;
pub use users::{Role, User};
