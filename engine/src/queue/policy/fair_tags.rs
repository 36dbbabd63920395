//! Fairness between owners (pure): start-time fair queuing by tokens, the order in which
//! `sluice_claim_with_places` takes due jobs (the database keeps the same numbers: see the
//! migration `20261212000001_fair_tags.sql`).
//!
//! A job entering the line is tagged max(virtual time, its owner's finish tag), and its owner's
//! finish tag moves on by the job's token weight. Due jobs are claimed lowest tag first (ties:
//! the earlier due, then the job id), and each claim moves the virtual time to the highest tag it
//! served. So an owner pays for the tokens it sends: after a 490K-token document (weight 20), its
//! next job waits while every other backlogged owner is served 20 weights, and a newcomer's job,
//! tagged at the virtual time, goes before every job tagged later.

use std::collections::HashMap;

/// Input tokens one unit of weight stands for.
pub const TOKENS_PER_WEIGHT: u64 = 25_000;

/// A job's weight: one per started 25,000 input tokens, at least one (`sluice_token_weight`).
pub fn token_weight(tokens: i64) -> u64 {
    (tokens.max(0) as u64).div_ceil(TOKENS_PER_WEIGHT).max(1)
}

/// The tags of one line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tags {
    /// The highest tag claimed so far.
    pub virtual_time: u64,
    /// Each owner's finish tag: where its next job starts, unless the virtual time is past it.
    pub finish: HashMap<i64, u64>,
}

impl Tags {
    /// The tag of a job of `owner`'s with `tokens` input tokens entering the line now.
    pub fn enter(&mut self, owner: i64, tokens: i64) -> u64 {
        let finish = self.finish.entry(owner).or_default();
        let tag = (*finish).max(self.virtual_time);
        *finish = tag + token_weight(tokens);
        tag
    }

    /// Where a job of `owner`'s entering now would be tagged (nothing changes).
    pub fn next_tag(&self, owner: i64) -> u64 {
        self.finish.get(&owner).copied().unwrap_or(0).max(self.virtual_time)
    }

    /// A claim served jobs up to `tag`.
    pub fn served(&mut self, tag: u64) {
        self.virtual_time = self.virtual_time.max(tag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn weights_are_per_started_25k_tokens() {
        assert_eq!(token_weight(0), 1);
        assert_eq!(token_weight(-5), 1, "nonsense counts weigh the least");
        assert_eq!(token_weight(2_000), 1);
        assert_eq!(token_weight(25_000), 1);
        assert_eq!(token_weight(25_001), 2);
        assert_eq!(token_weight(490_000), 20);
    }

    #[test]
    fn a_light_newcomer_goes_before_a_heavy_owners_next_job() {
        let mut tags = Tags::default();
        assert_eq!(tags.enter(1, 490_000), 0);
        assert_eq!(tags.enter(1, 2_000), 20, "after the document's weight");
        tags.served(0); // the document is claimed
        assert_eq!(tags.enter(2, 2_000), 0, "at the virtual time: before the heavy owner's next");
        assert_eq!(tags.next_tag(2), 1);
        assert_eq!(tags.next_tag(3), 0, "an owner never seen starts at the virtual time");
    }

    #[test]
    fn waiting_idle_saves_no_credit() {
        let mut tags = Tags::default();
        tags.enter(1, 0);
        tags.served(50);
        assert_eq!(tags.enter(1, 0), 50, "tagged at the virtual time, not at its old finish");
    }

    /// Every owner's jobs (token counts), all entering at once; then claimed one at a time in
    /// tag order. Returns the owners in claim order.
    fn claim_order(lines: &[Vec<i64>]) -> Vec<(usize, u64)> {
        let mut tags = Tags::default();
        let mut jobs: Vec<(u64, usize, usize, u64)> = Vec::new(); // (tag, arrival, owner, weight)
        for (owner, line) in lines.iter().enumerate() {
            for &tokens in line {
                let tag = tags.enter(owner as i64, tokens);
                jobs.push((tag, jobs.len(), owner, token_weight(tokens)));
            }
        }
        jobs.sort();
        jobs.into_iter().map(|(_, _, owner, weight)| (owner, weight)).collect()
    }

    fn lines() -> impl Strategy<Value = Vec<Vec<i64>>> {
        prop::collection::vec(prop::collection::vec(0i64..600_000, 1..12), 2..7)
    }

    proptest! {
        /// The bound the claim keeps: at any point of the claim order, two owners that both
        /// still have jobs waiting have been served token weights within the largest job's
        /// weight of each other.
        #[test]
        fn backlogged_owners_are_served_within_one_job_of_each_other(lines in lines()) {
            let most = lines.iter().flatten().map(|&t| token_weight(t)).max().unwrap();
            let mut served = vec![0u64; lines.len()];
            let mut left: Vec<usize> = lines.iter().map(Vec::len).collect();
            for (owner, weight) in claim_order(&lines) {
                served[owner] += weight;
                left[owner] -= 1;
                let backlogged: Vec<u64> = (0..lines.len()).filter(|&o| left[o] > 0).map(|o| served[o]).collect();
                if let (Some(lo), Some(hi)) = (backlogged.iter().min(), backlogged.iter().max()) {
                    prop_assert!(hi - lo <= most, "served {served:?} with {left:?} left");
                }
            }
        }

        /// An owner with one job waits behind at most one job of every other owner.
        #[test]
        fn a_single_job_waits_behind_one_job_of_each_other_owner(lines in lines(), tokens in 0i64..25_000) {
            let mut lines = lines;
            lines.push(vec![tokens]);
            let newcomer = lines.len() - 1;
            let order = claim_order(&lines);
            let at = order.iter().position(|&(o, _)| o == newcomer).unwrap();
            prop_assert!(at <= lines.len() - 1, "{at} jobs ahead");
        }
    }
}
