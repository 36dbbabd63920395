//! Queue drain math (pure): how long until the backlog is gone at the current rates.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When the backlog will be gone, at the current rates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum DrainEstimate {
    /// Nothing is waiting.
    Empty,
    /// At the current rates the backlog is gone after this long.
    DrainsIn(Duration),
    /// Intake keeps up with or exceeds completions: the backlog does not shrink.
    NotDraining,
}

/// backlog / (completions - intake), or "not draining" when intake >= completions.
pub fn drain_estimate(backlog: u64, intake_per_sec: f64, completions_per_sec: f64) -> DrainEstimate {
    if backlog == 0 {
        return DrainEstimate::Empty;
    }
    let net = completions_per_sec - intake_per_sec;
    if !net.is_finite() || net <= 0.0 {
        return DrainEstimate::NotDraining;
    }
    DrainEstimate::DrainsIn(Duration::from_secs_f64(backlog as f64 / net))
}

/// The backlog after `seconds` at steady rates (never below zero).
pub fn backlog_after(backlog: f64, intake_per_sec: f64, completions_per_sec: f64, seconds: f64) -> f64 {
    (backlog + (intake_per_sec - completions_per_sec) * seconds).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Seed 001: 120/s in and 100/s out for 60 s leaves 1,200 waiting; then at 80/s in the
    /// backlog is gone 60 s later, at 120 s.
    #[test]
    fn seed_001_burst_then_recovery() {
        let after_burst = backlog_after(0.0, 120.0, 100.0, 60.0);
        assert_eq!(after_burst, 1200.0);
        assert_eq!(drain_estimate(1200, 80.0, 100.0), DrainEstimate::DrainsIn(Duration::from_secs(60)));
        assert_eq!(backlog_after(after_burst, 80.0, 100.0, 60.0), 0.0);
        // During the burst itself the queue is not draining.
        assert_eq!(drain_estimate(600, 120.0, 100.0), DrainEstimate::NotDraining);
    }

    #[test]
    fn equal_rates_do_not_drain_and_empty_is_empty() {
        assert_eq!(drain_estimate(10, 5.0, 5.0), DrainEstimate::NotDraining);
        assert_eq!(drain_estimate(0, 5.0, 1.0), DrainEstimate::Empty);
        assert_eq!(drain_estimate(10, 0.0, 0.0), DrainEstimate::NotDraining);
    }

    proptest! {
        #[test]
        fn estimate_empties_the_projected_backlog(backlog in 1u64..1_000_000, intake in 0.0f64..1000.0, extra in 0.01f64..1000.0) {
            let completions = intake + extra;
            match drain_estimate(backlog, intake, completions) {
                DrainEstimate::DrainsIn(d) => {
                    let left = backlog_after(backlog as f64, intake, completions, d.as_secs_f64());
                    prop_assert!(left < 1e-6 * backlog as f64 + 1e-6);
                }
                other => prop_assert!(false, "{other:?}"),
            }
        }
    }
}
