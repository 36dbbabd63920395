//! What the vendors' answers mean, and what to ask of them (pure): stop reasons, "prompt is too
//! long", the rate limits' reset headers, model families, and the answer size a call asks for.
//! Read from the vendors' own documentation (Anthropic's Messages API, OpenAI's chat
//! completions); the contract tests replay their documented bodies against these.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

use super::ProviderKind;
use crate::queue::policy::retry::MAX_RETRY_AFTER;
use crate::Preset;

/// How an answer ended, by what its stop reason means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model finished (Anthropic `end_turn`, `stop_sequence`; OpenAI `stop`).
    Whole,
    /// The answer hit its output limit (`max_tokens`, `length`): not the whole answer.
    Cut,
    /// The model refused (`refusal`, `content_filter`): the document's, asking again won't help.
    Declined,
    /// Any other reason, or none (a `pause_turn`, a tool call, a reason added next year): never
    /// taken for a whole answer.
    Unknown(String),
}

/// Anthropic's `stop_reason`.
pub fn anthropic_stop(reason: Option<&str>) -> Stop {
    match reason {
        Some("end_turn" | "stop_sequence") => Stop::Whole,
        Some("max_tokens" | "model_context_window_exceeded") => Stop::Cut,
        Some("refusal") => Stop::Declined,
        other => Stop::Unknown(reason_name(other)),
    }
}

/// OpenAI's `finish_reason`.
pub fn openai_stop(reason: Option<&str>) -> Stop {
    match reason {
        Some("stop") => Stop::Whole,
        Some("length") => Stop::Cut,
        Some("content_filter") => Stop::Declined,
        other => Stop::Unknown(reason_name(other)),
    }
}

fn reason_name(reason: Option<&str>) -> String {
    // A provider's text goes into messages: bounded, and only its plain characters.
    reason.map_or_else(
        || "none".to_string(),
        |r| r.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(40).collect(),
    )
}

/// A provider refused a prompt as longer than its context, with its own count when it gave one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLong {
    /// The prompt's tokens as the provider counted them.
    pub counted: Option<u64>,
    /// The most it takes.
    pub maximum: Option<u64>,
}

/// Whether a failed call says the prompt was too long: Anthropic's 400 `invalid_request_error`
/// "prompt is too long: 210000 tokens > 200000 maximum"; OpenAI's 400 `context_length_exceeded`
/// "This model's maximum context length is 128000 tokens. However, your messages resulted in
/// 130000 tokens..." (or "... you requested 8500 tokens (500 in the messages, 8000 in the
/// completion)").
pub fn prompt_too_long(status: u16, body: &str) -> Option<TooLong> {
    if status != 400 && status != 413 {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    if let Some(at) = lower.find("prompt is too long") {
        let numbers = numbers_in(&lower.as_bytes()[at..]);
        return Some(TooLong { counted: numbers.first().copied(), maximum: numbers.get(1).copied() });
    }
    // Anthropic: "input length and `max_tokens` exceed context limit: 188000 + 15512 > 200000".
    if let Some(at) = lower.find("exceed context limit") {
        let numbers = numbers_in(&lower.as_bytes()[at..]);
        return Some(TooLong { counted: numbers.first().copied(), maximum: numbers.get(2).copied() });
    }
    if lower.contains("context_length_exceeded") || lower.contains("maximum context length") {
        let maximum = number_after(&lower, "maximum context length is");
        let counted = number_before(&lower, "in the messages").or_else(|| number_after(&lower, "resulted in"));
        return Some(TooLong { counted, maximum });
    }
    None
}

/// The numbers in `text` (digits, with thousands' commas), the first eight. Read byte by byte
/// (digits are ASCII): a window cut inside a multi-byte character reads the same.
fn numbers_in(text: &[u8]) -> Vec<u64> {
    let mut numbers = Vec::new();
    let mut current = String::new();
    for &b in text.iter().chain(std::iter::once(&b' ')) {
        if b.is_ascii_digit() {
            current.push(char::from(b));
        } else if b == b',' && !current.is_empty() {
        } else if !current.is_empty() {
            numbers.push(current.parse().unwrap_or(u64::MAX));
            current.clear();
            if numbers.len() == 8 {
                break;
            }
        }
    }
    numbers
}

fn number_after(text: &str, marker: &str) -> Option<u64> {
    let at = text.find(marker)? + marker.len();
    numbers_in(&text.as_bytes()[at..text.len().min(at + 40)]).first().copied()
}

fn number_before(text: &str, marker: &str) -> Option<u64> {
    let at = text.find(marker)?;
    numbers_in(&text.as_bytes()[at.saturating_sub(24)..at]).last().copied()
}

/// How long until a rate limit that is spent resets, from the headers that say so when
/// `retry-after` does not: Anthropic's `anthropic-ratelimit-*-reset` (an RFC 3339 time) for a
/// limit whose `-remaining` is 0; OpenAI's `x-ratelimit-reset-{requests,tokens}` ("6m0s",
/// "1.5s", "20ms") for one whose `x-ratelimit-remaining-*` is 0. The longest such wait, capped.
pub fn reset_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let spent = |name: &str| get(name).is_some_and(|v| v == "0");
    let mut waits = Vec::new();
    for limit in ["requests", "tokens", "input-tokens", "output-tokens"] {
        if spent(&format!("anthropic-ratelimit-{limit}-remaining")) {
            if let Some(at) = get(&format!("anthropic-ratelimit-{limit}-reset")).and_then(rfc3339) {
                waits.push(at.duration_since(now).unwrap_or(Duration::ZERO));
            }
        }
    }
    for limit in ["requests", "tokens"] {
        if spent(&format!("x-ratelimit-remaining-{limit}")) {
            if let Some(wait) = get(&format!("x-ratelimit-reset-{limit}")).and_then(go_duration) {
                waits.push(wait);
            }
        }
    }
    waits.into_iter().max().map(|w| w.min(MAX_RETRY_AFTER))
}

