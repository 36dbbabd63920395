//! Contract tests: the HTTP providers against the vendors' own documented answers, replayed
//! verbatim by the fake provider (a real HTTP server on loopback), whole and streamed. Each
//! case is one way a real provider answers (issue 56): cut, refusal, too long, overloaded,
//! quota, rate limit with its headers, reasoning usage, cached usage, an unknown stop reason,
//! an empty answer, a stream that stalls or breaks off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::documents::providers::{self, OnWritten, Provider, ProviderConfig, ProviderKind, ProviderOutput, Task};
use engine::queue::policy::retry::ErrorClass;
use engine::queue::JobError;
use engine::Preset;
use fakeprovider::{FakeProvider, Reply};

fn task() -> Task {
    Task {
        preset: Preset::Translate,
        language: Some("French".into()),
        text: "The contract binds both parties.".into(),
        pages: None,
        part: None,
        prompt_tokens: None,
        answer_tokens: Some(700),
        on_written: None,
        guidance: Default::default(),
        finds_terms: false,
    }
}

fn provider(kind: ProviderKind, fake: &FakeProvider, model: &str, stream: bool) -> Arc<dyn Provider> {
    // OpenAI's base URL ends in `/v1`; a stall is given up after 0.8 s, long before the call's
    // own timeout.
    let base_url = if kind == ProviderKind::Openai { format!("{}/v1", fake.base_url()) } else { fake.base_url() };
    let api_key = Some("test-key".to_string());
    let stall_timeout = Duration::from_millis(800);
    providers::build(&ProviderConfig {
        model: model.into(),
        max_tokens: 64_000,
        stream,
        ..ProviderConfig { kind, base_url, api_key, stall_timeout, ..Default::default() }
    })
}

fn raw(status: u16, headers: &[(&str, &str)], body: &str) -> Reply {
    Reply::Raw {
        status,
        headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        body: body.to_string(),
    }
}

fn json(body: &str) -> Reply {
    raw(200, &[("content-type", "application/json")], body)
}

/// A stream of documented events, `gap_ms` apart.
fn events(events: &[&str], gap_ms: u64) -> Reply {
    Reply::RawStream { events: events.iter().map(|e| format!("{e}\n\n")).collect(), gap_ms, stall_ms: 0 }
}

async fn run(p: &Arc<dyn Provider>, fake: &FakeProvider, reply: Reply) -> Result<ProviderOutput, JobError> {
    fake.push([reply]);
    p.run(&task()).await
}

// Anthropic's Messages API, as documented.

const MESSAGE: &str = r#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Le contrat lie les deux parties."}],"stop_reason":"STOP","stop_sequence":null,"usage":{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#;

fn message(stop: &str, text: &str) -> Reply {
    let text = serde_json::to_string(text).unwrap();
    json(&MESSAGE.replace("STOP", stop).replace("\"Le contrat lie les deux parties.\"", &text))
}

