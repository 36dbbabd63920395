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
/// the next one: an outage, and what is wrong with its key, model, address or account), whether
/// the call moves on without counting (a rate limit, an unfinished answer: another deployment
/// may do now), or whether it is the document's and stops (a refusal of its content, a prompt
/// past the context: another deployment of the same model answers alike).
pub fn on_failure(class: ErrorClass) -> FailureRoute {
    match class {
        ErrorClass::ServerError
        | ErrorClass::Overloaded
        | ErrorClass::Timeout
        | ErrorClass::Connection
        | ErrorClass::Rejected
        | ErrorClass::QuotaExhausted => FailureRoute::CountAndMoveOn,
        ErrorClass::RateLimited | ErrorClass::Unfinished => FailureRoute::MoveOn,
        ErrorClass::InvalidInput | ErrorClass::TooLong | ErrorClass::LeaseExpired => FailureRoute::Stop,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureRoute {
    CountAndMoveOn,
    MoveOn,
    Stop,
}

/// A deployment as the router sees it before a call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Standing {
    /// Seconds of rest left (0: awake).
    pub rest_left: f64,
    pub has_room: bool,
}

impl Standing {
    pub fn resting(&self) -> bool {
        self.rest_left > 0.0
    }
}

/// The order to try deployments in for one call: those neither resting nor out of room, in the
/// file's order, then the awake ones out of room (their provider's bucket, not ours, has the
/// last word, and the claim's budget already paced the call). When every one rests, the one
/// whose rest ends first is tried: a document never waits on a guess, only on a real answer.
pub fn order(standings: &[Standing]) -> Vec<usize> {
    let awake: Vec<usize> = (0..standings.len()).filter(|&i| !standings[i].resting()).collect();
    let with_room: Vec<usize> = awake.iter().copied().filter(|&i| standings[i].has_room).collect();
    if awake.is_empty() {
        let soonest = (0..standings.len()).min_by(|&a, &b| standings[a].rest_left.total_cmp(&standings[b].rest_left));
        soonest.into_iter().collect()
    } else if with_room.is_empty() {
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
        // A wrong key, model or address, or a spent account, is the deployment's.
        assert_eq!(on_failure(ErrorClass::Rejected), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::QuotaExhausted), FailureRoute::CountAndMoveOn);
        assert_eq!(on_failure(ErrorClass::Unfinished), FailureRoute::MoveOn);
        for class in [ErrorClass::InvalidInput, ErrorClass::TooLong] {
            assert_eq!(on_failure(class), FailureRoute::Stop, "{class:?}");
        }
    }

    #[test]
    fn a_call_goes_to_the_first_awake_deployment_with_room() {
        let s = |rest_left, has_room| Standing { rest_left, has_room };
        assert_eq!(order(&[s(0.0, true), s(0.0, true)]), [0, 1]);
        assert_eq!(order(&[s(5.0, true), s(0.0, true)]), [1]);
        assert_eq!(order(&[s(0.0, false), s(0.0, true)]), [1, 0]);
        assert_eq!(order(&[s(0.0, false), s(0.0, false)]), [0], "the first awake, as a last resort");
        assert_eq!(order(&[s(9.0, true), s(2.0, true)]), [1], "all resting: the one awake soonest");
    }

    proptest! {
        #[test]
        fn the_order_tries_each_awake_deployment_once_and_never_a_resting_one(
            standings in proptest::collection::vec((prop_oneof![Just(0.0), 0.1f64..100.0], any::<bool>()), 0..8)
        ) {
            let standings: Vec<Standing> = standings.into_iter().map(|(rest_left, has_room)| Standing { rest_left, has_room }).collect();
            let tried = order(&standings);
            let mut seen = tried.clone();
            seen.sort();
            seen.dedup();
            prop_assert_eq!(seen.len(), tried.len());
            prop_assert_eq!(tried.is_empty(), standings.is_empty(), "a call always has somewhere to go");
            let any_awake = standings.iter().any(|s| !s.resting());
            if any_awake {
                prop_assert!(tried.iter().all(|&i| !standings[i].resting()), "a resting one waits while another is awake");
            } else if let Some(&only) = tried.first() {
                prop_assert_eq!(tried.len(), 1);
                prop_assert!(standings.iter().all(|s| s.rest_left >= standings[only].rest_left));
            }
            let first_with_room = (0..standings.len()).find(|&i| !standings[i].resting() && standings[i].has_room);
            if let Some(first) = first_with_room {
                prop_assert_eq!(tried[0], first);
            }
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
