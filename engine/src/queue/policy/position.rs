//! A waiting job's estimated start (pure). Its place in line, the jobs claimed before it, is
//! read from the database: due jobs are claimed in tag order (see [`super::fair_tags`]), so the
//! jobs ahead are the due jobs with lower tags. It assumes the jobs running now keep running
//! while those ahead are claimed, the usual case with slow providers and a full gate.

use std::time::Duration;

/// When a job with `ahead` jobs before it should start: at once if a free slot of the gate is
/// left for it, else after the jobs that must finish first, at the recent rate of slots freed.
/// `None` when nothing has finished lately, so there is no rate to go by.
pub fn estimated_start(ahead: u64, free_slots: u64, finishing_per_sec: f64) -> Option<Duration> {
    if ahead < free_slots {
        return Some(Duration::ZERO);
    }
    if !finishing_per_sec.is_finite() || finishing_per_sec <= 0.0 {
        return None;
    }
    let must_finish = (ahead - free_slots + 1) as f64;
    Some(Duration::from_secs_f64(must_finish / finishing_per_sec))
}

/// How long a job done in parts still needs: its remaining parts at the pace of those done
/// so far (`elapsed` since its first part started), plus one more step to combine them when
/// `combines` (a summary of the summaries). `None` before a part is done (no pace yet).
pub fn parts_left(done: u32, total: u32, elapsed: Duration, combines: bool) -> Option<Duration> {
    if done == 0 || total == 0 {
        return None;
    }
    let steps_left = total.saturating_sub(done) + u32::from(combines);
    Some(elapsed.mul_f64(f64::from(steps_left) / f64::from(done)))
}

/// What recent successful attempts took: the median attempt's seconds and input tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredPace {
    pub secs: f64,
    pub input_tokens: f64,
}

/// How long a job should run once started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RunTime {
    /// At the pace of recent attempts.
    Measured(Duration),
    /// Nothing measured lately: the most its attempt may take (its deadline), an upper bound.
    AtMost(Duration),
}

/// How long a job whose prompt carries `tokens` should run: at the median recent attempt's
/// seconds per token, and never less than that attempt (a short call still waits for its
/// answer). With nothing measured, the attempt deadline for its size, `deadline_secs`.
pub fn run_time(tokens: u64, pace: Option<MeasuredPace>, deadline_secs: f64) -> RunTime {
    match pace.filter(|p| p.secs.is_finite() && p.secs > 0.0 && p.input_tokens.is_finite() && p.input_tokens >= 1.0) {
        Some(pace) => {
            let secs = (tokens as f64 * pace.secs / pace.input_tokens).max(pace.secs);
            RunTime::Measured(Duration::from_secs_f64(secs.min(MAX_ESTIMATE_SECS)))
        }
        None => RunTime::AtMost(Duration::from_secs_f64(deadline_secs.clamp(0.0, MAX_ESTIMATE_SECS))),
    }
}

/// No estimate says more than a week (a figure past it says only "a long time").
const MAX_ESTIMATE_SECS: f64 = 7.0 * 24.0 * 3600.0;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_run_time_follows_the_measured_pace_and_falls_back_to_the_deadline() {
        let pace = MeasuredPace { secs: 20.0, input_tokens: 10_000.0 };
        assert_eq!(run_time(50_000, Some(pace), 600.0), RunTime::Measured(Duration::from_secs(100)));
        assert_eq!(
            run_time(100, Some(pace), 600.0),
            RunTime::Measured(Duration::from_secs(20)),
            "never under the median attempt"
        );
        assert_eq!(run_time(100, None, 600.0), RunTime::AtMost(Duration::from_secs(600)));
        let nothing = MeasuredPace { secs: 0.0, input_tokens: 0.0 };
        assert_eq!(
            run_time(100, Some(nothing), 90.0),
            RunTime::AtMost(Duration::from_secs(90)),
            "a pace of nothing is no pace"
        );
        assert_eq!(run_time(u64::MAX, Some(pace), 600.0), RunTime::Measured(Duration::from_secs(7 * 24 * 3600)));
    }

    #[test]
    fn the_parts_left_take_the_pace_of_the_parts_done() {
        assert_eq!(parts_left(0, 7, Duration::from_secs(30), true), None, "no pace yet");
        assert_eq!(parts_left(2, 7, Duration::from_secs(60), false), Some(Duration::from_secs(150)));
        assert_eq!(parts_left(2, 7, Duration::from_secs(60), true), Some(Duration::from_secs(180)));
        assert_eq!(parts_left(7, 7, Duration::from_secs(60), false), Some(Duration::ZERO));
    }

    #[test]
    fn start_estimates() {
        assert_eq!(estimated_start(2, 3, 0.0), Some(Duration::ZERO));
        // 5 ahead, 1 free slot: 5 must finish first, at 0.5 per second.
        assert_eq!(estimated_start(5, 1, 0.5), Some(Duration::from_secs(10)));
        assert_eq!(estimated_start(5, 0, 0.0), None);
        assert_eq!(estimated_start(5, 0, f64::NAN), None);
    }

    proptest! {
        #[test]
        fn a_later_job_never_starts_sooner(
            ahead in 0u64..10_000, more in 0u64..100, free in 0u64..70, rate in 0.01f64..100.0,
        ) {
            let first = estimated_start(ahead, free, rate).unwrap();
            let later = estimated_start(ahead + more, free, rate).unwrap();
            prop_assert!(later >= first);
        }
    }
}