fn message_events(stop: &str, deltas: &[&str]) -> Vec<String> {
    let mut out = vec![
        r#"event: message_start
data: {"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1100, "output_tokens": 1}}}"#.to_string(),
        r#"event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}"#.to_string(),
        "event: ping\ndata: {\"type\": \"ping\"}".to_string(),
    ];
    for d in deltas {
        out.push(format!(
            "event: content_block_delta\ndata: {{\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {{\"type\": \"text_delta\", \"text\": \"{d}\"}}}}"
        ));
    }
    out.push("event: content_block_stop\ndata: {\"type\": \"content_block_stop\", \"index\": 0}".to_string());
    out.push(format!(
        "event: message_delta\ndata: {{\"type\": \"message_delta\", \"delta\": {{\"stop_reason\": \"{stop}\", \"stop_sequence\":null}}, \"usage\": {{\"output_tokens\": 15}}}}"
    ));
    out.push("event: message_stop\ndata: {\"type\": \"message_stop\"}".to_string());
    out
}

fn stream_of(events: Vec<String>, gap_ms: u64, stall_ms: u64) -> Reply {
    Reply::RawStream { events: events.into_iter().map(|e| format!("{e}\n\n")).collect(), gap_ms, stall_ms }
}

#[tokio::test]
async fn anthropic_whole_answers_are_judged_by_their_documented_stop_reasons() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Anthropic, &fake, "claude-sonnet-4-5", false);
    let ok = run(&p, &fake, message("end_turn", "Le contrat lie les deux parties.")).await.unwrap();
    assert_eq!(
        (ok.text.as_str(), ok.cut, ok.input_tokens, ok.output_tokens),
        ("Le contrat lie les deux parties.", false, Some(2095), Some(503))
    );
    assert!(run(&p, &fake, message("stop_sequence", "x")).await.is_ok());
    assert!(run(&p, &fake, message("max_tokens", "Le contrat")).await.unwrap().cut, "cut");
    let refused = run(&p, &fake, message("refusal", "")).await.unwrap_err();
    assert_eq!(refused.class, ErrorClass::InvalidInput, "a refusal is the document's");
    // Answers not kept were billed all the same: each carries the usage the provider gave.
    assert_eq!(refused.usage, Some((2095, 503)), "a refusal's usage");
    for reason in ["pause_turn", "tool_use", "a_reason_added_next_year"] {
        let e = run(&p, &fake, message(reason, "Le contrat lie")).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Unfinished, "{reason}");
        assert!(e.message.contains(reason), "{}", e.message);
        assert_eq!(e.usage, Some((2095, 503)), "{reason}: its usage");
    }
    for empty in ["", "  \n\t "] {
        let e = run(&p, &fake, message("end_turn", empty)).await.unwrap_err();
        assert_eq!(
            (e.class, e.message.as_str()),
            (ErrorClass::Unfinished, "the provider's answer was empty, so it was not kept")
        );
        assert_eq!(e.usage, Some((2095, 503)), "an empty answer's usage");
    }
}

#[tokio::test]
async fn anthropic_errors_as_documented_with_their_headers() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Anthropic, &fake, "claude-sonnet-4-5", true);
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(run(&p, &fake, raw(529, &[], overloaded)).await.unwrap_err().class, ErrorClass::Overloaded);
    // A rate limit: `retry-after`, and the spent limit's reset (RFC 3339) when it is missing.
    let limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 40,000 input tokens per minute."}}"#;
    let e = run(
        &p,
        &fake,
        raw(429, &[("retry-after", "13"), ("anthropic-ratelimit-input-tokens-remaining", "0")], limited),
    )
    .await
    .unwrap_err();
    assert_eq!((e.class, e.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(13))));
    let reset = (chrono::Utc::now() + chrono::Duration::seconds(20)).to_rfc3339();
    let e = run(
        &p,
        &fake,
        raw(
            429,
            &[("anthropic-ratelimit-input-tokens-remaining", "0"), ("anthropic-ratelimit-input-tokens-reset", &reset)],
            limited,
        ),
    )
    .await
    .unwrap_err();
    let wait = e.retry_after.expect("the reset header's wait");
    assert!(wait > Duration::from_secs(15) && wait <= Duration::from_secs(20), "{wait:?}");
    // Too long: the provider's own count comes with it.
    let too_long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208437 tokens > 200000 maximum"}}"#;
    let e = run(&p, &fake, raw(400, &[], too_long)).await.unwrap_err();
    assert_eq!((e.class, e.provider_counted_tokens), (ErrorClass::TooLong, Some(208_437)));
    // No credit left: the operator's problem, nobody's failure.
    let broke = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
    assert_eq!(run(&p, &fake, raw(400, &[], broke)).await.unwrap_err().class, ErrorClass::QuotaExhausted);
    let filtered = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"}}"#;
    assert_eq!(run(&p, &fake, raw(400, &[], filtered)).await.unwrap_err().class, ErrorClass::InvalidInput);
}

