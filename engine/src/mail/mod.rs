//! Mail: verification and reset links, and the notices a user chose (a document done, failed
//! and refunded, credits low).
//!
//! Never sent from a request's path: a mail is a durable row ([`outbox`]) written in the
//! transaction of the event it reports, then sent by any process's sender through SMTP
//! (`--smtp-url`) or, with no server configured, written as an `.eml` file to a folder so a
//! default install still shows it ([`transport`]). Retried with backoff, bounded per account,
//! pruned. What each mail says is pure ([`compose`]).

pub mod compose;
pub mod outbox;
pub mod transport;

pub use compose::{MailKind, LOW_CREDITS};
pub use outbox::MailConfig;
pub use transport::Transport;
