//! Pure: which deployment a call goes to, and how long a failing one rests. A call goes to the
//! first deployment, in the file's order, that is not resting and has room; a deployment that
//! fails `failures_to_rest` calls in a row (5xx, 529, timeouts, broken connections) rests for
//! a time that doubles while it keeps failing, up to `longest_rest`; one success ends it. (As
//! LiteLLM's cooldowns, but shared by every process through Postgres, and growing.)

use std::time::Duration;

use crate::queue::policy::retry::ErrorClass;

/// How failures put a deployment to rest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestPolicy {
    /// Failures in a row that put a deployment to rest.
    pub failures_to_rest: u32,
    /// The first rest; each further failure in a row doubles it.
    pub first_rest: Duration,
    pub longest_rest: Duration,
}

impl Default for RestPolicy {
    fn default() -> Self {
        RestPolicy {
            failures_to_rest: DEFAULT_FAILURES_TO_REST,
            first_rest: DEFAULT_FIRST_REST,
            longest_rest: DEFAULT_LONGEST_REST,
        }
    }
}

pub const DEFAULT_FAILURES_TO_REST: u32 = 3;
pub const DEFAULT_FIRST_REST: Duration = Duration::from_secs(10);
pub const DEFAULT_LONGEST_REST: Duration = Duration::from_secs(300);

/// How long a deployment rests after `failures_in_a_row` failures (none below the threshold).
pub fn rest_after(policy: &RestPolicy, failures_in_a_row: u32) -> Option<Duration> {
    let threshold = policy.failures_to_rest.max(1);
    let past = failures_in_a_row.checked_sub(threshold)?;
    let doubled = policy.first_rest.as_secs_f64() * 2f64.powi(past.min(30) as i32);
    Some(Duration::from_secs_f64(doubled.min(policy.longest_rest.as_secs_f64()).max(0.0)))
}

/// Whether a failure is the deployment's (it counts toward its rest, and the call is tried on
/// the next one), and whether the call moves on without counting (a rate limit: its budget is
/// the gate's business, but another deployment may have room now).
pub fn on_failure(class: ErrorClass) -> FailureRoute {
    match class {
        ErrorClass::ServerError | ErrorClass::Overloaded | ErrorClass::Timeout | ErrorClass::Connection => {
            FailureRoute::CountAndMoveOn
        }
        ErrorClass::RateLimited => FailureRoute::MoveOn,
        // The document's, the request's or the account's: another deployment of the same
        // model answers alike (a spend limit holds processing, as with one deployment).
        _ => FailureRoute::Stop,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureRoute {
    CountAndMoveOn,
    MoveOn,
    Stop,
}

/// A deployment as the router sees it before a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub resting: bool,
    pub has_room: bool,
}

/// The order to try deployments in for one call: those neither resting nor out of room, in the
/// file's order. When every one rests, none is tried (the call waits for its retry); when
/// every awake one is out of room, the first awake one is tried anyway (its provider's bucket,
/// not ours, has the last word, and the claim's budget already paced the call).
pub fn order(standings: &[Standing]) -> Vec<usize> {
    let awake: Vec<usize> = (0..standings.len()).filter(|&i| !standings[i].resting).collect();
    let with_room: Vec<usize> = awake.iter().copied().filter(|&i| standings[i].has_room).collect();
    if with_room.is_empty() {
        awake.into_iter().take(1).collect()
    } else {
        // Those with room first, then the awake ones without, as a last resort.
        with_room.iter().copied().chain(awake.into_iter().filter(|i| !with_room.contains(i))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RestPolicy {
        RestPolicy::default()
    }

    #[test]
    fn three_failures_in_a_row_rest_a_deployment_and_further_ones_double_its_rest() {
        assert_eq!(rest_after(&policy(), 0), None);
        assert_eq!(rest_after(&policy(), 2), None);
        assert_eq!(rest_after(&policy(), 3), Some(Duration::from_secs(10)));
        assert_eq!(rest_after(&policy(), 4), Some(Duration::from_secs(20)));
        assert_eq!(rest_after(&policy(), 6), Some(Duration::from_secs(80)));
        assert_eq!(rest_after(&policy(), 9), Some(Duration::from_secs(300)), "capped");
        assert_eq!(rest_after(&policy(), u32::MAX), Some(Duration::from_secs(300)));
    }

    #[test]
    fn the_providers_failures_move_a_call_on_and_the_documents_stop_it() {
        assert_eq!(on_failure(ErrorClass::ServerError), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::Overloaded), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::Timeout), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::Connection), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::RateLimited), FailureRoute::MoveOn);
        for class in [ErrorClass::InvalidInput, ErrorClass::Rejected, ErrorClass::TooLong, ErrorClass::QuotaExhausted] {
            assert_eq!(on_failure(class), FailureRoute::Stop, "{class:?}");
        }
    }

    #[test]
    fn a_call_goes_to_the_first_awake_deployment_with_room() {
        let s = |resting, has_room| Standing { resting, has_room };
        assert_eq!(order(&[s(false, true), s(false, true)]), [0, 1]);
        assert_eq!(order(&[s(true, true), s(false, true)]), [1]);
        assert_eq!(order(&[s(false, false), s(false, true)]), [1, 0]);
        assert_eq!(order(&[s(false, false), s(false, false)]), [0], "the first awake, as a last resort");
        assert_eq!(order(&[s(true, true), s(true, true)]), Vec::<usize>::new(), "all resting: none");
    }

    proptest! {
        #[test]
        fn the_order_tries_each_awake_deployment_once_and_never_a_resting_one(
            standings in proptest::collection::vec((any::<bool>(), any::<bool>()), 0..8)
        ) {
            let standings: Vec<Standing> = standings.into_iter().map(|(resting, has_room)| Standing { resting, has_room }).collect();
            let tried = order(&standings);
            let mut seen = tried.clone();
            seen.sort();
            seen.dedup();
            prop_assert_eq!(seen.len(), tried.len());
            prop_assert!(tried.iter().all(|&i| !standings[i].resting));
            let first_with_room = (0..standings.len()).find(|&i| !standings[i].resting && standings[i].has_room);
            if let Some(first) = first_with_room {
                prop_assert_eq!(tried[0], first);
            }
            prop_assert_eq!(tried.is_empty(), standings.iter().all(|s| s.resting));
        }

        #[test]
        fn a_rest_never_shrinks_as_failures_go_on(failures in 0u32..64, policy_secs in 1u64..100) {
            let policy = RestPolicy { failures_to_rest: 3, first_rest: Duration::from_secs(policy_secs), longest_rest: Duration::from_secs(600) };
            let now = rest_after(&policy, failures).unwrap_or_default();
            let next = rest_after(&policy, failures + 1).unwrap_or_default();
            prop_assert!(next >= now);
            prop_assert!(next <= Duration::from_secs(600));
        }
    }
}