#[tokio::test]
async fn anthropic_streams_are_read_to_their_end_with_cached_usage_and_progress() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Anthropic, &fake, "claude-sonnet-4-5", true);
    let written = Arc::new(AtomicU64::new(0));
    let seen = written.clone();
    let t = Task {
        guidance: Default::default(),
        finds_terms: false,
        on_written: Some(OnWritten(Arc::new(move |n| {
            seen.fetch_max(n, Ordering::Relaxed);
        }))),
        ..task()
    };
    fake.push([stream_of(message_events("end_turn", &["Le contrat ", "lie les deux ", "parties."]), 20, 0)]);
    let ok = p.run(&t).await.unwrap();
    assert_eq!(ok.text, "Le contrat lie les deux parties.");
    // Input: the fresh tokens and the cache's, which Anthropic counts apart.
    assert_eq!((ok.input_tokens, ok.cached_input_tokens, ok.output_tokens), (Some(2300), Some(1100), Some(15)));
    assert!(written.load(Ordering::Relaxed) >= 7, "progress was told as the answer came");
    // What was asked: the size the task asked for, the instruction marked cacheable, a stream.
    let sent = fake.last_request().unwrap();
    assert_eq!((sent["max_tokens"].as_u64(), sent["stream"].as_bool()), (Some(700), Some(true)));
    assert_eq!(sent["messages"][0]["content"][0]["cache_control"]["type"], "ephemeral");
    assert!(sent["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Translate the document below into French"));
    assert!(sent["messages"][0]["content"][1]["text"].as_str().unwrap().contains("The contract binds both parties."));

    for (stop, class) in [
        ("pause_turn", Some(ErrorClass::Unfinished)),
        ("refusal", Some(ErrorClass::InvalidInput)),
        ("max_tokens", None),
    ] {
        fake.push([stream_of(message_events(stop, &["Le contrat"]), 0, 0)]);
        match (p.run(&task()).await, class) {
            (Err(e), Some(class)) => assert_eq!(e.class, class, "{stop}"),
            (Ok(out), None) => assert!(out.cut, "{stop}"),
            (other, _) => panic!("{stop}: {other:?}"),
        }
    }
    fake.push([stream_of(message_events("end_turn", &[]), 0, 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::Unfinished, "an empty stream is no answer");
    // An error event mid-answer (a 200 whose stream then fails), as documented.
    let mut broken = message_events("end_turn", &["Le contrat"]);
    broken.truncate(4);
    broken.push(
        r#"event: error
data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#
            .to_string(),
    );
    fake.push([stream_of(broken, 0, 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::Overloaded);
}

#[tokio::test]
async fn a_stream_that_stalls_is_given_up_at_the_stall_timeout_and_one_that_breaks_off_is_no_answer() {
    for kind in [ProviderKind::Anthropic, ProviderKind::Openai] {
        let fake = FakeProvider::start().await;
        let p = provider(kind, &fake, "m", true);
        // Two events, then nothing for 5 s: the call gives up after 0.8 s of silence, not
        // at its whole timeout (10 s).
        let start = match kind {
            ProviderKind::Anthropic => message_events("end_turn", &["Le"])[..4].to_vec(),
            _ => completion_events("stop", &["Le"], "")[..2].to_vec(),
        };
        let started = Instant::now();
        fake.push([stream_of(start.clone(), 10, 5_000)]);
        let e = p.run(&task()).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Timeout, "{kind:?}: {}", e.message);
        assert!(e.message.contains("wrote nothing for"), "{}", e.message);
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        // Begun, so billed: Anthropic said its prompt's count at the start (cache included);
        // OpenAI says nothing before its end, so only what was written ("Le": one token).
        let begun = match kind {
            ProviderKind::Anthropic => (2_300, 1),
            _ => (0, 1),
        };
        assert_eq!(e.usage, Some(begun), "{kind:?}: what the stalled call was billed");
        // The same start, then the connection ends without the stream's end.
        fake.push([stream_of(start, 0, 0)]);
        let e = p.run(&task()).await.unwrap_err();
        assert_eq!(
            (e.class, e.message.as_str()),
            (ErrorClass::Connection, "the provider's answer broke off before its end")
        );
        assert_eq!(e.usage, Some(begun), "{kind:?}: what the broken call was billed");
        // A connection that ends before anything came: nothing known to be billed.
        fake.push([stream_of(Vec::new(), 0, 0)]);
        assert_eq!(p.run(&task()).await.unwrap_err().usage, None, "{kind:?}");
    }
}

// OpenAI's chat completions, as documented.

const COMPLETION: &str = r#"{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":CONTENT,"refusal":REFUSAL,"annotations":[]},"logprobs":null,"finish_reason":"STOP"}],"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":REASONING,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}"#;

fn completion(stop: &str, content: Option<&str>, refusal: Option<&str>, reasoning: u64) -> Reply {
    let quoted = |v: Option<&str>| v.map_or("null".to_string(), |t| serde_json::to_string(t).unwrap());
    json(
        &COMPLETION
            .replace("STOP", stop)
            .replace("CONTENT", &quoted(content))
            .replace("REFUSAL", &quoted(refusal))
            .replace("REASONING", &reasoning.to_string()),
    )
}

fn completion_events(stop: &str, deltas: &[&str], usage: &str) -> Vec<String> {
    let chunk = |delta: &str, finish: &str| {
        format!(
            r#"data: {{"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
        )
    };
    let mut out = vec![chunk(r#"{"role":"assistant","content":""}"#, "null")];
    for d in deltas {
        out.push(chunk(&format!(r#"{{"content":"{d}"}}"#), "null"));
    }
    out.push(chunk("{}", &format!("\"{stop}\"")));
    if !usage.is_empty() {
        out.push(format!(
            r#"data: {{"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{usage}}}"#
        ));
    }
    out.push("data: [DONE]".to_string());
    out
}

#[tokio::test]
async fn openai_whole_answers_are_judged_by_their_documented_finish_reasons() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Openai, &fake, "gpt-4o", false);
    let ok = run(&p, &fake, completion("stop", Some("Le contrat lie les deux parties."), None, 0)).await.unwrap();
    assert_eq!((ok.text.as_str(), ok.cut), ("Le contrat lie les deux parties.", false));
    assert_eq!((ok.input_tokens, ok.cached_input_tokens, ok.output_tokens), (Some(1117), Some(1024), Some(46)));
    assert!(run(&p, &fake, completion("length", Some("Le contrat"), None, 0)).await.unwrap().cut);
    assert_eq!(
        run(&p, &fake, completion("content_filter", Some(""), None, 0)).await.unwrap_err().class,
        ErrorClass::InvalidInput
    );
    // A refusal comes as `refusal`, its finish reason still `stop`.
    let e = run(&p, &fake, completion("stop", None, Some("I'm sorry, I cannot assist with that request."), 0))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::InvalidInput);
    for reason in ["tool_calls", "function_call", "eos"] {
        assert_eq!(
            run(&p, &fake, completion(reason, Some("Le"), None, 0)).await.unwrap_err().class,
            ErrorClass::Unfinished,
            "{reason}"
        );
    }
    for empty in [None, Some(""), Some("\n\n")] {
        assert_eq!(
            run(&p, &fake, completion("stop", empty, None, 0)).await.unwrap_err().class,
            ErrorClass::Unfinished,
            "{empty:?}"
        );
    }
    let sent = fake.last_request().unwrap();
    assert_eq!((sent["max_tokens"].as_u64(), sent.get("max_completion_tokens")), (Some(700), None));
}

#[tokio::test]
async fn openai_errors_as_documented_with_their_headers() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Openai, &fake, "gpt-4o", true);
    let quota = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let e = run(&p, &fake, raw(429, &[], quota)).await.unwrap_err();
    assert_eq!(
        (e.class, e.message.as_str()),
        (ErrorClass::QuotaExhausted, "the provider's quota or spend limit is reached")
    );
    // A rate limit without `retry-after`: the spent limit's reset says how long.
    let limited = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 29500, Requested 1200. Please try again in 1.4s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    let headers = [
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "1m30s"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-reset-requests", "120ms"),
    ];
    let e = run(&p, &fake, raw(429, &headers, limited)).await.unwrap_err();
    assert_eq!((e.class, e.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(90))));
    let too_long = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let e = run(&p, &fake, raw(400, &[], too_long)).await.unwrap_err();
    assert_eq!((e.class, e.provider_counted_tokens), (ErrorClass::TooLong, Some(130_512)));
    // A 402 is a spent balance whatever its words (OpenRouter's "Insufficient credits").
    let broke =
        r#"{"error":{"message":"Insufficient credits. Add more using https://openrouter.ai/credits","code":402}}"#;
    assert_eq!(run(&p, &fake, raw(402, &[], broke)).await.unwrap_err().class, ErrorClass::QuotaExhausted);
    let policy = r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}"#;
    assert_eq!(run(&p, &fake, raw(400, &[], policy)).await.unwrap_err().class, ErrorClass::InvalidInput);
    let server = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
    assert_eq!(run(&p, &fake, raw(500, &[], server)).await.unwrap_err().class, ErrorClass::ServerError);
}

