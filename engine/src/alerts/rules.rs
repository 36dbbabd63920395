//! Alert rules (pure): observations and thresholds in, which rules fire out, and the
//! transitions from what fired before (seeds 001 and 004: alert on deadlines, on a queue that
//! stopped draining and on the dead-letter queue, not on message counts).

use serde::{Deserialize, Serialize};

/// The rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The oldest waiting job has waited past the deadline (paused time not counted).
    OldestWait,
    /// There is a backlog and nothing has finished for a while (while processing is on).
    NotDraining,
    /// Too many jobs in the dead-letter queue.
    DlqDepth,
    /// Too many jobs entered the dead-letter queue in the last hour.
    DlqGrowth,
    /// Too large a share of the last minutes' provider calls failed.
    ProviderFailures,
    /// The latest reconciliation found discrepancies.
    ReconciliationDrift,
    /// The document store refused a write for want of room, or has little room left.
    StoreFull,
    /// The provider said its quota or spend limit is reached: processing is held (nobody's
    /// document fails) until it takes calls again; the operator has to raise the limit.
    ProviderHeld,
    /// Documents with a deadline are still waiting within the lead of when they must start to
    /// be done in time: the operator can still act (raise the gate, move work, tell the user).
    DeadlineAtRisk,
    /// The providers file's first deployment has failed without answering for longer than
    /// allowed: its calls go to the others, which may be dearer or slower.
    PrimaryResting,
}

impl Rule {
    pub const ALL: [Rule; 10] = [
        Rule::OldestWait,
        Rule::NotDraining,
        Rule::DlqDepth,
        Rule::DlqGrowth,
        Rule::ProviderFailures,
        Rule::ReconciliationDrift,
        Rule::StoreFull,
        Rule::ProviderHeld,
        Rule::DeadlineAtRisk,
        Rule::PrimaryResting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::OldestWait => "oldest_wait",
            Rule::NotDraining => "not_draining",
            Rule::DlqDepth => "dlq_depth",
            Rule::DlqGrowth => "dlq_growth",
            Rule::ProviderFailures => "provider_failures",
            Rule::ReconciliationDrift => "reconciliation_drift",
            Rule::StoreFull => "store_full",
            Rule::ProviderHeld => "provider_held",
            Rule::DeadlineAtRisk => "deadline_at_risk",
            Rule::PrimaryResting => "primary_resting",
        }
    }

    pub fn parse(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// When each rule fires. The defaults warn well before users are refused (the intake bound
/// answers 503 at a 30-minute wait).
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// Seconds the oldest waiting job may wait.
    pub oldest_wait_secs: f64,
    /// Minutes a backlog may go without a job finishing.
    pub not_draining_mins: f64,
    pub dlq_depth: i64,
    /// Jobs entering the DLQ in the last hour.
    pub dlq_growth_per_hour: i64,
    /// Share of provider calls failing over the window (0 to 1)...
    pub provider_failure_ratio: f64,
    /// ...counted only once the window holds this many calls (two failures of three is noise).
    pub provider_min_calls: i64,
    /// Discrepancies the latest reconciliation may find (0: any fires).
    pub drift: i64,
    /// The least free space the document store may have, in bytes (where it can be measured).
    pub store_min_free_bytes: i64,
    /// Seconds the primary deployment may fail without answering before the alert fires.
    pub primary_resting_secs: f64,
    /// The shortest a firing lasts (against flapping at a threshold).
    pub min_firing_secs: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            oldest_wait_secs: 15.0 * 60.0,
            not_draining_mins: 10.0,
            dlq_depth: 100,
            dlq_growth_per_hour: 20,
            provider_failure_ratio: 0.5,
            provider_min_calls: 20,
            drift: 0,
            store_min_free_bytes: 1 << 30,
            primary_resting_secs: 300.0,
            min_firing_secs: 300.0,
        }
    }
}

