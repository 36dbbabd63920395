//! Retry policy: outcome in, decision out. Pure: no IO, no clock, no randomness of its own
//! (the caller passes `now` and a jitter sample), so every branch is testable.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::FailureKind;

/// What went wrong in an attempt, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum ErrorClass {
    /// 429 (not a spend limit).
    RateLimited,
    /// 529 and similar "try later" answers.
    Overloaded,
    /// Any other 5xx.
    ServerError,
    /// The provider did not answer in time.
    Timeout,
    /// The connection failed or broke.
    Connection,
    /// The worker's lease expired (it crashed or stalled); set by the rescue task.
    LeaseExpired,
    /// The document cannot be processed (encrypted, no text, ...).
    InvalidInput,
    /// The provider refused permanently (400/401/403/404).
    Rejected,
    /// The provider answered, but not a whole answer: empty, or ended for a reason nobody
    /// documented. Tried once more, then the job fails (refunded: not the document's doing).
    Unfinished,
    /// The provider counted the prompt past its context. The processor splits the text and
    /// redoes it (no attempt used); one that reaches the policy could not be split.
    TooLong,
    /// The provider's account is out of quota or at its spend limit: the operator's problem,
    /// not the document's. Processing is held (and the operator alerted) and the job waits,
    /// its attempt not used, until the provider takes calls again.
    QuotaExhausted,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [ErrorClass; 11] = [
        ErrorClass::RateLimited,
        ErrorClass::Overloaded,
        ErrorClass::ServerError,
        ErrorClass::Timeout,
        ErrorClass::Connection,
        ErrorClass::LeaseExpired,
        ErrorClass::InvalidInput,
        ErrorClass::Rejected,
        ErrorClass::Unfinished,
        ErrorClass::TooLong,
        ErrorClass::QuotaExhausted,
    ];

    /// Whether another attempt may succeed (everything but bad input, refusals and a prompt
    /// that could not be split to fit).
    pub fn is_transient(self) -> bool {
        !matches!(self, ErrorClass::InvalidInput | ErrorClass::Rejected | ErrorClass::TooLong)
    }

    /// The snake_case name, as stored on attempt rows.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::ServerError => "server_error",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connection => "connection",
            ErrorClass::LeaseExpired => "lease_expired",
            ErrorClass::InvalidInput => "invalid_input",
            ErrorClass::Rejected => "rejected",
            ErrorClass::Unfinished => "unfinished",
            ErrorClass::TooLong => "too_long",
            ErrorClass::QuotaExhausted => "quota_exhausted",
        }
    }
}

/// When and how often a failed job is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// `delays[k-1]` is the wait before attempt k+1; the last entry repeats.
    pub delays: Vec<Duration>,
    /// No scheduled delay exceeds this (a provider's `Retry-After` may).
    pub max_delay: Duration,
    /// Up to this much is added at random, so retries of a burst do not arrive together.
    pub max_jitter: Duration,
    /// A provider's `Retry-After` is honoured up to this; a larger one is hostile or broken.
    pub max_retry_after: Duration,
    /// Attempts in all for an unfinished answer (empty, or an unknown stop reason): one more
    /// try, then the job fails in words rather than spending every attempt on a broken answer.
    pub unfinished_attempts: u32,
    /// How long processing is held after the provider says its quota or spend limit is
    /// reached, before one call tries again (each refusal holds it again).
    pub quota_hold: Duration,
    /// A job that would still be retrying this long after it was accepted fails as
    /// `retries_exhausted` (and is refunded) instead of holding the user's in-flight slot.
    pub total_budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            delays: vec![Duration::from_secs(30), Duration::from_secs(60), Duration::from_secs(120)],
            max_delay: Duration::from_secs(120),
            max_jitter: Duration::from_secs(2),
            max_retry_after: MAX_RETRY_AFTER,
            unfinished_attempts: 2,
            quota_hold: QUOTA_HOLD,
            total_budget: Duration::from_secs(6 * 3600),
        }
    }
}