#[tokio::test]
async fn openai_streams_carry_the_usage_in_their_last_chunk() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Openai, &fake, "gpt-4o-mini", true);
    let usage = r#"{"prompt_tokens":1500,"completion_tokens":9,"total_tokens":1509,"prompt_tokens_details":{"cached_tokens":1280},"completion_tokens_details":{"reasoning_tokens":0}}"#;
    fake.push([stream_of(completion_events("stop", &["Le contrat ", "lie les deux parties."], usage), 10, 0)]);
    let ok = p.run(&task()).await.unwrap();
    assert_eq!(ok.text, "Le contrat lie les deux parties.");
    assert_eq!((ok.input_tokens, ok.cached_input_tokens, ok.output_tokens), (Some(1500), Some(1280), Some(9)));
    let sent = fake.last_request().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true, "the usage is asked for");
    fake.push([stream_of(completion_events("length", &["Le"], usage), 0, 0)]);
    assert!(p.run(&task()).await.unwrap().cut);
    fake.push([stream_of(completion_events("tool_calls", &["Le"], usage), 0, 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::Unfinished);
    fake.push([stream_of(completion_events("stop", &[], usage), 0, 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::Unfinished, "an empty stream is no answer");
    let mut refusal = completion_events("stop", &[], usage);
    refusal.insert(1, r#"data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"refusal":"I'm sorry, I can't help with that."},"logprobs":null,"finish_reason":null}]}"#.to_string());
    fake.push([stream_of(refusal, 0, 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::InvalidInput);
}

#[tokio::test]
async fn reasoning_models_are_asked_with_max_completion_tokens_and_their_reasoning_is_counted() {
    let fake = FakeProvider::start().await;
    for model in ["o3-mini", "gpt-5", "o1"] {
        let p = provider(ProviderKind::Openai, &fake, model, false);
        assert!(p.reasons(), "{model}");
        let ok = run(&p, &fake, completion("stop", Some("Le contrat."), None, 1_024)).await.unwrap();
        assert_eq!((ok.output_tokens, ok.reasoning_tokens), (Some(46), Some(1_024)), "reasoning is billed as output");
        assert_eq!(ok.data["reasoning_tokens"], 1_024);
        let sent = fake.last_request().unwrap();
        assert_eq!((sent["max_completion_tokens"].as_u64(), sent.get("max_tokens")), (Some(700), None), "{model}");
    }
    // A reasoning model that spent its whole answer thinking: cut, not an empty success.
    let p = provider(ProviderKind::Openai, &fake, "o3", false);
    assert!(run(&p, &fake, completion("length", Some(""), None, 700)).await.unwrap().cut);
    let plain = provider(ProviderKind::Openai, &fake, "gpt-4o", false);
    assert!(!plain.reasons());
}

#[tokio::test]
async fn hostile_streams_are_bounded() {
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Openai, &fake, "gpt-4o", true);
    // One endless line: refused, never held whole.
    let line = format!("data: {}", "x".repeat(2 << 20));
    fake.push([Reply::RawStream { events: vec![line], gap_ms: 0, stall_ms: 0 }]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::ServerError);
    // Text past the answer's bound, in small events.
    let piece = "y".repeat(60_000);
    let many: Vec<String> = (0..200)
        .map(|_| {
            format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{piece}"}},"finish_reason":null}}]}}"#)
                + "\n\n"
        })
        .collect();
    fake.push([Reply::RawStream { events: many, gap_ms: 0, stall_ms: 0 }]);
    let e = p.run(&task()).await.unwrap_err();
    assert_eq!((e.class, e.message.as_str()), (ErrorClass::Unfinished, "the provider's answer was too large"));
    // A long answer in one-token events, as OpenAI streams: its framing is many times its text
    // (10 MB on the wire for 40K characters), and it is read whole; an `"error": null` is none.
    let chunk = r#"data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","error":null,"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}"#;
    let mut tokens: Vec<String> = (0..40_000).map(|_| format!("{chunk}\n\n")).collect();
    tokens.extend(completion_events("stop", &[], "").into_iter().skip(1).map(|e| format!("{e}\n\n")));
    fake.push([Reply::RawStream { events: tokens, gap_ms: 0, stall_ms: 0 }]);
    assert_eq!(p.run(&task()).await.unwrap().text.len(), 40_000);
    // Garbage instead of JSON.
    fake.push([events(&["data: {not json"], 0)]);
    assert_eq!(p.run(&task()).await.unwrap_err().class, ErrorClass::ServerError);
}

// The batch APIs (issue 60's economy lane builds on them): each vendor's documented shape,
// each result checked exactly as an interactive answer is.

fn batch_provider(kind: ProviderKind, fake: &FakeProvider) -> providers::HttpProvider {
    let base_url = if kind == ProviderKind::Openai { format!("{}/v1", fake.base_url()) } else { fake.base_url() };
    providers::HttpProvider::new(&ProviderConfig {
        kind,
        base_url,
        api_key: Some("test-key".into()),
        model: "m".into(),
        max_tokens: 64_000,
        ..Default::default()
    })
}

fn clause(n: usize) -> Task {
    Task { text: format!("Clause number {n} binds both parties."), ..task() }
}

async fn until_ended(http: &providers::HttpProvider, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while http.batch_state(id).await.unwrap() != providers::batch::BatchState::Ended {
        assert!(Instant::now() < deadline, "the batch ends");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_batch_goes_in_polled_and_read_in_each_vendors_shape_and_each_result_is_checked_as_an_answer_is() {
    for kind in [ProviderKind::Anthropic, ProviderKind::Openai] {
        let fake = FakeProvider::start().await;
        let (whole, cut) =
            if kind == ProviderKind::Anthropic { ("end_turn", "max_tokens") } else { ("stop", "length") };
        let finished = |text: &str, stop: &str| Reply::Finished {
            text: text.into(),
            stop_reason: stop.into(),
            input_tokens: 12,
            output_tokens: 7,
        };
        fake.push_matching("Clause number 1 ", [finished("La clause 1 lie les parties.", whole)]);
        fake.push_matching("Clause number 2 ", [Reply::ServerError]);
        fake.push_matching("Clause number 3 ", [Reply::ContentPolicy { delay_ms: 0 }]);
        fake.push_matching("Clause number 4 ", [finished("La clause 4", cut)]);
        fake.push_matching("Clause number 5 ", [finished("  ", whole)]);
        fake.push_matching("Clause number 6 ", [finished("La clause 6", "tool_use_but_not_really")]);
        let http = batch_provider(kind, &fake);
        let tasks: Vec<Task> = (1..=6).map(clause).collect();
        let requests: Vec<providers::batch::BatchRequest> = tasks
            .iter()
            .enumerate()
            .map(|(i, task)| providers::batch::BatchRequest { custom_id: format!("job-part-{}", i + 1), task })
            .collect();
        let id = http.submit_batch(&requests).await.unwrap();
        assert!(matches!(http.batch_state(&id).await.unwrap(), providers::batch::BatchState::Running { total: 6, .. }));
        until_ended(&http, &id).await;
        let asked: std::collections::HashMap<String, u32> = (1..=7).map(|i| (format!("job-part-{i}"), 700)).collect();
        let results = http.batch_results(&id, &asked).await.unwrap();
        let class = |n: usize| results[&format!("job-part-{n}")].as_ref().err().map(|e| e.class);
        let answer = results[&"job-part-1".to_string()].as_ref().unwrap();
        assert_eq!(
            (answer.text.as_str(), answer.input_tokens, answer.cut),
            ("La clause 1 lie les parties.", Some(12), false)
        );
        assert_eq!(class(2), Some(ErrorClass::ServerError), "{kind:?}: an error inside the batch keeps its class");
        assert_eq!(class(3), Some(ErrorClass::InvalidInput), "{kind:?}: a refusal is the document's");
        assert!(results[&"job-part-4".to_string()].as_ref().unwrap().cut, "{kind:?}: a cut answer is marked cut");
        assert_eq!(class(5), Some(ErrorClass::Unfinished), "{kind:?}: an empty answer is never a success");
        assert_eq!(class(6), Some(ErrorClass::Unfinished), "{kind:?}: an unknown stop reason is never a success");
        assert_eq!(class(7), Some(ErrorClass::Unfinished), "{kind:?}: a request the results leave out is unfinished");
        assert_eq!((fake.batch_requests(), fake.calls()), (6, 6), "{kind:?}: one batch, each request answered once");
    }
}

#[tokio::test]
async fn a_batch_past_its_window_expires_and_a_canceled_one_answers_nothing_more() {
    for kind in [ProviderKind::Anthropic, ProviderKind::Openai] {
        let fake = FakeProvider::start().await;
        let http = batch_provider(kind, &fake);
        let tasks: Vec<Task> = (1..=3).map(clause).collect();
        let requests: Vec<providers::batch::BatchRequest> = tasks
            .iter()
            .enumerate()
            .map(|(i, task)| providers::batch::BatchRequest { custom_id: format!("r{i}"), task })
            .collect();
        let asked: std::collections::HashMap<String, u32> = (0..3).map(|i| (format!("r{i}"), 700)).collect();

        // "24 hours" are half a second here; the provider takes a second.
        fake.batch_timing(fakeprovider::BatchTiming {
            delay: Duration::from_secs(1),
            window: Duration::from_millis(500),
        });
        let id = http.submit_batch(&requests).await.unwrap();
        until_ended(&http, &id).await;
        let results = http.batch_results(&id, &asked).await.unwrap();
        assert!(
            results.values().all(|r| r.as_ref().err().map(|e| e.class) == Some(ErrorClass::Timeout)),
            "{kind:?}: {results:?}"
        );

        fake.batch_timing(fakeprovider::BatchTiming {
            delay: Duration::from_millis(400),
            window: Duration::from_secs(30),
        });
        let id = http.submit_batch(&requests).await.unwrap();
        http.cancel_batch(&id).await.unwrap();
        until_ended(&http, &id).await;
        let results = http.batch_results(&id, &asked).await.unwrap();
        assert!(
            results.values().all(|r| r.as_ref().err().map(|e| e.class) == Some(ErrorClass::Overloaded)),
            "{kind:?}: {results:?}"
        );
        assert_eq!(fake.calls(), 0, "{kind:?}: nothing was answered");
        // A request id the vendors would refuse is refused before anything is sent.
        let bad = [providers::batch::BatchRequest { custom_id: "not ok/../x".into(), task: &tasks[0] }];
        assert_eq!(http.submit_batch(&bad).await.unwrap_err().class, ErrorClass::Rejected);
    }
}

#[tokio::test]
async fn batch_results_past_what_was_asked_are_refused_within_their_bounds() {
    let fake = FakeProvider::start().await;
    let http = batch_provider(ProviderKind::Anthropic, &fake);
    let task = clause(1);
    let id =
        http.submit_batch(&[providers::batch::BatchRequest { custom_id: "r0".into(), task: &task }]).await.unwrap();
    until_ended(&http, &id).await;
    let asked: std::collections::HashMap<String, u32> = [("r0".to_string(), 700)].into();
    let line =
        |custom_id: &str| serde_json::json!({ "custom_id": custom_id, "result": { "type": "expired" } }).to_string();
    // Far more results than requests: refused, not read to the end.
    fake.batch_results_instead((0..10_000).map(|i| line(&format!("x{i}"))).collect::<Vec<_>>().join("\n"));
    let error = http.batch_results(&id, &asked).await.unwrap_err();
    assert!(error.message.contains("more results than requests"), "{}", error.message);
    // One line longer than any answer: refused.
    fake.batch_results_instead(format!("{{\"custom_id\": \"r0\", \"pad\": \"{}\"}}", "a".repeat(9 << 20)));
    let error = http.batch_results(&id, &asked).await.unwrap_err();
    assert!(error.message.contains("longer than any answer"), "{}", error.message);
    // Garbage, another request's id, and ours twice: only ours, the first, is kept.
    let ours = serde_json::json!({ "custom_id": "r0", "result": { "type": "canceled" } }).to_string();
    fake.batch_results_instead(format!("not json\n{}\n{ours}\n{}", line("someone-else"), line("r0")));
    let results = http.batch_results(&id, &asked).await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results["r0"].as_ref().unwrap_err().class, ErrorClass::Overloaded, "the first of ours: canceled");
}