/// What the rules look at, read from the database in one go.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    pub backlog: i64,
    /// The oldest due job's wait, not counting paused time.
    pub oldest_wait_secs: Option<f64>,
    pub processing_enabled: bool,
    /// Since something last happened that shows draining: a job finished, processing resumed,
    /// or the oldest waiting job became due (a fresh backlog is not yet stalled).
    pub stalled_secs: Option<f64>,
    pub dlq_depth: i64,
    pub dlq_added_last_hour: i64,
    /// Provider calls finished in the window, and how many of them failed.
    pub provider_calls: i64,
    pub provider_failures: i64,
    /// Discrepancies in the latest reconciliation report, if there is one.
    pub drift: Option<i64>,
    /// The document store's free bytes (a local folder's; none for S3 or not measured lately),
    /// and whether a write found it full since it last had room.
    pub store_free_bytes: Option<i64>,
    pub store_full: bool,
    /// Processing is held because the provider's quota or spend limit is reached.
    pub provider_held: bool,
    /// Waiting documents whose deadline is at risk, and the seconds until the nearest one's
    /// latest start (negative: it should have started already).
    pub deadlines_at_risk: i64,
    pub nearest_latest_start_secs: Option<f64>,
    /// The providers file's first deployment: its name, and for how long it has failed without
    /// answering (none: it answers, or there is no file).
    pub primary: Option<(String, Option<f64>)>,
}

/// One rule's verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub rule: Rule,
    pub firing: bool,
    pub value: f64,
    pub threshold: f64,
    /// In words, for the admin page and the webhook.
    pub detail: String,
}

/// Every rule's verdict on `obs`.
pub fn evaluate(obs: &Observation, t: &Thresholds) -> Vec<Reading> {
    let reading =
        |rule, firing, value: f64, threshold: f64, detail: String| Reading { rule, firing, value, threshold, detail };
    let wait = obs.oldest_wait_secs.unwrap_or(0.0);
    let stalled_mins =
        if obs.backlog > 0 && obs.processing_enabled { obs.stalled_secs.unwrap_or(0.0) / 60.0 } else { 0.0 };
    let ratio = if obs.provider_calls > 0 { obs.provider_failures as f64 / obs.provider_calls as f64 } else { 0.0 };
    let drift = obs.drift.unwrap_or(0);
    vec![
        reading(
            Rule::OldestWait,
            wait > t.oldest_wait_secs,
            wait,
            t.oldest_wait_secs,
            format!(
                "the oldest waiting job has waited {} min (deadline {} min)",
                (wait / 60.0).floor(),
                t.oldest_wait_secs / 60.0
            ),
        ),
        reading(
            Rule::NotDraining,
            stalled_mins >= t.not_draining_mins,
            stalled_mins,
            t.not_draining_mins,
            format!("{} jobs waiting and none finished for {} min", obs.backlog, stalled_mins.floor()),
        ),
        reading(
            Rule::DlqDepth,
            obs.dlq_depth > t.dlq_depth,
            obs.dlq_depth as f64,
            t.dlq_depth as f64,
            format!("{} jobs in the dead-letter queue", obs.dlq_depth),
        ),
        reading(
            Rule::DlqGrowth,
            obs.dlq_added_last_hour > t.dlq_growth_per_hour,
            obs.dlq_added_last_hour as f64,
            t.dlq_growth_per_hour as f64,
            format!("{} jobs failed in the last hour", obs.dlq_added_last_hour),
        ),
        reading(
            Rule::ProviderFailures,
            obs.provider_calls >= t.provider_min_calls && ratio > t.provider_failure_ratio,
            ratio,
            t.provider_failure_ratio,
            format!("{} of {} provider calls failed in the last 15 min", obs.provider_failures, obs.provider_calls),
        ),
        reading(
            Rule::ReconciliationDrift,
            drift > t.drift,
            drift as f64,
            t.drift as f64,
            format!("the latest reconciliation found {drift} discrepancies"),
        ),
        reading(
            Rule::StoreFull,
            obs.store_full || obs.store_free_bytes.is_some_and(|free| free < t.store_min_free_bytes),
            obs.store_free_bytes.unwrap_or(0) as f64,
            t.store_min_free_bytes as f64,
            match (obs.store_full, obs.store_free_bytes) {
                (true, _) => "the document store is full: uploads are refused (507)".to_string(),
                (false, Some(free)) => format!("the document store has {} MiB free", free >> 20),
                (false, None) => "the document store's free space is not known".to_string(),
            },
        ),
        reading(
            Rule::ProviderHeld,
            obs.provider_held,
            f64::from(u8::from(obs.provider_held)),
            0.0,
            "the provider refuses calls for its quota or spend limit: processing is held and documents wait \
             (none fail); raise the limit with the provider"
                .to_string(),
        ),
        reading(
            Rule::DeadlineAtRisk,
            obs.deadlines_at_risk > 0,
            obs.deadlines_at_risk as f64,
            0.0,
            match obs.nearest_latest_start_secs {
                Some(secs) if secs >= 0.0 => format!(
                    "{} documents with a deadline are still waiting; the nearest must start within {} min to be \
                     done in time",
                    obs.deadlines_at_risk,
                    (secs / 60.0).ceil()
                ),
                Some(secs) => format!(
                    "{} documents with a deadline are still waiting; the nearest should have started {} min ago",
                    obs.deadlines_at_risk,
                    (-secs / 60.0).ceil()
                ),
                None => "no document with a deadline is at risk".to_string(),
            },
        ),
        {
            let failing = obs.primary.as_ref().and_then(|(_, secs)| *secs).unwrap_or(0.0);
            let name = obs.primary.as_ref().map_or("", |(name, _)| name.as_str());
            reading(
                Rule::PrimaryResting,
                failing > t.primary_resting_secs,
                failing,
                t.primary_resting_secs,
                if failing > 0.0 {
                    format!(
                        "the primary provider deployment {name:?} has failed without answering for {} min: its \
                         calls go to the next deployments",
                        (failing / 60.0).floor()
                    )
                } else {
                    "the primary provider deployment answers".to_string()
                },
            )
        },
    ]
}