/// One failed attempt, as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    /// Attempts made so far, this one included (1-based).
    pub attempt: u32,
    pub class: ErrorClass,
    /// The provider's `Retry-After`, already parsed.
    pub retry_after: Option<Duration>,
    /// False while an operator has paused processing (the kill switch).
    pub processing_enabled: bool,
    /// Since the job was accepted.
    pub age: Duration,
}

/// What the policy decided after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Back to `retrying`, due at `at`.
    Retry { at: DateTime<Utc>, delay: Duration },
    /// Back to `queued` without using the attempt (processing is paused).
    Requeue,
    /// Terminal.
    Fail(FailureKind),
}

impl RetryPolicy {
    /// The scheduled wait before attempt `attempt + 1`, before floors and jitter.
    pub fn scheduled_delay(&self, attempt: u32) -> Duration {
        let index = (attempt.max(1) - 1) as usize;
        let delay = self.delays.get(index).or(self.delays.last()).copied().unwrap_or_default();
        delay.min(self.max_delay)
    }

    /// Decide what happens after a failed attempt. `jitter` is a sample in [0, 1).
    pub fn decide(&self, failure: &Failure, now: DateTime<Utc>, jitter: f64) -> Decision {
        if !failure.class.is_transient() {
            return Decision::Fail(match failure.class {
                ErrorClass::InvalidInput | ErrorClass::TooLong => FailureKind::InvalidInput,
                _ => FailureKind::ProviderRejected,
            });
        }
        // A provider out of quota fails nobody: the job waits, its attempt unused, while
        // processing is held.
        if !failure.processing_enabled || failure.class == ErrorClass::QuotaExhausted {
            return Decision::Requeue;
        }
        let most = match failure.class {
            ErrorClass::Unfinished => self.unfinished_attempts.clamp(1, self.max_attempts.max(1)),
            _ => self.max_attempts,
        };
        if failure.attempt >= most {
            return Decision::Fail(match failure.class {
                ErrorClass::LeaseExpired => FailureKind::TimedOut,
                _ => FailureKind::RetriesExhausted,
            });
        }
        // Every term is bounded, so nothing here can overflow whatever a provider sends.
        let floor = failure.retry_after.unwrap_or_default().min(self.max_retry_after);
        let jitter = self.max_jitter.mul_f64(if jitter.is_finite() { jitter.clamp(0.0, 1.0) } else { 0.0 });
        let delay = self.scheduled_delay(failure.attempt).max(floor) + jitter;
        if failure.age.saturating_add(delay) > self.total_budget {
            return Decision::Fail(FailureKind::RetriesExhausted);
        }
        let at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero());
        Decision::Retry { at, delay }
    }
}

/// How long processing is held after a quota or spend-limit refusal before a call tries again.
pub const QUOTA_HOLD: Duration = Duration::from_secs(60);

