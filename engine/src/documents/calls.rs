//! How a document is cut into provider calls (pure): the processor splits by it, and an
//! upload's estimate counts its parts by it, so the two cannot disagree.

use super::tokens::PLANNING_MARGIN;
use crate::Preset;

/// Tokens a part's prompt adds around its text (the instruction and the part's place).
pub const PART_PROMPT_TOKENS: u64 = 200;
/// A translation's part at most, in tokens: its answer is written at a model's pace (60-1,000
/// tokens a second), so a part must end well within a call's timeout.
const MAX_TRANSLATION_PART_TOKENS: u64 = 8_000;
/// Parts a long document is split into at least, so its calls run side by side: a model
/// writes at its own pace per call (60-1,000 tokens a second), and the provider's limits are
/// reached only by several calls at once. Measured in `cargo xtask bench parts` (the book's Benchmarks chapter): 32
/// parts finished a 129K-token translation alone sooner (12.0 s against 18.3 s), but made
/// other owners' small documents behind it wait 1.7 times as long; 8 kept them within 1.1.
const PACE_PARTS: u64 = 8;
/// Parts no smaller than this (each call repeats the instruction, and a part needs context).
const MIN_PART_TOKENS: u64 = 4_000;
/// A translation's answer, as asked for, against its text: the language's growth with room
/// (`providers::vendor::answer_tokens_to_ask`). A provider counts the answer asked for against
/// its context, so a translation's part leaves it that share.
const TRANSLATION_ANSWER_SHARE: f64 = 1.5;
/// Room over a translation's expected answer a part leaves within what one answer may hold:
/// an answer learned at its language's expansion still varies from text to text.
const ANSWER_MARGIN: f64 = 1.15;
/// Output tokens an ask adds over its expected answer, at least
/// (`providers::vendor::answer_tokens_to_ask`).
const ASK_ROOM: u64 = 512;

/// What one provider call can carry: its context and the longest answer it writes (`None`:
/// unlimited, as with the local provider).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallLimits {
    pub context_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// A translation's output tokens per prompt token as learned for its model and language
    /// (`ratio::TokenRatio::expansion`): its parts are sized so their answers fit. None: the
    /// parts leave a quarter of an answer's room for the language to grow.
    pub answer_growth: Option<f64>,
}

impl CallLimits {
    /// The most tokens one call's prompt may carry, if limited: the provider's context (less
    /// the planning margin: the provider's tokenizer is not ours), which for a translation
    /// holds its answer too; for a translation also no more than its answer can hold (an
    /// answer as long as its text, with room to grow).
    pub fn part_tokens(&self, preset: Preset) -> Option<u64> {
        let growth = self.answer_growth.filter(|g| g.is_finite() && *g > 0.0);
        let share = match growth {
            _ if !joins(preset) => 1.0,
            Some(growth) => 1.0 + growth * ANSWER_MARGIN,
            None => 1.0 + TRANSLATION_ANSWER_SHARE,
        };
        let context = self.context_tokens.map(|c| (c as f64 * PLANNING_MARGIN / share) as u64);
        let answer = self.max_output_tokens.filter(|_| joins(preset)).map(|output| {
            let fits = match growth {
                Some(growth) => (output.saturating_sub(ASK_ROOM) as f64 / (growth * ANSWER_MARGIN)) as u64,
                None => output.saturating_mul(3) / 4 + PART_PROMPT_TOKENS,
            };
            fits.clamp(PART_PROMPT_TOKENS + 1, MAX_TRANSLATION_PART_TOKENS + PART_PROMPT_TOKENS)
        });
        match (context, answer) {
            (Some(c), Some(a)) => Some(c.min(a)),
            (c, a) => c.or(a),
        }
    }
}

impl CallLimits {
    /// The limits in our tokens, for a provider whose tokenizer counts `ratio` times as many
    /// (its context holds that many fewer of ours; an answer's limit is its own).
    pub fn in_our_tokens(self, ratio: f64) -> CallLimits {
        let ratio = if ratio.is_finite() && ratio > 0.0 { ratio } else { 1.0 };
        CallLimits { context_tokens: self.context_tokens.map(|c| (c as f64 / ratio).max(1.0) as u64), ..self }
    }
}

/// Whether a preset's parts are combined by joining them in order (a translation), rather than
/// by a summary of their answers.
pub fn joins(preset: Preset) -> bool {
    preset.answer_grows_with_input()
}

/// The part size that keeps a document of `tokens` in [`PACE_PARTS`] parts or more.
fn pace_part_tokens(tokens: u64) -> u64 {
    tokens.div_ceil(PACE_PARTS).saturating_add(PART_PROMPT_TOKENS).max(MIN_PART_TOKENS)
}

/// How a document's prompt of `tokens` is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calls {
    /// In one call.
    Whole,
    /// In parts whose prompts carry at most `part_tokens` each.
    Parts { part_tokens: u64 },
}

/// One call when it fits; else parts that fit a call. A translation longer than a pace part
/// goes in parts even when it would fit: its answer is written at a model's pace per call,
/// so side by side it ends in a fraction of one call's time.
pub fn calls_for(preset: Preset, tokens: u64, limits: CallLimits) -> Calls {
    let limit = limits.part_tokens(preset);
    let pace = pace_part_tokens(tokens);
    let for_pace = joins(preset) && tokens > pace;
    if !for_pace && limit.is_none_or(|l| tokens <= l) {
        return Calls::Whole;
    }
    Calls::Parts { part_tokens: limit.unwrap_or(u64::MAX / 8).min(pace) }
}

