//! Pure policy: no IO, no clock, no randomness of their own; unit- and property-tested.

pub mod adaptive;
pub mod deadline;
pub mod drain;
pub mod fair_tags;
pub mod lanes;
pub mod position;
pub mod retry;