/// What changes: rules that start firing (not firing before), and rules that stop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transitions {
    pub fired: Vec<Reading>,
    pub resolved: Vec<Rule>,
    /// Still firing: their value is refreshed.
    pub still: Vec<Reading>,
}

/// Pure: compare the verdicts with the rules firing before, each with how long it has fired
/// (seconds). A firing is held for at least `min_firing_secs`, so a value hovering at its
/// threshold makes one firing and one resolve per hold, not a pair every round.
pub fn transitions(firing_before: &[(Rule, f64)], readings: Vec<Reading>, min_firing_secs: f64) -> Transitions {
    let mut out = Transitions::default();
    for reading in readings {
        let before = firing_before.iter().find(|(rule, _)| *rule == reading.rule).map(|&(_, secs)| secs);
        match (before, reading.firing) {
            (None, true) => out.fired.push(reading),
            (Some(secs), false) if secs >= min_firing_secs => out.resolved.push(reading.rule),
            (Some(_), _) => out.still.push(reading),
            (None, false) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn quiet() -> Observation {
        Observation { processing_enabled: true, ..Observation::default() }
    }

    fn firing(obs: &Observation) -> Vec<Rule> {
        evaluate(obs, &Thresholds::default()).into_iter().filter(|r| r.firing).map(|r| r.rule).collect()
    }

    #[test]
    fn a_quiet_queue_fires_nothing() {
        assert!(firing(&quiet()).is_empty());
    }

    #[test]
    fn each_rule_fires_past_its_threshold_only() {
        let primary = |secs: Option<f64>| Some(("primary".to_string(), secs));
        let cases: [(Rule, Observation, Observation); 11] = [
            (
                Rule::OldestWait,
                Observation { backlog: 1, oldest_wait_secs: Some(900.0), ..quiet() },
                Observation { backlog: 1, oldest_wait_secs: Some(901.0), ..quiet() },
            ),
            (
                Rule::NotDraining,
                Observation { backlog: 3, stalled_secs: Some(599.0), ..quiet() },
                Observation { backlog: 3, stalled_secs: Some(600.0), ..quiet() },
            ),
            (Rule::DlqDepth, Observation { dlq_depth: 100, ..quiet() }, Observation { dlq_depth: 101, ..quiet() }),
            (
                Rule::DlqGrowth,
                Observation { dlq_added_last_hour: 20, ..quiet() },
                Observation { dlq_added_last_hour: 21, ..quiet() },
            ),
            (
                Rule::ProviderFailures,
                Observation { provider_calls: 20, provider_failures: 10, ..quiet() },
                Observation { provider_calls: 20, provider_failures: 11, ..quiet() },
            ),
            (
                Rule::ReconciliationDrift,
                Observation { drift: Some(0), ..quiet() },
                Observation { drift: Some(1), ..quiet() },
            ),
            (
                Rule::StoreFull,
                Observation { store_free_bytes: Some(1 << 30), ..quiet() },
                Observation { store_free_bytes: Some((1 << 30) - 1), ..quiet() },
            ),
            (
                Rule::StoreFull,
                Observation { store_free_bytes: None, ..quiet() },
                Observation { store_free_bytes: None, store_full: true, ..quiet() },
            ),
            (
                Rule::ProviderHeld,
                Observation { processing_enabled: false, ..quiet() },
                Observation { processing_enabled: false, provider_held: true, ..quiet() },
            ),
            (
                Rule::PrimaryResting,
                Observation { primary: primary(Some(300.0)), ..quiet() },
                Observation { primary: primary(Some(301.0)), ..quiet() },
            ),
            (
                Rule::PrimaryResting,
                Observation { primary: primary(None), ..quiet() },
                Observation { primary: primary(Some(4000.0)), ..quiet() },
            ),
        ];
        for (rule, below, above) in cases {
            assert!(!firing(&below).contains(&rule), "{rule:?} fired at its threshold");
            assert_eq!(firing(&above), vec![rule], "{rule:?} past its threshold");
        }
    }

    #[test]
    fn a_paused_queue_or_an_empty_one_is_not_stalled_and_few_calls_are_noise() {
        assert!(firing(&Observation { backlog: 3, stalled_secs: Some(3600.0), processing_enabled: false, ..quiet() })
            .is_empty());
        assert!(firing(&Observation { backlog: 0, stalled_secs: Some(3600.0), ..quiet() }).is_empty());
        assert!(firing(&Observation { provider_calls: 3, provider_failures: 3, ..quiet() }).is_empty());
    }

    #[test]
    fn a_firing_is_held_before_it_may_resolve() {
        let clear = |rule| Reading { rule, firing: false, value: 0.0, threshold: 1.0, detail: String::new() };
        let held = transitions(&[(Rule::DlqDepth, 299.0)], vec![clear(Rule::DlqDepth)], 300.0);
        assert!(held.resolved.is_empty() && held.still.len() == 1, "{held:?}");
        let resolved = transitions(&[(Rule::DlqDepth, 300.0)], vec![clear(Rule::DlqDepth)], 300.0);
        assert_eq!(resolved.resolved, vec![Rule::DlqDepth]);
    }

    proptest! {
        #[test]
        fn transitions_partition_the_rules(before in proptest::sample::subsequence(Rule::ALL.to_vec(), 0..=Rule::ALL.len()),
                                           now in proptest::sample::subsequence(Rule::ALL.to_vec(), 0..=Rule::ALL.len())) {
            let readings: Vec<Reading> = Rule::ALL.iter().map(|&rule| Reading {
                rule, firing: now.contains(&rule), value: 1.0, threshold: 0.0, detail: String::new(),
            }).collect();
            let before: Vec<(Rule, f64)> = before.iter().map(|&r| (r, 600.0)).collect();
            let t = transitions(&before, readings, 300.0);
            for rule in Rule::ALL {
                let fired = t.fired.iter().any(|r| r.rule == rule);
                let resolved = t.resolved.contains(&rule);
                let still = t.still.iter().any(|r| r.rule == rule);
                let was = before.iter().any(|(r, _)| *r == rule);
                prop_assert_eq!(fired, !was && now.contains(&rule));
                prop_assert_eq!(resolved, was && !now.contains(&rule));
                prop_assert_eq!(still, was && now.contains(&rule));
            }
        }
    }
}