fn rfc3339(value: &str) -> Option<SystemTime> {
    let at = chrono::DateTime::parse_from_rfc3339(value).ok()?;
    let secs = u64::try_from(at.timestamp()).ok()?;
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(secs)
            + Duration::from_nanos(u64::from(at.timestamp_subsec_nanos())),
    )
}

/// A duration as OpenAI writes it: `1h2m3.5s`, `6m0s`, `20ms`; anything else is `None`.
pub fn go_duration(value: &str) -> Option<Duration> {
    if value.is_empty() || value.len() > 32 {
        return None;
    }
    let mut total = 0.0f64;
    let mut rest = value;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let per = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += number * per;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total.min(MAX_RETRY_AFTER.as_secs_f64())))
}

/// Whether `model` is a reasoning model that takes `max_completion_tokens` and bills its hidden
/// reasoning as output (OpenAI's o-series and gpt-5).
pub fn is_reasoning_model(kind: ProviderKind, model: &str) -> bool {
    let model = model.trim().to_ascii_lowercase();
    let model = model.rsplit('/').next().unwrap_or(&model);
    kind == ProviderKind::Openai
        && (["o1", "o3", "o4"].iter().any(|p| model == *p || model.starts_with(&format!("{p}-")))
            // `gpt-5-chat-latest` is the chat model, not a reasoning one.
            || (model.starts_with("gpt-5") && !model.starts_with("gpt-5-chat")))
}

/// A summary's or a list's answer at least and at most, in tokens (a tenth of its text between).
const SHORT_ANSWER_MIN: u64 = 2_048;
const SHORT_ANSWER_MAX: u64 = 12_000;
/// Room a reasoning model gets for its hidden reasoning, at least.
const REASONING_ROOM: u64 = 8_192;

/// How many times its text's tokens a translation into `language` is expected to take: scripts
/// the tokenizer packs less densely than Latin ones take more.
pub fn translation_expansion(language: Option<&str>) -> f64 {
    const DENSE: &[&str] = &[
        "chinese",
        "japanese",
        "korean",
        "thai",
        "hindi",
        "bengali",
        "tamil",
        "telugu",
        "marathi",
        "arabic",
        "persian",
        "farsi",
        "urdu",
        "hebrew",
        "greek",
        "russian",
        "ukrainian",
        "bulgarian",
        "serbian",
        "georgian",
        "armenian",
        "amharic",
        "burmese",
        "khmer",
        "vietnamese",
        "中文",
        "日本語",
        "한국어",
    ];
    // Conservative starts, until the provider's own is learned (`ratio::TokenRatio`): English
    // into German or French writes about a third more tokens.
    let language = language.unwrap_or("english").to_lowercase();
    if DENSE.iter().any(|d| language.contains(d)) {
        1.8
    } else {
        1.4
    }
}

