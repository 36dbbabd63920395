//! Lanes (DESIGN: deadlines and lanes): how many gate slots the urgent lane (small, flagged
//! or an account's documents) and the bulk lane (large documents) may hold. The bulk lane never
//! takes the urgent lane's reserve; the urgent lane leaves the bulk lane its floor while bulk
//! work is running or due. Nothing is preempted, so the reserve is what lets small documents
//! start at once behind a large one. Mirrored in SQL by `sluice_lane_caps` and
//! `sluice_part_share` (engine/tests/fairness.rs holds the two to the same answers).

/// The operator's split of the gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneShares {
    /// The share of the gate the bulk lane may never take (0 to 0.9).
    pub urgent_share: f64,
    /// The share of the gate the urgent lane leaves the bulk lane while it has work (0 to 0.9).
    pub bulk_floor: f64,
}

impl Default for LaneShares {
    fn default() -> Self {
        LaneShares { urgent_share: DEFAULT_URGENT_SHARE, bulk_floor: DEFAULT_BULK_FLOOR }
    }
}

/// A quarter of the gate (6 of 24) is kept for small documents: a 25-part document alone
/// still runs in two rounds, as it does on all 24.
pub const DEFAULT_URGENT_SHARE: f64 = 0.25;
/// A quarter of the gate stays the bulk lane's while it has work, whatever the small ones do.
pub const DEFAULT_BULK_FLOOR: f64 = 0.25;

/// The most slots each lane may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneCaps {
    pub urgent: i64,
    pub bulk: i64,
}

/// Slots of a share of the gate, rounded up (a share that is a whole number of slots is
/// that number, whatever the float's last bit).
fn slots(gate: i64, share: f64) -> i64 {
    (gate as f64 * share - 1e-9).ceil().max(0.0) as i64
}

/// The lanes' caps for `gate` slots; `bulk_demand` is how many slots the bulk lane could use
/// now (its running work counts as the whole floor). Below two slots there are no lanes.
pub fn caps(gate: i64, shares: LaneShares, bulk_demand: i64) -> LaneCaps {
    if gate < 2 {
        return LaneCaps { urgent: gate.max(0), bulk: gate.max(0) };
    }
    let floor = if shares.bulk_floor > 0.0 { slots(gate, shares.bulk_floor).max(1) } else { 0 }.min(gate - 1);
    let reserve = slots(gate, shares.urgent_share).min(gate - floor);
    LaneCaps { urgent: gate - floor.min(bulk_demand.max(0)), bulk: gate - reserve }
}

/// The most calls one job may run at once: its lane's cap shared among the owners running in
/// it (at least the one it holds).
pub fn part_share(lane_cap: i64, owners: i64) -> i64 {
    let owners = owners.max(1);
    ((lane_cap.max(0) + owners - 1) / owners).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_keeps_six_of_24_for_small_documents_and_six_for_large_ones() {
        let caps = caps(24, LaneShares::default(), 24);
        assert_eq!(caps, LaneCaps { urgent: 18, bulk: 18 });
        // No large work: the small ones may have every slot.
        assert_eq!(super::caps(24, LaneShares::default(), 0).urgent, 24);
        // One large job waiting: the small ones leave it one slot, not six.
        assert_eq!(super::caps(24, LaneShares::default(), 1).urgent, 23);
    }

    #[test]
    fn a_gate_of_one_has_no_lanes_and_two_split_evenly() {
        assert_eq!(caps(1, LaneShares::default(), 5), LaneCaps { urgent: 1, bulk: 1 });
        assert_eq!(caps(2, LaneShares::default(), 5), LaneCaps { urgent: 1, bulk: 1 });
        assert_eq!(caps(0, LaneShares::default(), 5), LaneCaps { urgent: 0, bulk: 0 });
    }

    #[test]
    fn shares_of_whole_slots_are_not_rounded_up_by_the_floats_last_bit() {
        // 0.1 * 30 is 3.0000000000000004 in floats.
        let caps = caps(30, LaneShares { urgent_share: 0.1, bulk_floor: 0.1 }, 30);
        assert_eq!(caps, LaneCaps { urgent: 27, bulk: 27 });
    }

    #[test]
    fn parts_are_shared_among_the_owners_in_the_lane() {
        assert_eq!(part_share(18, 1), 18);
        assert_eq!(part_share(18, 2), 9);
        assert_eq!(part_share(18, 4), 5);
        assert_eq!(part_share(3, 10), 1);
        assert_eq!(part_share(0, 0), 1);
    }

    proptest! {
        #[test]
        fn each_lane_keeps_its_share_and_neither_takes_the_whole_gate_from_the_other(
            gate in 2i64..=70,
            urgent_share in 0.0f64..=0.9,
            bulk_floor in 0.0f64..=0.9,
            demand in 0i64..=80,
        ) {
            let shares = LaneShares { urgent_share, bulk_floor };
            let caps = caps(gate, shares, demand);
            // Within the gate, each lane may always start something.
            prop_assert!(caps.bulk >= 1 && caps.bulk <= gate);
            prop_assert!(caps.urgent >= 1 && caps.urgent <= gate);
            // Both lanes full at once never exceed the gate by more than the reserve overlap:
            // the bulk lane leaves the reserve, the urgent lane the floor (or the bulk demand).
            let reserve = gate - caps.bulk;
            prop_assert!(reserve >= slots(gate, urgent_share).min(gate - 1).min(gate - caps.bulk));
            prop_assert!(gate - caps.urgent <= demand.max(0));
            // A share asked for is kept, unless the two together ask for more than the gate.
            if slots(gate, urgent_share) + slots(gate, bulk_floor).max(if bulk_floor > 0.0 { 1 } else { 0 }) <= gate {
                prop_assert_eq!(reserve, slots(gate, urgent_share));
                prop_assert_eq!(gate - caps.urgent, slots(gate, bulk_floor).max(if bulk_floor > 0.0 { 1 } else { 0 }).min(demand));
            }
        }

        #[test]
        fn owners_shares_cover_the_lane_and_no_owner_gets_less_than_one(cap in 0i64..=70, owners in 0i64..=80) {
            let share = part_share(cap, owners);
            prop_assert!(share >= 1);
            prop_assert!(share * owners.max(1) >= cap);
            prop_assert!(share <= cap.max(1));
        }
    }
}