/// The longest `Retry-After` honoured (an hour): more is a hostile or broken answer.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Parse a `Retry-After` value: delta-seconds or an HTTP-date, capped at [`MAX_RETRY_AFTER`].
/// A date in the past counts as zero; anything else (negative, fractional, garbage, longer
/// than 40 characters) is ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.len() > 40 {
        return None;
    }
    let wait = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits past u64 are still "a very long time".
        Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX))
    } else {
        let date = httpdate::parse_http_date(value).ok()?;
        date.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn failure(attempt: u32, class: ErrorClass) -> Failure {
        Failure { attempt, class, retry_after: None, processing_enabled: true, age: Duration::ZERO }
    }

    fn no_jitter() -> RetryPolicy {
        RetryPolicy { max_jitter: Duration::ZERO, ..RetryPolicy::default() }
    }

    fn delay_of(d: Decision) -> Duration {
        match d {
            Decision::Retry { delay, .. } => delay,
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn default_schedule_is_30_then_60_and_three_attempts() {
        let p = no_jitter();
        let now = Utc::now();
        assert_eq!(delay_of(p.decide(&failure(1, ErrorClass::RateLimited), now, 0.0)), Duration::from_secs(30));
        assert_eq!(delay_of(p.decide(&failure(2, ErrorClass::Overloaded), now, 0.0)), Duration::from_secs(60));
        assert_eq!(
            p.decide(&failure(3, ErrorClass::ServerError), now, 0.0),
            Decision::Fail(FailureKind::RetriesExhausted)
        );
    }

    #[test]
    fn retry_at_is_now_plus_delay() {
        let now = Utc::now();
        match no_jitter().decide(&failure(1, ErrorClass::Timeout), now, 0.0) {
            Decision::Retry { at, .. } => assert_eq!(at - now, chrono::Duration::seconds(30)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn schedule_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            delays: vec![Duration::from_secs(30), Duration::from_secs(600)],
            max_delay: Duration::from_secs(120),
            max_jitter: Duration::ZERO,
            ..RetryPolicy::default()
        };
        assert_eq!(p.scheduled_delay(2), Duration::from_secs(120));
        assert_eq!(p.scheduled_delay(9), Duration::from_secs(120));
    }

    #[test]
    fn retry_after_is_a_floor_not_a_cap() {
        let p = no_jitter();
        let now = Utc::now();
        let mut f = failure(1, ErrorClass::RateLimited);
        f.retry_after = Some(Duration::from_secs(90));
        assert_eq!(delay_of(p.decide(&f, now, 0.0)), Duration::from_secs(90));
        f.retry_after = Some(Duration::from_secs(5));
        assert_eq!(delay_of(p.decide(&f, now, 0.0)), Duration::from_secs(30));
    }

    #[test]
    fn permanent_errors_fail_at_once() {
        let p = no_jitter();
        let now = Utc::now();
        assert_eq!(
            p.decide(&failure(1, ErrorClass::InvalidInput), now, 0.0),
            Decision::Fail(FailureKind::InvalidInput)
        );
        assert_eq!(
            p.decide(&failure(1, ErrorClass::Rejected), now, 0.0),
            Decision::Fail(FailureKind::ProviderRejected)
        );
    }

    #[test]
    fn paused_transient_failure_requeues_without_using_the_attempt() {
        let mut f = failure(3, ErrorClass::RateLimited);
        f.processing_enabled = false;
        assert_eq!(no_jitter().decide(&f, Utc::now(), 0.0), Decision::Requeue);
        // A permanent error is permanent whether or not processing is paused.
        f.class = ErrorClass::InvalidInput;
        assert_eq!(no_jitter().decide(&f, Utc::now(), 0.0), Decision::Fail(FailureKind::InvalidInput));
    }

    #[test]
    fn an_unfinished_answer_is_tried_once_more_and_a_spent_quota_fails_nobody() {
        let p = no_jitter();
        let now = Utc::now();
        assert!(matches!(p.decide(&failure(1, ErrorClass::Unfinished), now, 0.0), Decision::Retry { .. }));
        assert_eq!(
            p.decide(&failure(2, ErrorClass::Unfinished), now, 0.0),
            Decision::Fail(FailureKind::RetriesExhausted),
            "refunded: the provider's doing"
        );
        for attempt in [1, 3, 9] {
            assert_eq!(p.decide(&failure(attempt, ErrorClass::QuotaExhausted), now, 0.0), Decision::Requeue);
        }
        assert_eq!(p.decide(&failure(1, ErrorClass::TooLong), now, 0.0), Decision::Fail(FailureKind::InvalidInput));
    }

    #[test]
    fn expired_lease_on_the_last_attempt_is_timed_out() {
        assert_eq!(
            no_jitter().decide(&failure(3, ErrorClass::LeaseExpired), Utc::now(), 0.0),
            Decision::Fail(FailureKind::TimedOut)
        );
    }

    #[test]
    fn retry_after_parses_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("17", now), Some(Duration::from_secs(17)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(45));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(45)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(45));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        for garbage in ["", "soon", "-5", "1.5", "Tue, 99 Foo 2020"] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
        // Hostile values are capped, not obeyed (and never overflow).
        assert_eq!(parse_retry_after("18446744073709551615", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("99999999999999999999999", now), Some(MAX_RETRY_AFTER));
        let far = httpdate::fmt_http_date(now + Duration::from_secs(10 * 365 * 86_400));
        assert_eq!(parse_retry_after(&far, now), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn a_job_past_its_retry_budget_fails_and_is_not_parked() {
        let p = RetryPolicy { max_attempts: 50, ..no_jitter() };
        let mut f = failure(2, ErrorClass::RateLimited);
        f.age = p.total_budget - Duration::from_secs(10);
        assert_eq!(p.decide(&f, Utc::now(), 0.0), Decision::Fail(FailureKind::RetriesExhausted));
        f.age = p.total_budget - Duration::from_secs(3600);
        assert!(matches!(p.decide(&f, Utc::now(), 0.0), Decision::Retry { .. }));
    }

    fn any_class() -> impl Strategy<Value = ErrorClass> {
        proptest::sample::select(ErrorClass::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn delays_respect_floor_cap_and_jitter(
            attempt in 1u32..3,
            class in any_class(),
            retry_after in proptest::option::of(0u64..1000),
            jitter in 0.0f64..1.0,
        ) {
            let p = RetryPolicy::default();
            let f = Failure {
                attempt,
                class,
                retry_after: retry_after.map(Duration::from_secs),
                processing_enabled: true,
                age: Duration::ZERO,
            };
            match p.decide(&f, Utc::now(), jitter) {
                Decision::Retry { delay, .. } => {
                    prop_assert!(class.is_transient());
                    let base = p.scheduled_delay(attempt).max(Duration::from_secs(retry_after.unwrap_or(0)));
                    prop_assert!(delay >= base);
                    prop_assert!(delay <= base + p.max_jitter);
                    prop_assert!(base >= Duration::from_secs(retry_after.unwrap_or(0)));
                }
                Decision::Fail(_) => prop_assert!(
                    !class.is_transient() || (class == ErrorClass::Unfinished && attempt >= p.unfinished_attempts)
                ),
                Decision::Requeue => prop_assert_eq!(class, ErrorClass::QuotaExhausted, "not paused"),
            }
        }

        #[test]
        fn never_more_than_max_attempts(max in 1u32..6, attempt in 1u32..10, class in any_class()) {
            let p = RetryPolicy { max_attempts: max, ..RetryPolicy::default() };
            let f = Failure { attempt, class, retry_after: None, processing_enabled: true, age: Duration::ZERO };
            if attempt >= max && class != ErrorClass::QuotaExhausted {
                prop_assert!(matches!(p.decide(&f, Utc::now(), 0.5), Decision::Fail(_)));
            }
        }

        #[test]
        fn retry_after_is_capped_over_the_whole_u64_range(secs in any::<u64>(), attempt in 1u32..3, age in any::<u64>()) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let wait = parse_retry_after(&secs.to_string(), now).expect("digits parse");
            prop_assert_eq!(wait, Duration::from_secs(secs).min(MAX_RETRY_AFTER));
            let p = RetryPolicy::default();
            let f = Failure {
                attempt,
                class: ErrorClass::RateLimited,
                retry_after: Some(wait),
                processing_enabled: true,
                age: Duration::from_secs(age),
            };
            let start = Utc::now();
            match p.decide(&f, start, 0.99) {
                Decision::Retry { at, delay } => {
                    prop_assert!(delay <= MAX_RETRY_AFTER + p.max_jitter);
                    prop_assert!(delay >= wait);
                    prop_assert_eq!((at - start).to_std().unwrap(), delay);
                    prop_assert!(Duration::from_secs(age) + delay <= p.total_budget);
                }
                Decision::Fail(kind) => {
                    // Only because a retry would overrun the job's budget.
                    prop_assert_eq!(kind, FailureKind::RetriesExhausted);
                    let soonest = p.scheduled_delay(attempt).max(wait);
                    prop_assert!(Duration::from_secs(age).saturating_add(soonest + p.max_jitter) > p.total_budget);
                }
                Decision::Requeue => prop_assert!(false, "not paused"),
            }
        }

        #[test]
        fn any_retry_after_text_parses_to_at_most_the_cap(s in ".{0,60}") {
            let parsed = parse_retry_after(&s, SystemTime::now());
            prop_assert!(parsed.is_none_or(|d| d <= MAX_RETRY_AFTER));
        }
    }
}
