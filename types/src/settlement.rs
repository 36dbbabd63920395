//! What a job that ends without a result gives back. Pure, and shared: the server settles with
//! it, the browser says it before the user confirms a cancel or uploads.
//!
//! - A failed job is refunded in full, except an unreadable document (`invalid_input`) past the
//!   day's allowance: each reader costs the operator a sandboxed process, so hostile files are
//!   free only a few times a day.
//! - A canceled job is refunded, less the share of its provider calls already made or in
//!   flight when the cancel was asked for: the provider bills those whatever happens next.

/// A PDF's text is known only once read, so its admission holds the price of this many times
/// the tokens its bytes suggest (real PDFs spread up to about 4x; compressed text goes
/// further), and the job is settled to the price of its text once read: the difference comes
/// back. A PDF whose text is dearer than the hold pays the hold (a single call), or fails,
/// refunded, if it needs parts (paid work the hold does not cover).
pub const PDF_HOLD_FACTOR: u64 = 8;

/// The tokens a PDF's hold is priced at: [`PDF_HOLD_FACTOR`] times its size's estimate, but no
/// more than the document ceiling (no text past it is taken).
pub fn pdf_hold_tokens(by_size_tokens: u64, ceiling: Option<u64>) -> u64 {
    by_size_tokens.saturating_mul(PDF_HOLD_FACTOR).min(ceiling.unwrap_or(u64::MAX)).max(by_size_tokens)
}

/// What a read PDF costs: its text's price, never more than what was held.
pub fn settled_price(held: i64, text_price: i64) -> i64 {
    text_price.clamp(0, held.max(0))
}

/// Unreadable documents refunded per user in any 24 hours; later ones are charged.
pub const FREE_UNREADABLE_PER_DAY: u32 = 3;

/// Credits refunded when a job fails, given what it cost, what its document's price came to
/// (less than the cost for a PDF held at its worst case), and how many unreadable documents
/// its owner was already refunded for in the last 24 hours. A charged one pays its price.
pub fn refund_on_failure(cost: i64, price: i64, unreadable: bool, refunded_unreadable_today: u32) -> i64 {
    if unreadable && refunded_unreadable_today >= FREE_UNREADABLE_PER_DAY {
        (cost - price.clamp(0, cost.max(0))).max(0)
    } else {
        cost.max(0)
    }
}

/// Provider calls a job has started: its parts done, plus the call in flight.
pub fn calls_started(parts_done: u32, provider_call_in_flight: bool) -> u32 {
    parts_done + u32::from(provider_call_in_flight)
}

/// Credits kept when a job is canceled: its cost times the share of its calls started (rounded
/// up, so the operator is not left paying for part of a call), never more than the cost.
pub fn kept_on_cancel(cost: i64, calls_started: u32, calls_total: u32) -> i64 {
    let cost = cost.max(0);
    let total = i64::from(calls_total.max(1));
    let started = i64::from(calls_started).min(total);
    (cost * started + total - 1) / total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_documents_are_free_only_up_to_the_allowance() {
        assert_eq!(refund_on_failure(4, 4, true, 0), 4);
        assert_eq!(refund_on_failure(4, 4, true, FREE_UNREADABLE_PER_DAY - 1), 4);
        assert_eq!(refund_on_failure(4, 4, true, FREE_UNREADABLE_PER_DAY), 0);
        assert_eq!(
            refund_on_failure(8, 2, true, FREE_UNREADABLE_PER_DAY),
            6,
            "a held PDF pays its price, not the hold"
        );
        assert_eq!(refund_on_failure(4, 4, false, 100), 4, "other failures are always refunded");
    }

    #[test]
    fn a_pdf_holds_its_worst_case_and_settles_to_its_text() {
        assert_eq!(pdf_hold_tokens(1_000, None), 8_000);
        assert_eq!(pdf_hold_tokens(1_000_000, Some(2_000_000)), 2_000_000, "no more than the ceiling");
        assert_eq!(pdf_hold_tokens(3_000_000, Some(2_000_000)), 3_000_000, "never below its own estimate");
        assert_eq!(settled_price(8, 2), 2);
        assert_eq!(settled_price(8, 12), 8, "never more than held");
        assert_eq!(settled_price(8, -1), 0);
    }

    #[test]
    fn a_cancel_keeps_the_share_of_calls_started() {
        assert_eq!(kept_on_cancel(3, calls_started(0, false), 1), 0, "nothing sent: all back");
        assert_eq!(kept_on_cancel(3, calls_started(0, true), 1), 3, "the one call is in flight");
        assert_eq!(kept_on_cancel(12, calls_started(2, true), 6), 6);
        assert_eq!(kept_on_cancel(4, calls_started(1, false), 3), 2, "rounded up");
        assert_eq!(kept_on_cancel(4, 9, 3), 4, "never more than the cost");
        assert_eq!(kept_on_cancel(-1, 1, 1), 0);
    }

    #[test]
    fn kept_is_monotonic_and_bounded() {
        for cost in 0..30 {
            for total in 1..12 {
                let mut last = 0;
                for started in 0..=total + 2 {
                    let kept = kept_on_cancel(cost, started, total);
                    assert!(kept >= last && kept <= cost, "{cost} {started}/{total}");
                    last = kept;
                }
                assert_eq!(last, cost);
            }
        }
    }
}
