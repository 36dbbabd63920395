//! What a job that ends without a result gives back. Pure, and shared: the server settles with
//! it, the browser says it before the user confirms a cancel or uploads.
//!
//! - A failed job is refunded in full when the failure is ours or the provider's (5xx,
//!   timeouts, a lost lease, retries exhausted, a refusal for good). When it is the document's
//!   (`invalid_input`): an unreadable one (or one refused after reading) is free only a few
//!   times a day, since each reader costs the operator a sandboxed process; one that fails
//!   after provider calls (an answer cut short, a combining step that does not shrink, a
//!   refusal to answer it) keeps the share of its calls made, like a cancel.
//! - A canceled job is refunded, less the share of its provider calls already made or in
//!   flight when the cancel was asked for: the provider bills those whatever happens next.

use crate::capacity::SizeKind;

/// A PDF's or a Word file's text is known only once read, so its admission holds the price of
/// this many times the tokens its bytes suggest (real PDFs spread up to about 4x; compressed
/// text goes further), and the job is settled to the price of its text once read: the
/// difference comes back. A document whose text is dearer than the hold fails before any
/// provider call (paid work the hold does not cover, in one call or in parts): refunded
/// within the day's allowance for unreadable documents, as the reader's work came to nothing.
/// A web page is held at its size's estimate alone: its markup only makes that larger.
pub const HOLD_FACTOR: u64 = 8;

/// How many times its size's estimate a document of `kind` is held at (1 for text, which is
/// priced by its counted tokens, and for a web page).
pub fn hold_factor(kind: SizeKind) -> u64 {
    match kind {
        SizeKind::Pdf | SizeKind::Packed => HOLD_FACTOR,
        SizeKind::Text | SizeKind::Page => 1,
    }
}

/// The tokens a document's hold is priced at: its [`hold_factor`] times its size's estimate,
/// but no more than the document ceiling (no text past it is taken).
pub fn hold_tokens(kind: SizeKind, by_size_tokens: u64, ceiling: Option<u64>) -> u64 {
    by_size_tokens.saturating_mul(hold_factor(kind)).min(ceiling.unwrap_or(u64::MAX)).max(by_size_tokens)
}

/// What a read PDF costs: its text's price, never more than what was held.
pub fn settled_price(held: i64, text_price: i64) -> i64 {
    text_price.clamp(0, held.max(0))
}

/// Unreadable documents refunded per user in any 24 hours; later ones are charged.
pub const FREE_UNREADABLE_PER_DAY: u32 = 3;

/// Whose a failure is, as its settlement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Ours or the provider's: refunded in full.
    Ours,
    /// The document could not be read, or was refused once read: free while its owner was
    /// refunded for fewer than [`FREE_UNREADABLE_PER_DAY`] such documents in the last 24 hours.
    Unreadable { refunded_today: u32 },
    /// The document failed after provider calls were answered: it keeps their share.
    Document { calls_made: u32, calls_total: u32 },
}

/// Credits refunded when a job fails, given what it cost, what its document's price came to
/// (less than the cost for a PDF held at its worst case) and whose the failure is. A charged
/// unreadable document pays its price; a document's failure keeps its calls' share of it.
pub fn refund_on_failure(cost: i64, price: i64, fault: Fault) -> i64 {
    let cost = cost.max(0);
    let price = price.clamp(0, cost);
    match fault {
        Fault::Unreadable { refunded_today } if refunded_today >= FREE_UNREADABLE_PER_DAY => cost - price,
        Fault::Document { calls_made, calls_total } => cost - kept_on_cancel(price, calls_made, calls_total),
        _ => cost,
    }
}

/// Whether the parts a job had answered may still be served to its owner: not once its whole
/// cost was refunded (nobody gets what they did not pay for; a free job is its owner's).
pub fn answered_parts_served(cost: i64, refunded: i64) -> bool {
    cost <= 0 || refunded < cost
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

    fn unreadable(refunded_today: u32) -> Fault {
        Fault::Unreadable { refunded_today }
    }

    #[test]
    fn unreadable_documents_are_free_only_up_to_the_allowance() {
        assert_eq!(refund_on_failure(4, 4, unreadable(0)), 4);
        assert_eq!(refund_on_failure(4, 4, unreadable(FREE_UNREADABLE_PER_DAY - 1)), 4);
        assert_eq!(refund_on_failure(4, 4, unreadable(FREE_UNREADABLE_PER_DAY)), 0);
        assert_eq!(
            refund_on_failure(8, 2, unreadable(FREE_UNREADABLE_PER_DAY)),
            6,
            "a held PDF pays its price, not the hold"
        );
        assert_eq!(refund_on_failure(4, 4, Fault::Ours), 4, "our failures are always refunded");
    }

    #[test]
    fn a_document_that_fails_after_answers_keeps_their_share() {
        let document = |calls_made, calls_total| Fault::Document { calls_made, calls_total };
        assert_eq!(refund_on_failure(12, 12, document(11, 12)), 1, "failed at its last part");
        assert_eq!(refund_on_failure(12, 12, document(0, 12)), 12, "no answer yet: all back");
        assert_eq!(refund_on_failure(12, 12, document(12, 12)), 0, "a combining step failed");
        assert_eq!(refund_on_failure(12, 6, document(3, 6)), 9, "the share of its price, not of a hold");
        assert_eq!(refund_on_failure(4, 4, document(1, 3)), 2, "rounded up like a cancel");
        for made in 0..=14 {
            let refund = refund_on_failure(12, 12, document(made, 12));
            assert!((0..=12).contains(&refund), "{made}: {refund}");
            assert_eq!(refund, 12 - kept_on_cancel(12, made, 12));
        }
    }

    #[test]
    fn a_pdf_holds_its_worst_case_and_settles_to_its_text() {
        assert_eq!(hold_tokens(SizeKind::Pdf, 1_000, None), 8_000);
        assert_eq!(hold_tokens(SizeKind::Packed, 1_000, None), 8_000);
        assert_eq!(hold_tokens(SizeKind::Page, 1_000, None), 1_000, "a page's markup is already counted");
        assert_eq!(hold_tokens(SizeKind::Pdf, 1_000_000, Some(2_000_000)), 2_000_000, "no more than the ceiling");
        assert_eq!(hold_tokens(SizeKind::Pdf, 3_000_000, Some(2_000_000)), 3_000_000, "never below its own estimate");
        assert_eq!(settled_price(8, 2), 2);
        assert_eq!(settled_price(8, 12), 8, "never more than held");
        assert_eq!(settled_price(8, -1), 0);
    }

    #[test]
    fn answered_parts_are_served_only_while_something_of_them_was_paid() {
        assert!(answered_parts_served(4, 0), "running or charged in full");
        assert!(answered_parts_served(4, 2), "the answered share kept");
        assert!(!answered_parts_served(4, 4), "refunded in full");
        assert!(answered_parts_served(0, 0), "free work is its owner's");
        // A declined document keeps the share of its answered parts, so they stay served.
        let refund = refund_on_failure(4, 4, Fault::Document { calls_made: 25, calls_total: 50 });
        assert!(answered_parts_served(4, refund));
        assert!(!answered_parts_served(4, refund_on_failure(4, 4, Fault::Ours)));
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
