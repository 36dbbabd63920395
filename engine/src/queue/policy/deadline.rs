//! Where a job with a deadline stands (DESIGN: deadlines and lanes), for its page, the alert
//! and the vital signs.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

/// A deadline's standing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Waiting or running, with time to spare.
    OnTrack,
    /// Still waiting within `lead` of when it must start to be done in time (or past it): an
    /// operator can still act.
    AtRisk,
    /// Done in time.
    Met,
    /// Done late, ended without a result, or still not done at its deadline.
    Missed,
}

/// What a deadline's standing goes by.
#[derive(Clone, Copy, Debug)]
pub struct DeadlineFacts {
    pub due_by: DateTime<Utc>,
    /// When it must start to be done by `due_by` at its expected run time.
    pub latest_start: DateTime<Utc>,
    /// Not started yet (queued or retrying).
    pub waiting: bool,
    /// When it ended with a result, if it did.
    pub done_at: Option<DateTime<Utc>>,
    /// Ended without a result (failed or canceled).
    pub ended_without_result: bool,
}

/// Pure: the standing of `facts` at `now`, a job taken first within `lead` of its latest start.
pub fn standing(facts: DeadlineFacts, now: DateTime<Utc>, lead: TimeDelta) -> Standing {
    if let Some(done) = facts.done_at {
        return if done <= facts.due_by { Standing::Met } else { Standing::Missed };
    }
    if facts.ended_without_result || now > facts.due_by {
        return Standing::Missed;
    }
    if facts.waiting && now + lead >= facts.latest_start {
        return Standing::AtRisk;
    }
    Standing::OnTrack
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(due_in: i64, start_in: i64) -> DeadlineFacts {
        let now = at(0);
        DeadlineFacts {
            due_by: now + TimeDelta::seconds(due_in),
            latest_start: now + TimeDelta::seconds(start_in),
            waiting: true,
            done_at: None,
            ended_without_result: false,
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_waiting_job_is_at_risk_within_the_lead_of_its_latest_start_and_missed_past_its_deadline() {
        let lead = TimeDelta::seconds(300);
        assert_eq!(standing(facts(3_600, 3_000), at(0), lead), Standing::OnTrack);
        assert_eq!(standing(facts(3_600, 3_000), at(2_700), lead), Standing::AtRisk);
        assert_eq!(standing(facts(3_600, 3_000), at(3_500), lead), Standing::AtRisk);
        assert_eq!(standing(facts(3_600, 3_000), at(3_601), lead), Standing::Missed);
    }

    #[test]
    fn a_running_job_is_on_track_until_its_deadline_and_an_ended_one_met_or_missed() {
        let lead = TimeDelta::seconds(300);
        let running = DeadlineFacts { waiting: false, ..facts(600, 0) };
        assert_eq!(standing(running, at(100), lead), Standing::OnTrack);
        assert_eq!(standing(running, at(601), lead), Standing::Missed);
        let on_time = DeadlineFacts { done_at: Some(at(500)), ..running };
        assert_eq!(standing(on_time, at(10_000), lead), Standing::Met);
        let late = DeadlineFacts { done_at: Some(at(700)), ..running };
        assert_eq!(standing(late, at(10_000), lead), Standing::Missed);
        let failed = DeadlineFacts { ended_without_result: true, ..running };
        assert_eq!(standing(failed, at(100), lead), Standing::Missed);
    }
}
