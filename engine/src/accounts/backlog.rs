//! Admission's reading of the backlog, shared by one process's uploads. The intake bound
//! (`max_backlog`) needs the waiting jobs counted up to it: a pass over them, which every
//! upload made twice (before its body is read, and at admission), so its cost grew with the
//! very backlog a busy queue has. A reading under the bound now stands for up to
//! [`BACKLOG_READING_AGE`], with this process's own admissions since added to it; a reading at
//! or over the bound is never trusted, so a refusal always comes from a fresh count and space
//! a drain frees is seen at once. What another process admits meanwhile is seen when the
//! reading is next taken: the bound can be passed by what the other web processes admit in
//! one reading's age (it was already passed by uploads racing past one count).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a count of the backlog under the bound stands for it.
pub const BACKLOG_READING_AGE: Duration = Duration::from_millis(500);

/// See the module. One per process (it lives in its [`AdmissionConfig`](super::admission::AdmissionConfig)).
#[derive(Debug, Default)]
pub struct BacklogGauge {
    reading: Mutex<Option<Reading>>,
}

#[derive(Clone, Copy, Debug)]
struct Reading {
    taken: Instant,
    /// Counted then, plus this process's admissions since.
    backlog: i64,
}

impl BacklogGauge {
    /// The backlog, if a reading taken by `now` can stand for it; `None`: count it.
    pub fn estimate(&self, now: Instant, bound: i64, max_age: Duration) -> Option<i64> {
        let reading = (*self.reading.lock().unwrap_or_else(|e| e.into_inner()))?;
        let age = now.saturating_duration_since(reading.taken);
        reading_stands(reading.backlog, age, bound, max_age).then_some(reading.backlog)
    }

    /// A count begun at `taken`; one begun before the reading held is dropped (counts run side
    /// by side, and the reading has this process's admissions since its own count added).
    pub fn record(&self, taken: Instant, backlog: i64) {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        if reading.is_none_or(|held| held.taken <= taken) {
            *reading = Some(Reading { taken, backlog });
        }
    }

    /// This process admitted a job: one more waiting.
    pub fn admitted(&self) {
        if let Some(reading) = self.reading.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            reading.backlog = reading.backlog.saturating_add(1);
        }
    }
}

/// Pure: a reading stands while it is younger than `max_age` and under `bound`.
pub fn reading_stands(backlog: i64, age: Duration, bound: i64, max_age: Duration) -> bool {
    age < max_age && backlog < bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_stands_only_while_young_and_under_the_bound() {
        let age = Duration::from_millis(100);
        assert!(reading_stands(9, age, 10, BACKLOG_READING_AGE));
        assert!(!reading_stands(10, age, 10, BACKLOG_READING_AGE), "at the bound: counted again");
        assert!(!reading_stands(11, age, 10, BACKLOG_READING_AGE));
        assert!(!reading_stands(0, BACKLOG_READING_AGE, 10, BACKLOG_READING_AGE), "as old as its age: counted again");
        assert!(!reading_stands(0, Duration::ZERO, 10, Duration::ZERO), "an age of zero: always counted");
    }

    #[test]
    fn this_processs_admissions_are_added_until_the_bound_asks_for_a_count() {
        let gauge = BacklogGauge::default();
        let now = Instant::now();
        assert_eq!(gauge.estimate(now, 3, BACKLOG_READING_AGE), None, "no reading yet");
        gauge.admitted();
        assert_eq!(gauge.estimate(now, 3, BACKLOG_READING_AGE), None, "an admission is no reading");
        gauge.record(now, 1);
        assert_eq!(gauge.estimate(now, 3, BACKLOG_READING_AGE), Some(1));
        gauge.admitted();
        assert_eq!(gauge.estimate(now, 3, BACKLOG_READING_AGE), Some(2));
        gauge.admitted();
        assert_eq!(gauge.estimate(now, 3, BACKLOG_READING_AGE), None, "at the bound: count");
        let later = now + BACKLOG_READING_AGE;
        gauge.record(now, 0);
        assert_eq!(gauge.estimate(later, 3, BACKLOG_READING_AGE), None, "too old: count");
    }

    #[test]
    fn a_count_that_began_before_the_reading_held_does_not_replace_it() {
        let gauge = BacklogGauge::default();
        let (earlier, now) = (Instant::now(), Instant::now() + Duration::from_millis(10));
        gauge.record(now, 5);
        gauge.admitted();
        gauge.admitted();
        gauge.record(earlier, 5);
        assert_eq!(gauge.estimate(now, 10, BACKLOG_READING_AGE), Some(7), "the admissions since are kept");
        gauge.record(now + Duration::from_millis(1), 4);
        assert_eq!(gauge.estimate(now, 10, BACKLOG_READING_AGE), Some(4), "a later count replaces it");
    }
}