/// The answer a call is expected to write, in tokens (what the budget reserves until its usage
/// is known): a translation's is its text's tokens grown by the language; a summary's a tenth
/// of its text, within bounds.
pub fn expected_answer_tokens(preset: Preset, growth: f64, input_tokens: u64) -> u64 {
    if preset.answer_grows_with_input() {
        (input_tokens as f64 * growth.clamp(0.1, 10.0)).ceil() as u64
    } else {
        (input_tokens / 10).clamp(SHORT_ANSWER_MIN, SHORT_ANSWER_MAX)
    }
}

/// The `max_tokens` (or `max_completion_tokens`) a call asks for: the expected answer with a
/// quarter more and 512 tokens of room, plus a reasoning model's room for its reasoning, never
/// more than the model's maximum. Asking for the model's maximum on every call counts against
/// OpenAI's tokens-per-minute limit at request time, and reserves what is never written.
pub fn answer_tokens_to_ask(preset: Preset, growth: f64, input_tokens: u64, model_max: u64, reasoning: bool) -> u64 {
    let visible = expected_answer_tokens(preset, growth, input_tokens);
    let room = visible.saturating_add(visible / 4).saturating_add(512);
    let reasoning_room = if reasoning { visible.max(REASONING_ROOM) } else { 0 };
    room.saturating_add(reasoning_room).min(model_max).max(1)
}

