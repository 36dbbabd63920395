//! The server's API tests, laid out by what they test (zero2prod's `tests/api`): one binary,
//! so the helpers are compiled once.

mod cancel;
mod contract;
mod deletion;
mod downloads;
mod estimate;
mod glossaries;
mod helpers;
mod http_layer;
mod mail;
mod metrics;
mod operator;
mod pool_full;
mod pricing;
mod restart;
mod scans;
mod sessions;
mod staff;
mod store_full;
mod support;
mod untrusted;
mod upload_function;
mod uploads;
mod webhooks;
