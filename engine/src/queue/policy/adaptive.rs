//! The adaptive gate's decrease: when the provider says "too many" (429) or "overloaded" (529),
//! halve the gate in force (multiplicative decrease), at most once per cooldown, so a burst of
//! refusals from requests already in flight counts as one signal. The gate then grows back by
//! one slot per step (additive increase) up to the configured gate: that part is a formula the
//! claim evaluates in Postgres (`sluice_effective_gate`), so every process sees the same gate.

use std::time::Duration;

/// A burst of refusals within this long of the last cut is the same signal, not a new one.
pub const DECREASE_COOLDOWN: Duration = Duration::from_secs(2);

/// The gate after a refusal, given the gate in force now and how long ago it was last cut
/// (`None`: never). `None` when it stays as it is (within the cooldown).
pub fn after_refusal(in_force: i32, since_last_cut: Option<Duration>) -> Option<i32> {
    if in_force <= 1 || since_last_cut.is_some_and(|since| since < DECREASE_COOLDOWN) {
        return None;
    }
    Some((in_force / 2).max(1))
}

/// Why the gate is lower than configured, in the operator's words.
pub fn reason(status: Option<u16>, from: i32, to: i32) -> String {
    let said = match status {
        Some(529) => "the provider answered 529 (overloaded)".to_string(),
        Some(code) => format!("the provider answered {code} (too many requests)"),
        None => "the provider refused for load".to_string(),
    };
    format!("{said}: gate cut from {from} to {to}; it grows back one slot at a time")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_refusal_halves_the_gate_once_per_cooldown() {
        assert_eq!(after_refusal(24, None), Some(12));
        assert_eq!(after_refusal(12, Some(Duration::from_millis(300))), None, "same burst");
        assert_eq!(after_refusal(12, Some(DECREASE_COOLDOWN)), Some(6));
        assert_eq!(after_refusal(1, None), None, "never below one slot, and no cut to count");
        assert_eq!(after_refusal(3, None), Some(1));
        assert!(reason(Some(429), 24, 12).contains("429") && reason(Some(529), 8, 4).contains("overloaded"));
    }

    proptest! {
        #[test]
        fn the_cut_is_at_least_one_and_at_most_half(gate in 2i32..=70) {
            let cut = after_refusal(gate, None).unwrap();
            prop_assert!(cut >= 1 && cut <= gate / 2);
        }
    }
}