/// About how many calls a document of `tokens` takes for its text: its parts (the splitter
/// cuts at paragraph ends, so a few more may come), not counting a summary's combining step.
pub fn expected_parts(preset: Preset, tokens: u64, limits: CallLimits) -> u64 {
    match calls_for(preset, tokens, limits) {
        Calls::Whole => 1,
        Calls::Parts { part_tokens } => tokens.div_ceil(part_tokens.saturating_sub(PART_PROMPT_TOKENS).max(1)).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOSTED: CallLimits =
        CallLimits { context_tokens: Some(200_000), max_output_tokens: Some(8_192), answer_growth: None };

    #[test]
    fn a_short_text_is_one_call_and_a_long_summary_fills_the_context() {
        assert_eq!(calls_for(Preset::Summarize, 3_000, HOSTED), Calls::Whole);
        assert_eq!(expected_parts(Preset::Summarize, 150_000, HOSTED), 1, "it fits the context");
        // Past the context (less the planning margin) it goes in parts of the context's size,
        // at least eight of them for pace.
        let Calls::Parts { part_tokens } = calls_for(Preset::Summarize, 500_000, HOSTED) else { panic!() };
        assert!(part_tokens <= 200_000 && part_tokens >= 62_700, "{part_tokens}");
        assert!(expected_parts(Preset::Summarize, 500_000, HOSTED) >= 8);
    }

    #[test]
    fn a_translation_is_cut_where_its_answer_fits_and_for_pace() {
        // Seed 000: a 50K-token text under one context must not be one call cut at max_tokens.
        assert_eq!(HOSTED.part_tokens(Preset::Translate), Some(6_144 + PART_PROMPT_TOKENS));
        // In a small context a translation's part leaves room for its answer beside it.
        let small = CallLimits { context_tokens: Some(10_000), max_output_tokens: Some(64_000), answer_growth: None };
        assert_eq!(small.part_tokens(Preset::Translate), Some(3_600));
        assert_eq!(small.part_tokens(Preset::Summarize), Some(9_000));
        // A provider counting twice our tokens holds half as many of ours.
        assert_eq!(small.in_our_tokens(2.0).part_tokens(Preset::Summarize), Some(4_500));
        assert_eq!(small.in_our_tokens(f64::NAN), small);
        assert_eq!(expected_parts(Preset::Translate, 50_000, HOSTED), 9);
        // A short one is one call; one past a pace part goes in parts though it fits.
        assert_eq!(calls_for(Preset::Translate, 3_900, HOSTED), Calls::Whole);
        let unlimited = CallLimits::default();
        assert_eq!(calls_for(Preset::Summarize, 1_000_000, unlimited), Calls::Whole);
        assert_eq!(expected_parts(Preset::Translate, 64_000, unlimited), 8);
    }

    #[test]
    fn a_translations_parts_are_sized_by_its_learned_expansion() {
        // German by a tokenizer counting 15 % more: 1.55 output tokens a prompt token.
        let learned = CallLimits { answer_growth: Some(1.55), ..HOSTED };
        let part = learned.part_tokens(Preset::Translate).unwrap();
        // Its answer with the margin fits one answer (8,192 less the ask's room).
        assert!(part as f64 * 1.55 * ANSWER_MARGIN <= (8_192 - ASK_ROOM) as f64, "{part}");
        assert!(part >= 4_000, "not needlessly small: {part}");
        // A language that writes shorter gets larger parts, within the pace's bound.
        let short = CallLimits { answer_growth: Some(0.8), ..HOSTED }.part_tokens(Preset::Translate).unwrap();
        assert!(short > part && short <= 8_200, "{short}");
        // In a small context the part leaves room for its answer beside it.
        let small =
            CallLimits { context_tokens: Some(10_000), max_output_tokens: Some(64_000), answer_growth: Some(2.0) };
        assert_eq!(small.part_tokens(Preset::Translate), Some(2_727));
        assert_eq!(small.part_tokens(Preset::Summarize), Some(9_000), "a summary's parts are not sized by it");
    }

    proptest! {
        /// The parts counted cover the text, and each part fits one call.
        #[test]
        fn the_parts_cover_the_text_and_each_fits(tokens in 1u64..5_000_000, context in 1_000u64..400_000, output in 500u64..64_000) {
            let limits = CallLimits { context_tokens: Some(context), max_output_tokens: Some(output), answer_growth: None };
            for preset in [Preset::Summarize, Preset::Translate] {
                let parts = expected_parts(preset, tokens, limits);
                match calls_for(preset, tokens, limits) {
                    Calls::Whole => prop_assert_eq!(parts, 1),
                    Calls::Parts { part_tokens } => {
                        prop_assert!(part_tokens <= limits.part_tokens(preset).unwrap());
                        prop_assert!(parts * part_tokens.saturating_sub(PART_PROMPT_TOKENS).max(1) >= tokens);
                    }
                }
            }
        }
    }
}
