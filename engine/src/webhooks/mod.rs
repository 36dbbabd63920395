//! Outgoing webhooks: alert firings to the operator's receiver, and job endings to an API
//! client's callback URL (seeds 003 and 004: the alternative to polling).
//!
//! A delivery is a durable row ([`outbox`]): enqueued in the transaction of the event it
//! reports (so it is never lost and never sent for something that rolled back), keyed by the
//! event (so each is sent once), then POSTed by any process's deliverer, retried with backoff
//! across restarts, and signed ([`signing`]). Callback URLs are user input and are held to a
//! [`target::TargetPolicy`] (no requests into our own network).
//!
//! Deliveries are not rows of the job queue: the queue's gate and kill switch hold back calls
//! to the AI providers, and its fairness and in-flight counts are users' documents; neither
//! should delay or count a notification.

pub mod completion;
pub mod outbox;
pub mod signing;
pub mod target;

pub use outbox::{DeliveryConfig, DeliveryStatus};
pub use target::TargetPolicy;