/// Whether an answer's text is no answer at all (empty, or only white space).
pub fn is_empty_answer(text: &str) -> bool {
    text.chars().all(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_the_documented_complete_reasons_are_whole() {
        assert_eq!(anthropic_stop(Some("end_turn")), Stop::Whole);
        assert_eq!(anthropic_stop(Some("stop_sequence")), Stop::Whole);
        assert_eq!(anthropic_stop(Some("max_tokens")), Stop::Cut);
        assert_eq!(anthropic_stop(Some("refusal")), Stop::Declined);
        assert_eq!(anthropic_stop(Some("pause_turn")), Stop::Unknown("pause_turn".into()));
        assert_eq!(anthropic_stop(Some("tool_use")), Stop::Unknown("tool_use".into()));
        assert_eq!(anthropic_stop(None), Stop::Unknown("none".into()));
        assert_eq!(openai_stop(Some("stop")), Stop::Whole);
        assert_eq!(openai_stop(Some("length")), Stop::Cut);
        assert_eq!(openai_stop(Some("content_filter")), Stop::Declined);
        assert_eq!(openai_stop(Some("tool_calls")), Stop::Unknown("tool_calls".into()));
        assert_eq!(openai_stop(Some("end_turn")), Stop::Unknown("end_turn".into()), "each vendor its own words");
        assert_eq!(openai_stop(Some("<b>x\ny</b>")), Stop::Unknown("bxyb".into()));
    }

    #[test]
    fn too_long_is_read_from_both_vendors_bodies_with_their_counts() {
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210,345 tokens > 200000 maximum"}}"#;
        assert_eq!(prompt_too_long(400, anthropic), Some(TooLong { counted: Some(210_345), maximum: Some(200_000) }));
        let openai = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(prompt_too_long(400, openai), Some(TooLong { counted: Some(130_512), maximum: Some(128_000) }));
        let older = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 8500 tokens (500 in the messages, 8000 in the completion).","code":"context_length_exceeded"}}"#;
        assert_eq!(prompt_too_long(400, older), Some(TooLong { counted: Some(500), maximum: Some(8_192) }));
        assert_eq!(
            prompt_too_long(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            Some(TooLong { counted: None, maximum: None })
        );
        assert_eq!(
            prompt_too_long(400, r#"{"error":{"message":"messages: text content blocks must be non-empty"}}"#),
            None
        );
        assert_eq!(prompt_too_long(429, anthropic), None, "only a refused request");
        let with_ask = r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188000 + 15512 > 200000, decrease input length or `max_tokens` and try again"}}"#;
        assert_eq!(prompt_too_long(400, with_ask), Some(TooLong { counted: Some(188_000), maximum: Some(200_000) }));
        // A window that cuts a multi-byte character reads as well.
        let accented = "{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"maximum context length is éééééééééééééééééééé 8192 ééé 12 in the messages\"}}";
        assert_eq!(prompt_too_long(400, accented).map(|t| t.counted), Some(Some(12)));
    }

    #[test]
    fn reset_headers_say_how_long_a_spent_limit_waits() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut h = HeaderMap::new();
        h.insert("anthropic-ratelimit-input-tokens-remaining", "0".parse().unwrap());
        h.insert("anthropic-ratelimit-input-tokens-reset", "2027-01-15T08:00:12Z".parse().unwrap());
        h.insert("anthropic-ratelimit-requests-remaining", "40".parse().unwrap());
        h.insert("anthropic-ratelimit-requests-reset", "2027-01-15T09:00:00Z".parse().unwrap());
        // 1_800_000_000 is 2027-01-15T08:00:00Z: the spent limit's reset, not the other's.
        assert_eq!(reset_wait(&h, now), Some(Duration::from_secs(12)));
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining-tokens", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-tokens", "1m30.5s".parse().unwrap());
        h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "20ms".parse().unwrap());
        assert_eq!(reset_wait(&h, now), Some(Duration::from_millis(90_500)));
        h.insert("x-ratelimit-reset-tokens", "99999999h".parse().unwrap());
        assert_eq!(reset_wait(&h, now), Some(MAX_RETRY_AFTER), "capped");
        assert_eq!(reset_wait(&HeaderMap::new(), now), None);
        for garbage in ["", "5", "1x", "m", "-1s", "1..2s"] {
            assert_eq!(go_duration(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn reasoning_models_are_known_by_family() {
        for m in ["o1", "o1-mini", "o3-2025-04-16", "o4-mini", "gpt-5", "gpt-5-mini", "openai/gpt-5-nano"] {
            assert!(is_reasoning_model(ProviderKind::Openai, m), "{m}");
        }
        for m in ["gpt-4o", "gpt-4.1-mini", "llama3", "o10-custom", "octo", "gpt-5-chat-latest"] {
            assert!(!is_reasoning_model(ProviderKind::Openai, m), "{m}");
        }
        assert!(!is_reasoning_model(ProviderKind::Anthropic, "o3"));
    }

    #[test]
    fn a_call_asks_for_its_answer_with_room_not_the_model_maximum() {
        // A translation's 8,000-token part into French: 8,000 × 1.2 with a quarter more.
        assert_eq!(answer_tokens_to_ask(Preset::Translate, 1.2, 8_000, 64_000, false), 12_512);
        assert_eq!(answer_tokens_to_ask(Preset::Translate, 1.6, 8_000, 64_000, false), 16_512);
        // A summary of a 180K-token part: its tenth, bounded.
        assert_eq!(answer_tokens_to_ask(Preset::Summarize, 1.0, 180_000, 64_000, false), 15_512);
        assert_eq!(answer_tokens_to_ask(Preset::Summarize, 1.0, 300, 64_000, false), 3_072);
        // A reasoning model gets room to reason; nothing is over the model's maximum.
        assert_eq!(answer_tokens_to_ask(Preset::Summarize, 1.0, 300, 128_000, true), 3_072 + 8_192);
        assert_eq!(answer_tokens_to_ask(Preset::Translate, 1.2, 100_000, 8_192, false), 8_192);
    }

    proptest! {
        #[test]
        fn the_ask_is_within_the_model_and_over_the_expected_answer(input in 0u64..10_000_000, max in 1u64..200_000, reasoning: bool) {
            for preset in [Preset::Translate, Preset::Summarize, Preset::KeyFacts] {
                let ask = answer_tokens_to_ask(preset, 1.4, input, max, reasoning);
                prop_assert!(ask >= 1 && ask <= max);
                prop_assert!(ask >= expected_answer_tokens(preset, 1.4, input).min(max));
            }
        }

        #[test]
        fn reading_hostile_bodies_never_panics(body in ".{0,300}", status in 0u16..600) {
            let _ = prompt_too_long(status, &body);
            let _ = prompt_too_long(400, &format!("prompt is too long: {body}"));
            let _ = prompt_too_long(400, &format!("maximum context length is {body} in the messages {body}"));
            let _ = go_duration(&body);
        }
    }
}
