//! Documents longer than one provider call, done in parts through the queue: each part its
//! own claim, stored when it ends, retried on its own; the job stays one job (one debit, at
//! most one refund). Against a real Postgres, the local provider and the fake provider.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::accounts::admission::{self, Admission, AdmissionConfig, Submission};
use engine::accounts::{notices, users, AccountHooks, Role};
use engine::documents::blobs::Blobs;
use engine::documents::economy::{self, EconomyLane};
use engine::documents::processor::DocumentProcessor;
use engine::documents::processor::HoldSettlement;
use engine::documents::providers::deployments::Deployment;
use engine::documents::providers::router::{self, Router};
use engine::documents::providers::routing::RestPolicy;
use engine::documents::providers::{self, ProviderConfig, ProviderKind};
use engine::documents::sandbox::SandboxConfig;
use engine::queue::capacity::{self, Budget, CapacityConfig, ProviderLimits};
use engine::queue::parts::PartStore;
use engine::queue::worker::{work_once, WorkerPool};
use engine::queue::{self, JobState};
use engine::testing::{fast_worker, wait_for, wider_pool, TempBlobs};
use fakeprovider::{FakeProvider, Flaw, HostedModel, Reply};
use sluice_types::capacity::PriceTable;
use sqlx::PgPool;
use uuid::Uuid;

fn docs(name: &str) -> TempBlobs {
    TempBlobs::new(&format!("parts-{name}"))
}

/// A report of `paragraphs` paragraphs of a few sentences each, every one numbered.
fn report(paragraphs: usize) -> String {
    (1..=paragraphs)
        .map(|i| {
            format!(
                "Paragraph {i} opens the section. The contract of section {i} binds both parties until March {}. \
                 Payment of {i}00 EUR is due on signature.\n\n",
                1 + i % 28
            )
        })
        .collect()
}

/// Admit `text` for `user` as a document job with `preset`, priced by the default table; the
/// job's first claim reserves at most `call_tokens`.
async fn submit(pool: &PgPool, docs: &TempBlobs, user: i64, text: &str, preset: &str, call_tokens: u64) -> Uuid {
    submit_in_lane(pool, docs, user, text, preset, call_tokens, false).await
}

/// [`submit`], in the economy lane (at half the price) when `economy`.
async fn submit_in_lane(
    pool: &PgPool,
    docs: &TempBlobs,
    user: i64,
    text: &str,
    preset: &str,
    call_tokens: u64,
    economy: bool,
) -> Uuid {
    let key = Blobs::new_key();
    docs.blobs.put(&key, text.as_bytes().to_vec().into()).await.unwrap();
    let tokens =
        sluice_types::capacity::estimate_input_tokens(sluice_types::capacity::SizeKind::Text, text.len() as u64);
    let payload = serde_json::json!({
        "document": { "key": key, "type": "plain_text", "sha256": key, "size": text.len(), "name": "report.txt" },
        "preset": preset,
        "language": "French",
        "economy": economy,
    });
    let price = PriceTable::default().price(tokens);
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: if economy { HALF.price(price) } else { price },
        est_input_tokens: tokens.min(call_tokens) as i64,
        user_id: user,
        payload,
        content_key: key.clone(),
        client_key: None,
        fingerprint: key,
    };
    let config = AdmissionConfig { max_attempts: 3, ..AdmissionConfig::default() };
    match admission::submit(pool, &config, &submission).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("refused: {other:?}"),
    }
}

fn processor(
    pool: &PgPool,
    docs: &TempBlobs,
    provider: ProviderConfig,
    context: u64,
    budget: Budget,
) -> DocumentProcessor {
    processor_with(pool, docs, providers::build(&provider), context, budget)
}

fn processor_with(
    pool: &PgPool,
    docs: &TempBlobs,
    provider: Arc<dyn providers::Provider>,
    context: u64,
    budget: Budget,
) -> DocumentProcessor {
    DocumentProcessor {
        blobs: docs.blobs.clone(),
        provider,
        sandbox: Arc::new(SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new())),
        stages: queue::stages::StageLog::new(pool.clone()),
        budget,
        context_tokens: Some(context),
        parts: PartStore::new(pool.clone()),
        max_document_tokens: Some(2_000_000),
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    }
}

fn fake_config(fake: &FakeProvider) -> ProviderConfig {
    ProviderConfig {
        kind: ProviderKind::Anthropic,
        base_url: fake.base_url(),
        api_key: Some("k".into()),
        model: "m".into(),
        max_tokens: 64,
        timeout: Duration::from_secs(10),
        timeout_per_100k_tokens: Duration::ZERO,
        stream: true,
        stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
    }
}

/// Work the queue one step at a time until `job` ends (waiting out retry delays).
async fn drive(pool: &PgPool, processor: &DocumentProcessor, job: Uuid) -> queue::JobView {
    let config = fast_worker("parts", 4);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        work_once(pool, &config, Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
        let view = queue::get(pool, job).await.unwrap();
        if view.state.is_terminal() {
            return view;
        }
        assert!(Instant::now() < deadline, "the job ends: {view:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An input-token limit of `per_min` in buckets of `burst`, told to Sluice (which plans to 95 %
/// of it); the fake allows a tenth more, as a real limit does (its count of a request and
/// Sluice's estimate differ by the prompt's few words).
async fn token_limit(pool: &PgPool, fake: &FakeProvider, per_min: u64, burst: Duration) -> CapacityConfig {
    fake.limit_input_tokens(per_min * 11 / 10, burst);
    let config = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(per_min), ..Default::default() },
        burst,
        output_reserve: 64,
        ..CapacityConfig::default()
    };
    capacity::configure(pool, &config).await.unwrap();
    config
}

async fn ledger_of(pool: &PgPool, job: Uuid) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT kind, amount::int8 FROM ledger WHERE job_id = $1 ORDER BY id")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_summary_too_long_for_one_call_is_mapped_then_reduced_by_the_local_provider(pool: PgPool) {
    let docs = docs("local");
    let user = users::create_user(&pool, "long@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(60);
    let job = submit(&pool, &docs, user.id, &text, "summarize", 600).await;
    let processor = processor(&pool, &docs, ProviderConfig::default(), 600, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Done, "{view:?}");
    let total = view.parts_total.expect("split into parts");
    assert!(total >= 5, "{total} parts");
    assert_eq!(view.parts_done, total);
    let result = view.result.unwrap();
    assert_eq!(result["parts"], total as i64);
    assert!(result["markdown"].as_str().unwrap().contains("Paragraph"), "a summary of the document: {result}");
    // Each part and each combining step was done by exactly one successful attempt.
    let (parts, succeeded): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM job_parts WHERE job_id = $1 AND output IS NOT NULL),
                (SELECT count(*) FROM attempt_history WHERE job_id = $1 AND outcome = 'succeeded')",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(parts >= total as i64 + 1, "every part and every combining step has its answer");
    assert_eq!(succeeded, 1, "one claim did every part, side by side, and combined them");
    let levels: i32 = sqlx::query_scalar("SELECT max(level) FROM job_parts WHERE job_id = $1")
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(levels >= 1, "the parts' summaries were summarised");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "one debit, nothing else");
}

/// A hosted model that answers quickly (the tests are about what comes back), though not so
/// fast that calls made together could not overlap.
fn instant_model() -> HostedModel {
    HostedModel {
        first_token_ms: 40,
        prefill_tokens_per_sec: 1e9,
        output_tokens_per_sec: 1e9,
        ..HostedModel::default()
    }
}

/// The words of a text, without the fake translator's marks and however it was cut in parts.
fn words(text: &str) -> Vec<String> {
    text.replace("[translated]", " ").split_whitespace().map(str::to_string).collect()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translation_under_one_context_is_split_by_what_an_answer_holds_and_comes_back_whole(pool: PgPool) {
    let docs = docs("translate");
    let fake = FakeProvider::start().await;
    fake.behave_like(instant_model());
    let user = users::create_user(&pool, "tr@example.com", "password123", Role::User, 20).await.unwrap();
    // Far under one context (200K), far over one answer (256 tokens): 1.4 % of it would come
    // back from one call.
    let text = report(150);
    let job = submit(&pool, &docs, user.id, &text, "translate", 200_000).await;
    let processor =
        processor(&pool, &docs, ProviderConfig { max_tokens: 256, ..fake_config(&fake) }, 200_000, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Done, "{view:?}");
    let total = view.parts_total.expect("split by the answer's limit") as u64;
    assert!(total >= 10, "{total} parts");
    let model = fake.model_report();
    assert_eq!(model.cut, 0, "no answer was cut: parts are sized by what an answer holds");
    assert_eq!(fake.calls(), total + 1, "one call per part, one to find its key terms, none to join them");
    assert!(model.most_at_once > 1, "parts ran side by side: {model:?}");
    // Its key terms were found once, in its opening, kept on the job, and every part used them.
    assert_eq!(fake.calls_matching("key terms of the document below"), 1);
    let found = view.found_terms.clone().expect("key terms looked for");
    assert!(found.as_array().unwrap().iter().any(|e| e["source"] == "Paragraph"), "{found}");
    // Each of the 150 paragraphs is cut in two parts here: the parts whose text has the term
    // carry it, the others do not.
    assert_eq!(fake.calls_matching(r#""Paragraph" as "Paragraph""#), 150, "the parts whose text has it carry it");
    let result = view.result.unwrap()["markdown"].as_str().unwrap().to_string();
    assert_eq!(words(&result), words(&text), "every word, in order");
    // Once done, the document's text is not kept twice: the parts keep their answers only.
    let kept: Vec<(String, String)> =
        sqlx::query_as("SELECT body, overlap FROM job_parts WHERE job_id = $1 AND level = 0 ORDER BY idx")
            .bind(job)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(kept.iter().all(|(body, overlap)| body.is_empty() && overlap.is_empty()));
    let prompt = fake.last_request().unwrap().to_string();
    assert!(prompt.contains(&format!(" of {total}.")), "the provider is told which part it reads");
    assert!(!prompt.contains("<before>"), "a translation's parts carry no overlap (it would be translated twice)");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "one debit, nothing else");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_cut_translation_keeps_its_whole_paragraphs_and_asks_only_the_rest_again_at_no_cost(pool: PgPool) {
    let docs = docs("cut");
    let fake = FakeProvider::start().await;
    // A language that takes four times the tokens: answers sized for a European one are cut.
    fake.behave_like(HostedModel { translation_growth: 4.0, ..instant_model() });
    let user = users::create_user(&pool, "cut@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(12);
    let job = submit(&pool, &docs, user.id, &text, "translate", 200_000).await;
    let processor = processor(
        &pool,
        &docs,
        ProviderConfig { max_tokens: 3_000, ..fake_config(&fake) },
        200_000,
        Budget::disabled(),
    );
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Done, "{view:?}");
    let model = fake.model_report();
    assert!(model.cut >= 1, "an answer was cut: {model:?}");
    let result = view.result.unwrap()["markdown"].as_str().unwrap().to_string();
    // Every paragraph came back, in order (each four times, as this language writes it).
    let numbers: Vec<usize> =
        result.split("Paragraph ").skip(1).filter_map(|rest| rest.split_whitespace().next()?.parse().ok()).collect();
    let mut seen = numbers.clone();
    seen.dedup();
    assert_eq!(seen, (1..=12).collect::<Vec<_>>(), "every paragraph, in order: {numbers:?}");
    assert_eq!(numbers.len(), 48);
    // A cut answer's whole paragraphs were kept: only the one it was cut in, and those after
    // it, were asked again (redone in halves, the whole text was sent again and again).
    assert_eq!(fake.calls_matching("Paragraph 1 opens"), 1, "the first paragraph was kept from the cut answer");
    let sent: u64 = (1..=12).map(|i| fake.calls_matching(&format!("Paragraph {i} opens"))).sum();
    assert!(sent < 24, "{sent} paragraphs sent for 12, {} answers cut", model.cut);
    let discarded = discarded_of(&pool, job).await;
    assert!(discarded > 0 && discarded * 4 < model.output_tokens as i64, "{discarded} of {model:?} not kept");
    assert_eq!(attempts_of(&pool, job).await, (1, 0), "no attempt used by the cut");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "one debit, nothing more");
    let output: Option<i64> = sqlx::query_scalar("SELECT output_tokens FROM attempt_history WHERE job_id = $1")
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(output.unwrap() as u64, model.output_tokens, "the cut calls' tokens are counted in the cost");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_summary_whose_answer_stays_cut_fails_in_words_and_is_refunded(pool: PgPool) {
    let docs = docs("cut-summary");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "cuts@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    // The model rambles: every answer stops at its limit.
    let rambling = || Reply::Modelled {
        text: "Well, ".repeat(50),
        input_tokens: 10,
        output_tokens: 64,
        cut: true,
        delay_ms: 0,
        model: None,
        unused_ask: 0,
    };
    fake.push((0..20).map(|_| rambling()));
    let processor = processor(&pool, &docs, fake_config(&fake), 200_000, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Failed, "{view:?}");
    let reason = view.failure_reason.unwrap();
    assert!(reason.contains("longer than it may write at once"), "{reason}");
    let ledger = ledger_of(&pool, job).await;
    assert_eq!(ledger.iter().map(|(_, a)| a).sum::<i64>(), 0, "refunded in full: {ledger:?}");
}

/// Issue 55, item 2: a content-policy 400 on a late part (as Anthropic and OpenAI send it) is
/// the document's, settled like a declined answer: the answered parts' share is kept and they
/// stay served; not "our fault", refunded in full while its parts stay downloadable.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_content_policy_refusal_on_a_late_part_keeps_the_answered_parts_share(pool: PgPool) {
    let docs = docs("policy");
    for openai in [false, true] {
        let fake = FakeProvider::start().await;
        let email = format!("policy-{openai}@example.com");
        let user = users::create_user(&pool, &email, "password123", Role::User, 200).await.unwrap();
        let job = submit(&pool, &docs, user.id, &report(60), "summarize", 500).await;
        // Part 1 waits while the others are answered, then is refused for its content.
        fake.push_matching("part 1 of", [Reply::ContentPolicy { delay_ms: 2_000 }]);
        let mut config = fake_config(&fake);
        if openai {
            config.kind = ProviderKind::Openai;
            config.base_url = format!("{}/v1", fake.base_url());
        }
        let processor = processor(&pool, &docs, config, 500, Budget::disabled());
        let view = drive(&pool, &processor, job).await;
        assert_eq!(view.state, JobState::Failed, "{view:?}");
        assert_eq!(view.failure_kind, Some(queue::FailureKind::InvalidInput), "the document's: {view:?}");
        let total = view.parts_total.unwrap();
        assert!(view.parts_done > 0, "{view:?}");
        let ledger = ledger_of(&pool, job).await;
        let charged = -ledger.iter().map(|(_, a)| a).sum::<i64>();
        assert!(charged > 0, "the answered parts' share is kept: {ledger:?}");
        assert!(sluice_types::settlement::answered_parts_served(i64::from(view.cost), view.refunded));
        let said = notices::list(&pool, user.id, 10).await.unwrap()[0].message.clone();
        assert!(said.contains(&format!("of its {total} parts")) && said.contains("can be downloaded"), "{said}");
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn parts_of_dense_scripts_never_exceed_the_context_as_the_provider_counts_it(pool: PgPool) {
    let docs = docs("dense");
    let fake = FakeProvider::start().await;
    fake.behave_like(instant_model());
    let user = users::create_user(&pool, "dense@example.com", "password123", Role::User, 20).await.unwrap();
    // Japanese and emoji: one to two characters a token, where four characters a token would
    // make each part two to four times the context.
    let text: String = (1..=300)
        .map(|i| {
            format!("第{i}条 契約の当事者は、本契約に定める条件に従い、納品日までに商品を引き渡すものとする。🎉🚀\n\n")
        })
        .collect();
    let context = 2_000;
    let job = submit(&pool, &docs, user.id, &text, "summarize", context).await;
    let provider = ProviderConfig { max_tokens: 1_024, ..fake_config(&fake) };
    let processor = processor(&pool, &docs, provider, context, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Done, "{view:?}");
    let model = fake.model_report();
    assert!(view.parts_total.unwrap() >= 5, "{:?} parts", view.parts_total);
    assert!(
        model.largest_prompt <= context,
        "a prompt of {} tokens against a context of {context}",
        model.largest_prompt
    );
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_part_that_fails_three_times_fails_the_job_with_one_refund_and_a_notice_naming_the_part(pool: PgPool) {
    let docs = docs("failing");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "fail@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(30), "summarize", 500).await;
    // Part 2 meets a server error on each of its three attempts; the others succeed.
    fake.push_matching("part 2 of", [Reply::ServerError, Reply::ServerError, Reply::ServerError]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Failed);
    let reason = view.failure_reason.unwrap();
    assert!(reason.starts_with("part 2 of "), "the reason names the part: {reason}");
    assert_eq!(fake.calls_matching("part 2 of"), 3, "part 2 three times");
    assert_eq!(fake.calls_matching("part 1 of"), 1, "a part done is never redone");
    let ledger = ledger_of(&pool, job).await;
    assert_eq!(ledger.len(), 2, "one debit and one refund: {ledger:?}");
    assert_eq!(ledger[0].1 + ledger[1].1, 0, "refunded in full");
    let notices = notices::list(&pool, user.id, 10).await.unwrap();
    assert_eq!(notices.len(), 1);
    assert!(notices[0].message.contains("part 2 of"), "{:?}", notices[0]);
    let balance: i64 = sqlx::query_scalar("SELECT balance::int8 FROM users WHERE id = $1")
        .bind(user.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, 20);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_small_document_does_not_wait_behind_a_long_one_under_the_token_budget(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    let docs = docs("fair");
    let fake = FakeProvider::start().await;
    // 6M input tokens a minute (100K a second) in one-second buckets.
    let config = token_limit(&pool, &fake, 6_000_000, Duration::from_secs(1)).await;
    let a = users::create_user(&pool, "a@example.com", "password123", Role::User, 100).await.unwrap();
    let b = users::create_user(&pool, "b@example.com", "password123", Role::User, 100).await.unwrap();
    // A: about 490K tokens (parts of up to 100K); B, a second later: about 2K.
    let long: String = report(15_000).chars().take(1_960_000).collect();
    let a_job = submit(&pool, &docs, a.id, &long, "summarize", 100_000).await;
    let processor = processor(&pool, &docs, fake_config(&fake), 100_000, Budget::new(pool.clone(), &config));
    let workers = WorkerPool::start(pool.clone(), fast_worker("fair", 24), Arc::new(processor), Arc::new(AccountHooks));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b_job = submit(&pool, &docs, b.id, &report(60), "summarize", 100_000).await;

    let ended = wait_for(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE state IN ('done', 'failed')")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 2
    })
    .await;
    workers.shutdown().await;
    assert!(ended, "both jobs end");
    let (a_view, b_view) = (queue::get(&pool, a_job).await.unwrap(), queue::get(&pool, b_job).await.unwrap());
    assert_eq!((a_view.state, b_view.state), (JobState::Done, JobState::Done));
    assert!(a_view.parts_total.unwrap() >= 5, "{:?} parts", a_view.parts_total);
    let waited = (b_view.started_at.unwrap() - b_view.accepted_at).to_std().unwrap();
    assert!(waited < Duration::from_millis(1_500), "B is claimed at once, not after A's parts: waited {waited:?}");
    let third_part: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT done_at FROM job_parts WHERE job_id = $1 AND level = 0 AND idx = 2")
            .bind(a_job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(b_view.finished_at.unwrap() < third_part, "B is done before A's third part");
    assert_eq!(fake.limit_report().refused, 0, "the budget kept every call under the provider's limit");
}

/// Input tokens at quantile `q` of seed 000's workload: a log-normal through its p90 (129K) and
/// p99 (492K) tokens (median about 25K).
fn seed_000_tokens(q: f64) -> u64 {
    // The standard normal's quantile, by bisection on erf-free Abramowitz-Stegun's CDF.
    let cdf = |z: f64| {
        let t = 1.0 / (1.0 + 0.2316419 * z.abs());
        let d = 0.398_942_3 * (-z * z / 2.0).exp();
        let p = d * t * (0.319_381_5 + t * (-0.356_563_8 + t * (1.781_478 + t * (-1.821_256 + t * 1.330_274))));
        if z >= 0.0 {
            1.0 - p
        } else {
            p
        }
    };
    let (mut lo, mut hi) = (-8.0, 8.0);
    for _ in 0..80 {
        let mid = (lo + hi) / 2.0;
        if cdf(mid) < q {
            lo = mid
        } else {
            hi = mid
        }
    }
    let (z90, z99) = (1.281_551_6, 2.326_347_9);
    let sigma = ((492_000f64).ln() - (129_000f64).ln()) / (z99 - z90);
    let mu = (129_000f64).ln() - z90 * sigma;
    (mu + sigma * lo).exp() as u64
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn seed_000s_workload_is_accepted_under_the_ceiling_and_every_job_ends_done_through_a_token_limit(pool: PgPool) {
    let pool = wider_pool(&pool, 30).await;
    let docs = docs("corpus");
    let fake = FakeProvider::start().await;
    // 60M input tokens a minute; parts of at most 100K tokens.
    let config = token_limit(&pool, &fake, 60_000_000, Duration::from_millis(200)).await;
    // 20 documents at evenly spread quantiles, and seed 000's p99 itself.
    let mut sizes: Vec<u64> = (0..20).map(|i| seed_000_tokens((i as f64 + 0.5) / 20.0)).collect();
    sizes.push(seed_000_tokens(0.99));
    assert!((20_000..32_000).contains(&seed_000_tokens(0.5)) && (480_000..500_000).contains(&sizes[20]), "{sizes:?}");
    let ceiling = 2_000_000;
    let admission =
        AdmissionConfig { max_document_tokens: Some(ceiling), max_call_tokens: Some(100_000), ..Default::default() };
    let mut users_ = Vec::new();
    for u in 0..5 {
        users_.push(
            users::create_user(&pool, &format!("c{u}@example.com"), "password123", Role::User, 1_000).await.unwrap(),
        );
    }
    let mut ids = Vec::new();
    for (i, tokens) in sizes.iter().enumerate() {
        let text: String = report(tokens.div_ceil(35) as usize).chars().take(*tokens as usize * 4).collect();
        // The upload check passes every one of them (the ceiling is far above seed 000's p99).
        let mut check =
            engine::documents::intake::UploadCheck::new(Some("doc.txt"), 50 << 20).with_ceiling(Some(ceiling));
        for chunk in text.as_bytes().chunks(64 * 1024) {
            check.push(chunk).unwrap();
        }
        check.finish().unwrap();
        ids.push(submit(&pool, &docs, users_[i % 5].id, &text, "summarize", admission.max_call_tokens.unwrap()).await);
    }
    // A document over the ceiling is refused while it streams, with the ceiling in the error.
    let mut check = engine::documents::intake::UploadCheck::new(Some("huge.txt"), 50 << 20).with_ceiling(Some(ceiling));
    let huge = "word ".repeat(2_100_000);
    let refused = huge.as_bytes().chunks(64 * 1024).try_for_each(|c| check.push(c));
    assert!(matches!(refused, Err(engine::error::EngineError::TooManyTokens { max_tokens: 2_000_000 })), "{refused:?}");

    let processor = processor(&pool, &docs, fake_config(&fake), 100_000, Budget::new(pool.clone(), &config));
    let workers =
        WorkerPool::start(pool.clone(), fast_worker("corpus", 24), Arc::new(processor), Arc::new(AccountHooks));
    let ended = wait_for(Duration::from_secs(120), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE id = ANY($1) AND state NOT IN ('done', 'failed')")
            .bind(&ids)
            .fetch_one(&pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    workers.shutdown().await;
    assert!(ended, "every job ends");
    let rows: Vec<(String, Option<i32>, i64, i64)> = sqlx::query_as(
        "SELECT j.state, j.parts_total,
                (SELECT count(*) FROM ledger l WHERE l.job_id = j.id AND l.kind = 'debit'),
                (SELECT count(*) FROM ledger l WHERE l.job_id = j.id AND l.kind = 'refund')
         FROM jobs j WHERE j.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    for (state, _, debits, refunds) in &rows {
        assert_eq!(*debits, 1);
        assert!(state == "done" && *refunds == 0 || state == "failed" && *refunds == 1, "{state}, {refunds} refunds");
    }
    assert!(rows.iter().all(|(state, ..)| state == "done"), "the fake never fails: all done");
    let in_parts = rows.iter().filter(|(_, parts, ..)| parts.is_some()).count();
    assert!(in_parts >= 2, "the heavy tail ({in_parts} documents) was done in parts");
    assert!(
        fake.limit_report().refused <= 2,
        "the budget kept the calls under the limit: {} refused",
        fake.limit_report().refused
    );
}

/// Admit `pdf` for `user` at `hold` credits (its price by size `by_size`), as intake does.
async fn submit_pdf(pool: &PgPool, docs: &TempBlobs, user: i64, pdf: &[u8], hold: i64, by_size: i64) -> Uuid {
    submit_held(pool, docs, user, ("pdf", pdf), hold, by_size).await
}

/// Admit a document of `doc_type` (a PDF, a Word file: priced once read) at `hold` credits.
async fn submit_held(
    pool: &PgPool,
    docs: &TempBlobs,
    user: i64,
    (doc_type, bytes): (&str, &[u8]),
    hold: i64,
    by_size: i64,
) -> Uuid {
    let key = Blobs::new_key();
    docs.blobs.put(&key, bytes.to_vec().into()).await.unwrap();
    let name = format!("dense.{}", if doc_type == "docx" { "docx" } else { "pdf" });
    let payload = serde_json::json!({
        "document": { "key": key, "type": doc_type, "sha256": key, "size": bytes.len(), "name": name },
        "preset": "summarize",
    });
    let submission = Submission {
        price_by_size: Some(by_size),
        lane: Default::default(),
        shared_document: None,
        cost: hold,
        est_input_tokens: 100,
        user_id: user,
        payload,
        content_key: key.clone(),
        client_key: None,
        fingerprint: key,
    };
    match admission::submit(pool, &AdmissionConfig::default(), &submission).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("refused: {other:?}"),
    }
}

fn settling(pool: &PgPool) -> Option<HoldSettlement> {
    Some(HoldSettlement { pool: pool.clone(), prices: PriceTable::default(), economy: None })
}

/// A PDF is admitted at the price of its worst case and settled to its text's price once read:
/// the difference comes back in the transaction that ends the job, and the books add up.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_pdf_held_at_its_worst_case_is_settled_to_its_texts_price(pool: PgPool) {
    let docs = docs("held-pdf");
    let user = users::create_user(&pool, "held@example.com", "password123", Role::User, 20).await.unwrap();
    let pdf = engine::testing::pdf_with_text(&["Quarterly report.", "Revenue grew by twelve percent."]);
    let job = submit_pdf(&pool, &docs, user.id, &pdf, 4, 1).await;
    assert_eq!(users::get(&pool, user.id).await.unwrap().balance, 16, "the hold is taken at admission");
    let mut processor = processor(&pool, &docs, ProviderConfig::default(), 200_000, Budget::disabled());
    processor.settle_held = settling(&pool);
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done);
    assert_eq!((view.cost, view.refunded), (4, 3), "settled to 1 credit: its text's price");
    assert_eq!(users::get(&pool, user.id).await.unwrap().balance, 19);
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);
}

/// A compressed PDF whose text costs more than the price held for it is not done in parts for
/// less: it fails before any provider call, refunded, asking for its text as a .txt file.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_pdf_denser_than_its_hold_is_not_done_in_parts_and_is_refunded(pool: PgPool) {
    let docs = docs("dense-pdf");
    let user = users::create_user(&pool, "pdf@example.com", "password123", Role::User, 20).await.unwrap();
    // 2,000 clauses, about 30K tokens (2 credits), compressed into a few KB (held at 1).
    let lines: Vec<String> =
        (1..=2000).map(|i| format!("Clause {i} binds both parties to the terms of the agreement.")).collect();
    let pdf = engine::testing::pdf_with_compressed_text(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let pdf_kind = sluice_types::capacity::SizeKind::Pdf;
    let hold_tokens = sluice_types::settlement::hold_tokens(
        pdf_kind,
        sluice_types::capacity::estimate_input_tokens(pdf_kind, pdf.len() as u64),
        None,
    );
    assert_eq!(PriceTable::default().price(hold_tokens), 1, "{} bytes hold {hold_tokens} tokens", pdf.len());
    let job_id = submit_pdf(&pool, &docs, user.id, &pdf, 1, 1).await;
    let mut processor = processor(&pool, &docs, ProviderConfig::default(), 1_000, Budget::disabled());
    processor.settle_held = settling(&pool);
    let view = drive(&pool, &processor, job_id).await;
    assert_eq!(view.state, JobState::Failed);
    assert_eq!(view.failure_kind, Some(engine::FailureKind::InvalidInput));
    assert!(view.failure_reason.unwrap().contains("upload its text as a .txt file"));
    assert_eq!(ledger_of(&pool, job_id).await.len(), 2, "debited, then refunded");
    assert_eq!(view.refunded, 1);
    assert!(view.parts_total.is_none(), "no part was stored");
    // The reader's work came to nothing: it counts against the day's free unreadable ones.
    let counted: bool = sqlx::query_scalar("SELECT failed_unreadable FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(counted, "refused once read counts as reader work");
}

/// Issue 55, item 8: a document priced once read (a Word file, a PDF) whose text is dearer
/// than its hold buys no provider call even when its text fits one call: it fails in words
/// before any call, as one needing parts always did. (A Word file of many small, repeated
/// parts is caught before that by the whole file's inflation wall: see office.rs.)
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_document_denser_than_its_hold_buys_no_call_even_one_that_fits(pool: PgPool) {
    let docs = docs("dense-whole");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "dense@example.com", "password123", Role::User, 20).await.unwrap();
    // About 30K tokens (2 credits) in a few KB (held at 1), as in the test above.
    let lines: Vec<String> =
        (1..=2000).map(|i| format!("Clause {i} binds both parties to the terms of the agreement.")).collect();
    let pdf = engine::testing::pdf_with_compressed_text(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let job_id = submit_held(&pool, &docs, user.id, ("pdf", &pdf), 1, 1).await;
    // A context that takes the whole text in one call.
    let mut processor = processor(&pool, &docs, fake_config(&fake), 200_000, Budget::disabled());
    processor.settle_held = settling(&pool);
    let view = drive(&pool, &processor, job_id).await;
    assert_eq!(view.state, JobState::Failed, "{view:?}");
    assert!(
        view.failure_reason.as_deref().unwrap_or("").contains("more than the price held for it covers"),
        "{view:?}"
    );
    assert_eq!(fake.calls(), 0, "no provider call was made for the hold's price");
    assert_eq!(view.refunded, 1);
}

async fn parts_kept(pool: &PgPool, job: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM job_parts WHERE job_id = $1").bind(job).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_canceled_documents_part_text_is_gone_with_it_and_counted_in_the_quota_until_then(pool: PgPool) {
    let docs = docs("cancel-text");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "cancel-text@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(30);
    let job = submit(&pool, &docs, user.id, &text, "summarize", 500).await;
    // Part 2 answers slowly: the job is running with its parts stored when the owner cancels.
    fake.push_matching("part 2 of", [Reply::Hang { millis: 3_000 }]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    let running = {
        let (pool, processor) = (pool.clone(), processor.clone());
        tokio::spawn(async move {
            let config = fast_worker("parts", 4);
            work_once(&pool, &config, Arc::new(processor), Arc::new(AccountHooks), 4).await.unwrap();
        })
    };
    assert!(wait_for(Duration::from_secs(20), || async { parts_kept(&pool, job).await > 0 }).await);
    let mut conn = pool.acquire().await.unwrap();
    let used = admission::storage_used(&mut conn, user.id).await.unwrap();
    assert!(used >= 2 * text.len() as u64, "the parts' text counts in the quota: {used} bytes for {}", text.len());

    assert_eq!(queue::cancel(&pool, &AccountHooks, job, "owner", false).await.unwrap(), queue::Canceled::Requested);
    running.await.unwrap();
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Canceled, "{view:?}");
    assert_eq!(parts_kept(&pool, job).await, 0, "no part of a canceled document's text is kept");
    let used = admission::storage_used(&mut conn, user.id).await.unwrap();
    assert_eq!(used, text.len() as u64, "its document until the release sweep, nothing more");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_failed_documents_part_text_goes_when_its_replay_window_ends(pool: PgPool) {
    let docs = docs("failed-text");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "failed-text@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(30), "summarize", 500).await;
    fake.push_matching("part 2 of", [Reply::ServerError, Reply::ServerError, Reply::ServerError]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    assert_eq!(drive(&pool, &processor, job).await.state, JobState::Failed);
    assert!(parts_kept(&pool, job).await > 0, "kept for the admins' inspection and a replay");

    let released =
        engine::documents::sweep::release_documents(&pool, &docs.blobs, Duration::from_secs(3_600)).await.unwrap();
    assert_eq!(released, 0, "inside its window: nothing goes");
    assert!(parts_kept(&pool, job).await > 0);
    let released = engine::documents::sweep::release_documents(&pool, &docs.blobs, Duration::ZERO).await.unwrap();
    assert_eq!(released, 1);
    assert_eq!(parts_kept(&pool, job).await, 0, "its text goes with its document");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_document_that_fails_at_its_last_part_keeps_the_share_of_parts_answered(pool: PgPool) {
    let docs = docs("last-part");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "last-part@example.com", "password123", Role::User, 200).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(60), "summarize", 500).await;
    // Part 1 answers last, and its answer is cut short: the document's failure, after every
    // other part was answered (and billed by the provider).
    let cut = Reply::Modelled {
        text: "Well, ".repeat(50),
        input_tokens: 10,
        output_tokens: 64,
        cut: true,
        delay_ms: 2_000,
        model: None,
        unused_ask: 0,
    };
    fake.push_matching("part 1 of", [cut]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    let view = drive(&pool, &processor, job).await;

    assert_eq!(view.state, JobState::Failed, "{view:?}");
    assert_eq!(view.failure_kind, Some(queue::FailureKind::InvalidInput));
    let total = view.parts_total.unwrap();
    assert_eq!(view.parts_done, total - 1, "every part but the last was answered");
    let ledger = ledger_of(&pool, job).await;
    let cost = -ledger[0].1;
    let kept = sluice_types::settlement::kept_on_cancel(cost, (total - 1) as u32, total as u32);
    assert!(kept > 0, "{cost} credits over {total} parts");
    assert_eq!(ledger.iter().map(|(_, a)| a).sum::<i64>(), -kept, "keeps the answered parts' share: {ledger:?}");
    let notices = notices::list(&pool, user.id, 10).await.unwrap();
    let said = &notices[0].message;
    assert!(said.contains(&format!("answered {} of its {total} parts", total - 1)), "{said}");
    // What was answered stays for its owner to read, the part not done marked in its place.
    assert!(
        said.contains(&format!("Part 1 of {total} was not done; the {} parts done can be downloaded", total - 1)),
        "{said}"
    );
    let so_far = queue::parts::answered_so_far(&pool, job).await.unwrap();
    assert_eq!((so_far.total, so_far.answered.len()), (total as usize, total as usize - 1));
    let markdown = so_far.markdown();
    assert!(markdown.starts_with(&format!("*[part 1 of {total} is not done]*\n\n")), "{markdown}");
    assert_eq!(markdown.matches("is not done]*").count(), 1, "only the part not done is marked");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_failure_that_is_ours_refunds_a_document_in_parts_in_full(pool: PgPool) {
    let docs = docs("ours");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "ours@example.com", "password123", Role::User, 200).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(60), "summarize", 500).await;
    fake.push_matching("part 1 of", [Reply::BadRequest]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Failed, "{view:?}");
    assert_eq!(view.failure_kind, Some(queue::FailureKind::ProviderRejected));
    let ledger = ledger_of(&pool, job).await;
    assert_eq!(ledger.iter().map(|(_, a)| a).sum::<i64>(), 0, "refunded in full: {ledger:?}");
    // Refunded in full: nothing answered is served, and the notice does not point at it.
    let view = queue::get(&pool, job).await.unwrap();
    assert!(!sluice_types::settlement::answered_parts_served(i64::from(view.cost), view.refunded));
    let said = notices::list(&pool, user.id, 10).await.unwrap()[0].message.clone();
    assert!(!said.contains("can be downloaded"), "{said}");
}

/// Issue 55, item 2 (the review's case): parts downloaded while the document runs are paid
/// for. A failure that is ours after that (here a plain 400 on the last part) keeps the
/// answered parts' share instead of refunding the whole document.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn parts_read_before_a_failure_that_is_ours_keep_their_share(pool: PgPool) {
    let docs = docs("read-then-fail");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "reader@example.com", "password123", Role::User, 200).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(60), "summarize", 500).await;
    fake.push_matching("part 1 of", [Reply::Later { delay_ms: 2_000, then: Box::new(Reply::BadRequest) }]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    // The owner downloads what is answered while part 1 is still out.
    let reader = {
        let pool = pool.clone();
        tokio::spawn(async move {
            loop {
                let view = queue::get(&pool, job).await.unwrap();
                if view.parts_done > 0 {
                    return queue::parts::mark_parts_read(&pool, job).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let view = drive(&pool, &processor, job).await;
    assert!(reader.await.unwrap(), "served while running");
    assert_eq!(view.state, JobState::Failed, "{view:?}");
    assert_eq!(view.failure_kind, Some(queue::FailureKind::ProviderRejected), "ours: {view:?}");
    let ledger = ledger_of(&pool, job).await;
    let charged = -ledger.iter().map(|(_, a)| a).sum::<i64>();
    assert!(charged > 0, "the read parts' share is kept: {ledger:?}");
    let (total, done) = (view.parts_total.unwrap() as u32, view.parts_done as u32);
    let share = sluice_types::settlement::kept_on_cancel(-ledger[0].1, done, total);
    assert_eq!(charged, share, "the answered parts' share, no more: {ledger:?}");
    let said = notices::list(&pool, user.id, 10).await.unwrap()[0].message.clone();
    assert!(said.contains("had been downloaded"), "{said}");
    assert!(queue::parts::mark_parts_read(&pool, job).await.unwrap(), "what was paid for stays served");
}

// Real providers (issue 56): their tokenizers, their stop reasons, their quotas, the answer
// sizes asked for, and answers streamed as they are written.

/// A fake provider (behaving like `model`, when given), a user with credits, and a processor
/// calling the fake with answers of at most `max_tokens` and a context of `context`.
async fn hosted(
    pool: &PgPool,
    name: &str,
    model: Option<HostedModel>,
    max_tokens: u32,
    context: u64,
) -> (TempBlobs, FakeProvider, users::User, DocumentProcessor) {
    let docs = docs(name);
    let fake = FakeProvider::start().await;
    if let Some(model) = model {
        fake.behave_like(model);
    }
    let user = users::create_user(pool, &format!("{name}@example.com"), "password123", Role::User, 50).await.unwrap();
    let processor =
        processor(pool, &docs, ProviderConfig { max_tokens, ..fake_config(&fake) }, context, Budget::disabled());
    (docs, fake, user, processor)
}

/// A processor that learns the provider's tokenizer ratio in memory, from `start`.
fn learning(processor: DocumentProcessor, start: f64) -> DocumentProcessor {
    DocumentProcessor { token_ratio: engine::documents::ratio::TokenRatio::in_memory(start), ..processor }
}

async fn attempts_of(pool: &PgPool, job: Uuid) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE outcome <> 'succeeded') FROM attempt_history WHERE job_id = $1",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_provider_counting_more_tokens_than_ours_costs_no_attempt_and_its_ratio_plans_the_next_document(
    pool: PgPool,
) {
    // Its tokenizer counts 25 % more than o200k, and it refuses a prompt past 4K by its count.
    let model = HostedModel { token_inflation: 1.25, context_tokens: 4_000, ..instant_model() };
    let (docs, fake, user, processor) = hosted(&pool, "too-long", Some(model), 4_000, 4_000).await;
    let processor = learning(processor, 1.0);
    // Parts planned at 90 % of 4K by our count (cut a little short of it) are over 4K by the
    // provider's.
    let text = report(300);
    let job = submit(&pool, &docs, user.id, &text, "summarize", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let refused = fake.model_report().too_long;
    assert!(refused >= 1, "the provider refused a part as too long: {:?}", fake.model_report());
    assert_eq!(attempts_of(&pool, job).await.1, 0, "no attempt was used by a refusal");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "nothing more was charged");
    let learned = processor.token_ratio.get();
    assert!((1.2..1.3).contains(&learned), "the ratio was learned from the refusal: {learned}");
    // The next document is planned by the provider's count: nothing refused.
    let next = submit(&pool, &docs, user.id, &report(280), "summarize", 200_000).await;
    assert_eq!(drive(&pool, &processor, next).await.state, JobState::Done);
    assert_eq!(fake.model_report().too_long, refused, "the second document's parts all fit");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_whole_document_refused_as_too_long_goes_in_parts_without_an_attempt(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(
        &pool,
        "too-long-whole",
        Some(HostedModel { token_inflation: 1.3, context_tokens: 4_000, ..instant_model() }),
        4_000,
        4_000,
    )
    .await;
    let processor = learning(processor, 1.0);
    // About 3.4K tokens by our count: one call by our plan, 4.4K by the provider's.
    let job = submit(&pool, &docs, user.id, &report(105), "summarize", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert!(fake.model_report().too_long >= 1, "{:?}", fake.model_report());
    assert!(view.parts_total.unwrap_or(0) >= 2, "it went in parts: {view:?}");
    assert_eq!(attempts_of(&pool, job).await.1, 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_empty_answer_or_an_unknown_stop_reason_is_never_done_and_is_tried_once_more(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "unfinished", None, 4_000, 200_000).await;
    let finished = |text: &str, stop: &str| Reply::Finished {
        text: text.into(),
        stop_reason: stop.into(),
        input_tokens: 300,
        output_tokens: 20,
    };
    // Empty twice: failed in words, refunded (the provider's doing, not the document's).
    let empty = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    fake.push([finished("", "end_turn"), finished(" \n", "end_turn")]);
    let view = drive(&pool, &processor, empty).await;
    assert_eq!((view.state, view.attempts), (JobState::Failed, 2), "{view:?}");
    assert!(view.failure_reason.as_deref().unwrap().contains("answer was empty"), "{view:?}");
    assert_eq!(view.failure_kind, Some(engine::FailureKind::RetriesExhausted));
    let ledger = ledger_of(&pool, empty).await;
    assert_eq!(ledger.iter().map(|(_, a)| a).sum::<i64>(), 0, "refunded in full: {ledger:?}");
    // Answers not kept were billed all the same: each failed attempt counts the provider's usage.
    assert_eq!(failed_attempts_tokens(&pool, empty).await, vec![(Some(300), Some(20)); 2]);
    // Half an answer with a reason nobody documented, then a whole one: done with the whole.
    let half = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    fake.push([
        finished("## Summary\nParagraph 1", "pause_turn"),
        finished("## Summary\nParagraphs 1 to 3.", "end_turn"),
    ]);
    let view = drive(&pool, &processor, half).await;
    assert_eq!((view.state, view.attempts), (JobState::Done, 2), "{view:?}");
    assert_eq!(view.result.unwrap()["markdown"], "## Summary\nParagraphs 1 to 3.");
    assert_eq!(failed_attempts_tokens(&pool, half).await, vec![(Some(300), Some(20))]);
}

/// The call for a translation's key terms answered with a stop reason nobody documented: the
/// translation goes on without key terms, and the call, billed, counts in the job's tokens.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_key_terms_answer_not_kept_still_counts_in_the_jobs_tokens(pool: PgPool) {
    let docs = docs("terms-billed");
    let fake = FakeProvider::start().await;
    fake.behave_like(instant_model());
    let user = users::create_user(&pool, "terms@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(20), "translate", 200_000).await;
    let unfinished = Reply::Finished {
        text: "Paragraph → Absatz".into(),
        stop_reason: "pause_turn".into(),
        input_tokens: 300,
        output_tokens: 20,
    };
    fake.push_matching("key terms of the document below", [unfinished]);
    let processor =
        processor(&pool, &docs, ProviderConfig { max_tokens: 256, ..fake_config(&fake) }, 200_000, Budget::disabled());
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert!(view.parts_total.unwrap_or(0) >= 2, "{view:?}");
    let (parts_in, parts_out): (i64, i64) =
        sqlx::query_as("SELECT sum(input_tokens)::int8, sum(output_tokens)::int8 FROM job_parts WHERE job_id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();
    let (job_in, job_out): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT input_tokens, output_tokens FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((job_in, job_out), (Some(parts_in + 300), Some(parts_out + 20)), "the parts, and the key terms' call");
}

/// A provider claiming absurd usage for an answer Sluice did not keep (a trillion tokens for an
/// empty answer) is believed only within the bounds of any answer's usage: the prompt's count
/// with room, the most an answer may hold.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_answer_not_kept_with_absurd_usage_counts_within_bounds(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "absurd", None, 4_000, 200_000).await;
    let job = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    let absurd = |stop: &str| Reply::Finished {
        text: String::new(),
        stop_reason: stop.into(),
        input_tokens: 1_000_000_000_000,
        output_tokens: 1_000_000_000_000,
    };
    fake.push([absurd("end_turn"), absurd("a_reason_added_next_year")]);
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Failed, "{view:?}");
    let counted = failed_attempts_tokens(&pool, job).await;
    assert_eq!(counted.len(), 2, "{counted:?}");
    for (input, output) in counted {
        let (input, output) = (input.unwrap_or(0), output.unwrap_or(0));
        assert!(input > 0 && input <= 20_000, "input {input}: within the prompt's count with room");
        assert!(output > 0 && output <= 4_000, "output {output}: at most what an answer may hold");
    }
}

/// The tokens each failed attempt of `job` counts, in order.
async fn failed_attempts_tokens(pool: &PgPool, job: Uuid) -> Vec<(Option<i64>, Option<i64>)> {
    sqlx::query_as(
        "SELECT input_tokens, output_tokens FROM attempt_history WHERE job_id = $1 AND outcome <> 'succeeded'
         ORDER BY attempt",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Issue 58, point 5: an attempt answered, and its process died before the completer wrote
/// the result. The rescue puts the job back (its attempt counted: it reached the provider),
/// and the next attempt finds the answer kept and calls nobody: paid once. The upkeep forgets
/// the kept answer once the job has ended.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_answer_whose_completion_died_with_its_process_is_not_asked_for_again(pool: PgPool) {
    use engine::queue::worker::Processor;
    let (docs, fake, user, processor) = hosted(&pool, "kept", Some(instant_model()), 4_000, 200_000).await;
    let job = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    let claimed = queue::claim(&pool, "dies", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    let answered = processor.process(claimed).await.expect("answered");
    assert_eq!(fake.calls(), 1);
    // The process is gone: its completion never comes, its lease runs out, the rescue acts.
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    queue::rescue::rescue_expired(&pool, &AccountHooks, &Default::default()).await.unwrap();
    assert_eq!(queue::get(&pool, job).await.unwrap().state, JobState::Retrying);
    sqlx::query("UPDATE jobs SET run_at = now() WHERE id = $1").bind(job).execute(&pool).await.unwrap();
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!(fake.calls(), 1, "the provider was not asked again");
    assert_eq!(view.result, Some(answered.result), "the answer paid for is the result");
    assert_eq!(engine::documents::kept_answers::forget_ended(&pool).await.unwrap(), 1);
    assert!(engine::documents::kept_answers::kept(&pool, job).await.unwrap().is_none());
}

/// The same on a job's last attempt: the rescue fails it (refunded), its kept answer stays,
/// and a replay from the dead-letter queue uses it: still one call.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_kept_answer_outlives_a_failure_on_the_last_attempt_and_the_replay_uses_it(pool: PgPool) {
    use engine::queue::worker::Processor;
    let (docs, fake, user, processor) = hosted(&pool, "kept-last", Some(instant_model()), 4_000, 200_000).await;
    let job = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    let claimed = queue::claim(&pool, "dies", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    let answered = processor.process(claimed).await.expect("answered");
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    let one_attempt = engine::queue::policy::retry::RetryPolicy { max_attempts: 1, ..Default::default() };
    queue::rescue::rescue_expired(&pool, &AccountHooks, &one_attempt).await.unwrap();
    assert_eq!(queue::get(&pool, job).await.unwrap().state, JobState::Failed);
    assert_eq!(engine::documents::kept_answers::forget_ended(&pool).await.unwrap(), 0, "a failed job's is kept");
    let selection = engine::queue::dlq::Selection::Job(job);
    engine::queue::dlq::replay(&pool, &AccountHooks, &selection, "ops@example.com").await.unwrap();
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!(fake.calls(), 1, "the replay used the answer paid for");
    assert_eq!(view.result, Some(answered.result));
    // Done: its kept answer goes. A failed job whose document is released keeps none either.
    assert_eq!(engine::documents::kept_answers::forget_ended(&pool).await.unwrap(), 1);
    let again = submit(&pool, &docs, user.id, &report(4), "summarize", 200_000).await;
    let claimed = queue::claim(&pool, "dies", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    processor.process(claimed).await.expect("answered");
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(again)
        .execute(&pool)
        .await
        .unwrap();
    queue::rescue::rescue_expired(&pool, &AccountHooks, &one_attempt).await.unwrap();
    assert_eq!(engine::documents::kept_answers::forget_ended(&pool).await.unwrap(), 0);
    queue::retention::mark_released(&pool, &[again]).await.unwrap();
    assert_eq!(engine::documents::kept_answers::forget_ended(&pool).await.unwrap(), 1, "gone with its document");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_spent_quota_holds_processing_alerts_the_operator_and_fails_nobody(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "quota", Some(instant_model()), 4_000, 200_000).await;
    let text = report(4);
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(submit(&pool, &docs, user.id, &text, "summarize", 200_000).await);
    }
    // 429 `insufficient_quota` for 2.5 s, then lifted.
    fake.spend_quota_for(Duration::from_millis(2_500));
    let config = fast_worker("quota", 4);
    work_once(&pool, &config, Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
    let settings = queue::switches::read(&pool).await.unwrap();
    assert!(!settings.processing_enabled, "processing is held");
    assert_eq!(settings.processing_changed_by, queue::switches::PROVIDER_HOLD_ACTOR);
    assert!(settings.resume_at.is_some(), "the hold ends by itself, and a call tries again");
    let observed = engine::alerts::observe(&pool).await.unwrap();
    let firing = engine::alerts::rules::evaluate(&observed, &Default::default());
    assert!(firing.iter().any(|r| r.rule == engine::alerts::Rule::ProviderHeld && r.firing), "{firing:?}");
    for job in &jobs {
        let view = queue::get(&pool, *job).await.unwrap();
        assert_eq!((view.state, view.attempts), (JobState::Queued, 0), "waiting, its attempt unused: {view:?}");
    }
    // The hold ends, a call tries again (held again while the quota stays spent), then all run.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        queue::switches::resume_if_due(&pool).await.unwrap();
        work_once(&pool, &config, Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
        let mut views = Vec::new();
        for job in &jobs {
            views.push(queue::get(&pool, *job).await.unwrap());
        }
        if views.iter().all(|v| v.state.is_terminal()) {
            for view in views {
                assert_eq!(view.state, JobState::Done, "nobody fails for a spent quota: {view:?}");
                assert_eq!(ledger_of(&pool, view.id).await.len(), 1, "charged once, nothing refunded");
            }
            break;
        }
        assert!(Instant::now() < deadline, "the documents resume once the quota is lifted: {views:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(queue::switches::read(&pool).await.unwrap().processing_enabled);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_call_asks_for_its_answer_not_the_models_maximum(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "asks", Some(instant_model()), 64_000, 200_000).await;
    let text = report(400);
    let job = submit(&pool, &docs, user.id, &text, "translate", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let model = fake.model_report();
    // Each part carries at most 8K tokens: its answer is asked at its size in French (× 1.2),
    // a quarter more and 512 of room; never the model's 64,000.
    assert!(model.largest_ask <= 8_200 * 6 / 5 * 5 / 4 + 512, "{model:?}");
    assert!(model.largest_ask >= model.largest_answer, "{model:?}");
    assert_eq!(model.cut, 0, "{model:?}");
    assert_eq!(words(view.result.unwrap()["markdown"].as_str().unwrap()), words(&text));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translations_paragraphs_merged_dropped_or_prefaced_are_asked_again_and_only_they(pool: PgPool) {
    for flaw in [Flaw::Merge, Flaw::Drop, Flaw::Preface] {
        let name = format!("flaw-{flaw:?}").to_lowercase();
        let model = HostedModel { flaw: Some(flaw), flawed_answers: 1, ..instant_model() };
        let (docs, fake, user, processor) = hosted(&pool, &name, Some(model), 8_000, 200_000).await;
        let job = submit(&pool, &docs, user.id, &report(30), "translate", 200_000).await;
        let view = drive(&pool, &processor, job).await;
        assert_eq!(view.state, JobState::Done, "{flaw:?}: {view:?}");
        let result = view.result.unwrap()["markdown"].as_str().unwrap().to_string();
        // Every paragraph once, in order, each its own paragraph, and nothing else.
        let paragraphs: Vec<&str> = result.split("\n\n").collect();
        assert_eq!(paragraphs.len(), 30, "{flaw:?}: {result}");
        for (i, paragraph) in paragraphs.iter().enumerate() {
            assert!(paragraph.starts_with(&format!("[translated] Paragraph {} opens", i + 1)), "{flaw:?}: {paragraph}");
        }
        assert!(!result.contains('⟦') && !result.contains("Here is the translation"), "{flaw:?}: {result}");
        let discarded = discarded_of(&pool, job).await;
        let sent: u64 = (1..=30).map(|i| fake.calls_matching(&format!("Paragraph {i} opens"))).sum();
        if flaw == Flaw::Preface {
            // Nothing is missing: the preface is left out, no second call.
            assert_eq!(fake.calls(), 1, "{flaw:?}");
        } else {
            // The paragraphs around the flaw are asked again, and only they.
            assert_eq!(fake.calls(), 2, "{flaw:?}");
            assert!((31..=32).contains(&sent), "{flaw:?}: {sent} paragraphs sent");
            assert!(discarded > 0, "{flaw:?}: the flawed paragraphs' tokens were paid and not kept");
        }
        let billed = fake.model_report().output_tokens as i64;
        assert!(discarded * 10 < billed, "{flaw:?}: {discarded} of {billed} thrown away");
        assert_eq!(attempts_of(&pool, job).await, (1, 0), "{flaw:?}: no attempt used");
        assert_eq!(ledger_of(&pool, job).await.len(), 1, "{flaw:?}: one debit, nothing more");
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_word_translations_inline_formatting_is_kept_and_a_paragraph_whose_tags_came_back_wrong_is_counted(
    pool: PgPool,
) {
    let paragraph = |i: usize| {
        format!(
            r#"<w:p><w:r><w:t xml:space="preserve">Clause {i}: the </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>Supplier</w:t></w:r><w:r><w:t xml:space="preserve"> delivers </w:t></w:r><w:r><w:rPr><w:i/></w:rPr><w:t>in good time</w:t></w:r><w:r><w:t>.</w:t></w:r></w:p>"#
        )
    };
    let bytes = engine::testing::docx_of(&(1..=6).map(paragraph).collect::<String>());
    for (flaw, plain) in [(None, 0), (Some(Flaw::LoseTags), 6)] {
        let name = format!("inline-{}", plain);
        let model = HostedModel { flaw, flawed_answers: 1, ..instant_model() };
        let (docs, _fake, user, processor) = hosted(&pool, &name, Some(model), 8_000, 200_000).await;
        let job = submit_file(&pool, &docs, user.id, &bytes, "docx", "translate").await;
        let view = drive(&pool, &processor, job).await;
        assert_eq!(view.state, JobState::Done, "{view:?}");
        let result = view.result.unwrap();
        let markdown = result["markdown"].as_str().unwrap();
        assert_eq!(markdown.split("\n\n").count(), 6, "{markdown}");
        assert_eq!(view.paragraphs_plain, plain, "{markdown}");
        if plain == 0 {
            // A reader sees Markdown; the file is rebuilt from the tags.
            assert!(markdown.contains("**Supplier**") && markdown.contains("*in good time*"), "{markdown}");
            let tagged = result["tagged"].as_str().unwrap();
            assert!(tagged.contains("<b1>Supplier</b1>") && tagged.contains("<i2>in good time</i2>"), "{tagged}");
        } else {
            assert!(!markdown.contains('*') && result.get("tagged").is_none(), "plain words only: {result}");
        }
    }
}

/// Admit a file of `doc_type` (its bytes) for `user`, as [`submit`] does a text.
async fn submit_file(pool: &PgPool, docs: &TempBlobs, user: i64, bytes: &[u8], doc_type: &str, preset: &str) -> Uuid {
    submit_guided(pool, docs, user, bytes, doc_type, preset, serde_json::Value::Null).await
}

/// [`submit_file`] with the translation's `guidance` (glossary and formality) in its payload.
async fn submit_guided(
    pool: &PgPool,
    docs: &TempBlobs,
    user: i64,
    bytes: &[u8],
    doc_type: &str,
    preset: &str,
    guidance: serde_json::Value,
) -> Uuid {
    let key = Blobs::new_key();
    docs.blobs.put(&key, bytes.to_vec().into()).await.unwrap();
    let mut payload = serde_json::json!({
        "document": { "key": key, "type": doc_type, "sha256": key, "size": bytes.len(), "name": "contract.docx" },
        "preset": preset,
        "language": "German",
    });
    if !guidance.is_null() {
        payload["guidance"] = guidance;
    }
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 10,
        est_input_tokens: 2_000,
        user_id: user,
        payload,
        content_key: key.clone(),
        client_key: None,
        fingerprint: key,
    };
    let config = AdmissionConfig { max_attempts: 3, ..AdmissionConfig::default() };
    match admission::submit(pool, &config, &submission).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("refused: {other:?}"),
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_glossarys_terms_go_to_the_parts_that_have_them_and_an_answer_leaving_one_out_is_asked_again_then_reported(
    pool: PgPool,
) {
    // Paragraphs 1-10 name the Supplier; 11-30 do not.
    let text: String = (1..=30)
        .map(|i| {
            let who = if i <= 10 { "The Supplier" } else { "The other party" };
            format!("Paragraph {i}: {who} delivers the goods of section {i} by March {}.\n\n", 1 + i % 28)
        })
        .collect();
    let guidance = serde_json::json!({
        "glossary": [{ "source": "Supplier", "target": "Lieferant" }, { "source": "Buyer", "target": "Käufer" }],
        "formality": "formal",
    });
    for (ignored, calls, missed) in [(0, 1, vec![]), (1, 2, vec![]), (5, 2, vec!["Supplier → Lieferant".to_string()])]
    {
        let name = format!("glossary-{ignored}");
        let model = HostedModel { flaw: Some(Flaw::IgnoreGlossary), flawed_answers: ignored, ..instant_model() };
        let (docs, fake, user, processor) = hosted(&pool, &name, Some(model), 8_000, 200_000).await;
        let job =
            submit_guided(&pool, &docs, user.id, text.as_bytes(), "plain_text", "translate", guidance.clone()).await;
        let view = drive(&pool, &processor, job).await;
        assert_eq!(view.state, JobState::Done, "{view:?}");
        let markdown = view.result.unwrap()["markdown"].as_str().unwrap().to_string();
        assert_eq!(fake.calls(), calls, "{ignored} answers ignoring the glossary");
        assert_eq!(view.terms_missed, missed, "{markdown}");
        if missed.is_empty() {
            assert_eq!(markdown.matches("Lieferant").count(), 10, "{markdown}");
            assert!(!markdown.contains("Supplier"), "{markdown}");
        }
        // The prompt says the formality, and carries only the terms its text has.
        let prompt = fake.last_request().unwrap().to_string();
        assert!(prompt.contains("formally"), "{prompt}");
        assert!(prompt.contains(r#"\"Supplier\" as \"Lieferant\""#) && !prompt.contains("Käufer"), "{prompt}");
        assert_eq!(attempts_of(&pool, job).await, (1, 0));
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_text_documents_own_tag_like_words_are_not_taken_for_formatting(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "own-tags", Some(instant_model()), 8_000, 200_000).await;
    let text = "Write <b1>bold</b1> as HTML does.\n\nAnd <f2/> stays.";
    let job = submit(&pool, &docs, user.id, text, "translate", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let result = view.result.unwrap();
    let markdown = result["markdown"].as_str().unwrap();
    assert!(markdown.contains("‹b1>bold‹/b1>") && markdown.contains("‹f2/>"), "{markdown}");
    assert!(!markdown.contains("**bold**") && result.get("tagged").is_none(), "{result}");
    assert!(!fake.last_request().unwrap().to_string().contains("numbered tags"), "no tag instruction for a text");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_provider_that_never_answers_the_paragraphs_whole_costs_a_bounded_number_of_calls(pool: PgPool) {
    // Every answer names a paragraph nobody asked for (as a document telling the model to
    // renumber would): nothing is ever kept, and halving would go on and on.
    let (docs, fake, user, processor) = hosted(&pool, "never-whole", None, 8_000, 200_000).await;
    let bad = Reply::Success { text: "⟦999⟧ something else".into(), input_tokens: 100, output_tokens: 10 };
    fake.push(std::iter::repeat_n(bad, 2_000));
    let job = submit(&pool, &docs, user.id, &report(16), "translate", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Failed, "{view:?}");
    assert!(view.last_error.as_deref().unwrap_or("").contains("paragraphs apart"), "{view:?}");
    // At most 24 calls an attempt, three attempts.
    assert!(fake.calls() <= 3 * 24, "{} calls", fake.calls());
    assert_eq!(ledger_of(&pool, job).await.len(), 2, "debited and refunded");
}

/// Output tokens billed for `job` and not kept.
async fn discarded_of(pool: &PgPool, job: Uuid) -> i64 {
    sqlx::query_scalar("SELECT coalesce(sum(output_tokens), 0)::int8 FROM provider_output_discarded WHERE job_id = $1")
        .bind(job)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translations_expansion_is_learned_and_sizes_the_next_documents_parts_so_no_answer_is_cut(pool: PgPool) {
    // A language that writes twice as long, counted by a tokenizer counting 15 % more: about
    // 2.3 output tokens a token of ours; parts start sized for 1.4, and their answers are cut.
    let model = HostedModel { translation_growth: 2.0, token_inflation: 1.15, ..instant_model() };
    let (docs, fake, user, processor) = hosted(&pool, "expansion", Some(model), 4_000, 200_000).await;
    let processor = learning(processor, 1.0);
    let start = processor.token_ratio.expansion("French");
    let first = submit(&pool, &docs, user.id, &report(120), "translate", 200_000).await;
    let view = drive(&pool, &processor, first).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let learned = processor.token_ratio.expansion("French");
    assert!(learned > start + 0.4, "learned from the answers: {start} -> {learned}");
    let before = fake.model_report();
    assert!(before.cut > 0, "the first document's answers were cut: {before:?}");
    let second = submit(&pool, &docs, user.id, &report(120), "translate", 200_000).await;
    let view = drive(&pool, &processor, second).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let after = fake.model_report();
    assert_eq!(after.cut, before.cut, "no answer of the second document was cut: {before:?} {after:?}");
    // Whatever was cut was continued: billed against kept within 5 %.
    let billed = after.output_tokens as f64;
    let discarded = (discarded_of(&pool, first).await + discarded_of(&pool, second).await) as f64;
    assert!(billed / (billed - discarded) <= 1.05, "billed {billed}, not kept {discarded}");
    let result = view.result.unwrap()["markdown"].as_str().unwrap().to_string();
    assert_eq!(result.split("\n\n").count(), 120, "every paragraph once");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_streamed_answer_shows_how_far_it_is_written_while_it_runs(pool: PgPool) {
    let (docs, _fake, user, processor) = hosted(
        &pool,
        "progress",
        Some(HostedModel { output_tokens_per_sec: 300.0, ..instant_model() }),
        8_000,
        200_000,
    )
    .await;
    let job = submit(&pool, &docs, user.id, &report(40), "translate", 200_000).await;
    let work = tokio::spawn({
        let (pool, processor) = (pool.clone(), processor.clone());
        async move { drive(&pool, &processor, job).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let view = queue::get(&pool, job).await.unwrap();
        if let (Some(written), Some(expected)) = (view.written_tokens, view.expected_tokens) {
            seen.push((written, expected));
        }
        if view.state.is_terminal() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(work.await.unwrap().state, JobState::Done);
    assert!(seen.iter().any(|(w, e)| *w > 0 && w < e), "progress was shown while it was written: {seen:?}");
    assert!(seen.windows(2).all(|p| p[0].0 <= p[1].0 || p[1].0 == 0), "it only grows: {seen:?}");
    let done = queue::get(&pool, job).await.unwrap();
    assert_eq!((done.written_tokens, done.expected_tokens), (None, None), "an ended job shows none");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn cached_input_and_reasoning_are_read_and_the_cached_input_recorded_for_the_cost(pool: PgPool) {
    let (docs, fake, user, processor) = hosted(&pool, "cache", None, 4_000, 200_000).await;
    let job = submit(&pool, &docs, user.id, &report(3), "summarize", 200_000).await;
    // Anthropic's documented usage: fresh input, cache writes and cache reads apart.
    fake.push([Reply::Raw {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Summary: the report."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":50,"cache_creation_input_tokens":0,"cache_read_input_tokens":1200,"output_tokens":30}}"#.into(),
    }]);
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!((view.input_tokens, view.output_tokens), (Some(1250), Some(30)), "cached input is input");
    assert_eq!(view.result.unwrap()["details"]["cached_input_tokens"], 1200);
    let recorded: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT job_id, cached_input_tokens FROM provider_cache_reads").fetch_all(&pool).await.unwrap();
    assert_eq!(recorded, vec![(job, 1200)]);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_answer_asks_no_more_than_its_prompt_leaves_of_the_context(pool: PgPool) {
    // A 64,000-token answer limit in a 4K context: a 3.4K prompt leaves some 400 to ask for.
    let model = HostedModel { context_tokens: 4_000, ..instant_model() };
    let (docs, fake, user, processor) = hosted(&pool, "room", Some(model), 64_000, 4_000).await;
    let job = submit(&pool, &docs, user.id, &report(105), "summarize", 200_000).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?} {:?}", fake.model_report());
    let model = fake.model_report();
    assert!(model.largest_call <= 4_000, "every call's prompt and ask fit the context: {model:?}");
    // The whole document's prompt left too little room for its summary: cut there, it went
    // in parts (no attempt used).
    assert_eq!(model.cut, 1, "{model:?}");
    assert!(view.parts_total.unwrap_or(0) >= 2, "{view:?}");
    assert_eq!(attempts_of(&pool, job).await.1, 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_learned_ratio_is_kept_per_provider_and_model_for_the_next_start(pool: PgPool) {
    use engine::documents::ratio::TokenRatio;
    let kept = |model: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT samples FROM provider_token_ratios WHERE model = $1")
                .bind(model)
                .fetch_optional(&pool)
                .await
                .unwrap()
        }
    };
    // Nothing learned yet: the vendor's safe start.
    let ratio = TokenRatio::load(&pool, ProviderKind::Anthropic, "anthropic", "claude-sonnet-4-5").await;
    assert_eq!(ratio.get(), 1.25);
    for _ in 0..6 {
        ratio.observe(11_500, 10_000);
    }
    assert!(wait_for(Duration::from_secs(5), || async { kept("claude-sonnet-4-5").await == Some(6) }).await);
    // The next start begins where it left off; another model starts afresh.
    let again = TokenRatio::load(&pool, ProviderKind::Anthropic, "anthropic", "claude-sonnet-4-5").await;
    assert!((again.get() - ratio.get()).abs() < 1e-9 && again.get() < 1.2, "{}", again.get());
    assert_eq!(TokenRatio::load(&pool, ProviderKind::Anthropic, "anthropic", "claude-haiku-4-5").await.get(), 1.25);
    // A late write from fewer samples does not undo a newer one.
    sqlx::query("UPDATE provider_token_ratios SET samples = 100, ratio = 1.15").execute(&pool).await.unwrap();
    ratio.observe(30_000, 10_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(kept("claude-sonnet-4-5").await, Some(100));
}

/// Issue 58: a document in parts that took two attempts: the attempt that failed records the
/// tokens of the parts it answered, so its attempts' tokens add up to every part's (outcomes
/// and costs count them; before, the failed attempt counted none).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_failed_attempts_answered_parts_count_in_its_tokens(pool: PgPool) {
    let docs = docs("all-tokens");
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, "tokens@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, &report(30), "summarize", 500).await;
    // Part 2 fails once, answered with a stop reason nobody documented (billed, not kept): the
    // first attempt answers the others and fails; the second does part 2.
    let unfinished = Reply::Finished {
        text: "Half of it".into(),
        stop_reason: "pause_turn".into(),
        input_tokens: 300,
        output_tokens: 20,
    };
    fake.push_matching("part 2 of", [unfinished]);
    let processor = processor(&pool, &docs, fake_config(&fake), 500, Budget::disabled());
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let (parts_in, parts_out): (i64, i64) =
        sqlx::query_as("SELECT sum(input_tokens)::int8, sum(output_tokens)::int8 FROM job_parts WHERE job_id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();
    let (failed_in, attempts_in, attempts_out): (Option<i64>, i64, i64) = sqlx::query_as(
        "SELECT sum(input_tokens) FILTER (WHERE outcome <> 'succeeded')::int8,
                sum(input_tokens)::int8, sum(output_tokens)::int8
         FROM attempt_history WHERE job_id = $1",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(failed_in.unwrap_or(0) > 300, "the failed attempt's answered parts are counted on it");
    assert_eq!(
        (attempts_in, attempts_out),
        (parts_in + 300, parts_out + 20),
        "every part once, and the answer not kept as it was billed"
    );
}

// Several deployments (the providers file): a call goes to the first one awake with room; a
// deployment's failure moves the call on, within the attempt.

fn deployment(name: &str, fake: &FakeProvider) -> Deployment {
    Deployment {
        name: name.into(),
        config: ProviderConfig { max_tokens: 256, ..fake_config(fake) },
        limits: Default::default(),
        prices: Default::default(),
        batch: false,
    }
}

/// (deployment, answered) of each of a job's calls, in order.
async fn calls_of(pool: &PgPool, job: Uuid) -> Vec<(String, bool)> {
    router::calls_of(pool, job).await.unwrap().into_iter().map(|c| (c.deployment, c.answered)).collect()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translation_whose_primary_deployment_dies_midway_finishes_on_the_second_each_part_answered_once(
    pool: PgPool,
) {
    let docs = docs("fallback");
    let (primary, second) = (FakeProvider::start().await, FakeProvider::start().await);
    // Slow enough that calls are in flight when it dies.
    primary.behave_like(HostedModel { first_token_ms: 300, ..instant_model() });
    second.behave_like(instant_model());
    let rest =
        RestPolicy { failures_to_rest: 2, first_rest: Duration::from_secs(60), longest_rest: Duration::from_secs(60) };
    let deployments = [deployment("primary", &primary), deployment("second", &second)];
    let router = Router::start(pool.clone(), &deployments, rest).await.unwrap();
    let user = users::create_user(&pool, "fallback@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(40);
    let job = submit(&pool, &docs, user.id, &text, "translate", 200_000).await;
    let processor = processor_with(&pool, &docs, Arc::new(router), 200_000, Budget::disabled());
    // Killed once it has answered the key terms and a part: the parts it was writing break off.
    let killer = tokio::spawn({
        let (pool, primary) = (pool.clone(), primary.clone());
        async move {
            let answered =
                || async { calls_of(&pool, job).await.iter().filter(|(d, ok)| d == "primary" && *ok).count() };
            let deadline = Instant::now() + Duration::from_secs(30);
            while answered().await < 2 {
                assert!(Instant::now() < deadline, "the primary answers two calls");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            primary.kill();
        }
    });
    let view = drive(&pool, &processor, job).await;
    killer.await.unwrap();

    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!(
        words(view.result.as_ref().unwrap()["markdown"].as_str().unwrap()),
        words(&text),
        "every word, in order"
    );
    let total = view.parts_total.expect("in parts") as usize;
    let calls = calls_of(&pool, job).await;
    let answered_by = |name: &str| calls.iter().filter(|(d, ok)| d == name && *ok).count();
    assert!(answered_by("primary") >= 2, "{calls:?}");
    assert!(answered_by("second") >= 1, "{calls:?}");
    // No part answered twice: one answered call per part, and one for the key terms; and the
    // second, which never failed, was sent exactly the calls recorded as its answers.
    assert_eq!(answered_by("primary") + answered_by("second"), total + 1, "{calls:?}");
    assert_eq!(second.calls(), answered_by("second") as u64, "no call the router did not record");
    assert!(calls.iter().any(|(d, ok)| d == "primary" && !ok), "calls moved on from the dead primary: {calls:?}");
    assert_eq!(ledger_of(&pool, job).await, vec![("debit".to_string(), -view.cost as i64)], "one debit, nothing else");
    // It rests: the next document's calls go straight to the second.
    let states = router::states(&pool).await.unwrap();
    assert!(states[0].resting_for_secs.is_some() && states[0].failing_for_secs.is_some(), "{states:?}");
    let next = submit(&pool, &docs, user.id, "A short note to translate.", "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, next).await.state, JobState::Done);
    assert!(calls_of(&pool, next).await.iter().all(|(d, _)| d == "second"), "a resting deployment is not tried");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn calls_return_to_the_primary_after_its_rest_and_a_deployment_out_of_room_passes_them_on(pool: PgPool) {
    let docs = docs("rest");
    let (primary, second) = (FakeProvider::start().await, FakeProvider::start().await);
    primary.behave_like(instant_model());
    second.behave_like(instant_model());
    primary.kill();
    let rest =
        RestPolicy { failures_to_rest: 1, first_rest: Duration::from_secs(60), longest_rest: Duration::from_secs(60) };
    let deployments = [deployment("primary", &primary), deployment("second", &second)];
    let router = Arc::new(Router::start(pool.clone(), &deployments, rest).await.unwrap());
    let processor = processor_with(&pool, &docs, router.clone(), 200_000, Budget::disabled());
    let user = users::create_user(&pool, "rest@example.com", "password123", Role::User, 20).await.unwrap();
    let note = |n: u32| format!("Short note number {n} to translate.");

    let down = submit(&pool, &docs, user.id, &note(1), "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, down).await.state, JobState::Done);
    assert_eq!(calls_of(&pool, down).await, [("primary".into(), false), ("second".into(), true)], "moved on at once");
    let failure = router::calls_of(&pool, down).await.unwrap()[0].failure.clone().unwrap();
    assert!(!failure.is_empty(), "why it moved on is kept");

    primary.revive().await;
    let resting = submit(&pool, &docs, user.id, &note(2), "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, resting).await.state, JobState::Done);
    assert_eq!(calls_of(&pool, resting).await, [("second".into(), true)], "resting: not tried");

    // Its rest over (a minute, ended here rather than waited for).
    sqlx::query("UPDATE provider_deployments SET resting_until = now() WHERE name = 'primary'")
        .execute(&pool)
        .await
        .unwrap();
    let back = submit(&pool, &docs, user.id, &note(3), "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, back).await.state, JobState::Done);
    assert_eq!(calls_of(&pool, back).await, [("primary".into(), true)], "its rest over, the primary answers again");
    let states = router::states(&pool).await.unwrap();
    assert_eq!((states[0].failures_in_a_row, states[0].failing_for_secs), (0, None), "{states:?}");

    // One request a minute on the primary: the first call takes it, the next goes on.
    let limited = [
        Deployment {
            limits: engine::documents::providers::deployments::Limits {
                requests_per_min: Some(1),
                ..Default::default()
            },
            ..deployment("primary", &primary)
        },
        deployment("second", &second),
    ];
    let router = Arc::new(Router::start(pool.clone(), &limited, rest).await.unwrap());
    let processor = processor_with(&pool, &docs, router, 200_000, Budget::disabled());
    let first = submit(&pool, &docs, user.id, &note(4), "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, first).await.state, JobState::Done);
    let then = submit(&pool, &docs, user.id, &note(5), "translate", 200_000).await;
    assert_eq!(drive(&pool, &processor, then).await.state, JobState::Done);
    assert_eq!(calls_of(&pool, first).await, [("primary".into(), true)]);
    assert_eq!(calls_of(&pool, then).await, [("second".into(), true)], "out of room: passed on, not failed");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn with_every_deployment_down_a_document_waits_for_its_retry_and_is_not_charged_twice(pool: PgPool) {
    let docs = docs("all-down");
    let (primary, second) = (FakeProvider::start().await, FakeProvider::start().await);
    primary.kill();
    second.kill();
    let deployments = [deployment("primary", &primary), deployment("second", &second)];
    let router = Router::start(pool.clone(), &deployments, RestPolicy::default()).await.unwrap();
    let processor = processor_with(&pool, &docs, Arc::new(router), 200_000, Budget::disabled());
    let user = users::create_user(&pool, "down@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit(&pool, &docs, user.id, "A note to translate.", "translate", 200_000).await;
    work_once(&pool, &fast_worker("down", 1), Arc::new(processor), Arc::new(AccountHooks), 1).await.unwrap();
    let view = queue::get(&pool, job).await.unwrap();
    assert_eq!(view.state, JobState::Retrying, "{view:?}");
    let error = view.last_error.clone().unwrap_or_default();
    assert!(error.contains("(all 2 provider deployments failed)"), "{error}");
    assert!(!error.contains("primary"), "users are not told the deployments' names: {error}");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "one debit, no refund yet");
}

// The economy lane: a document's first round of calls goes to the provider's batch API as one
// batch; its answers are taken by the job's next claim and checked as interactive ones are.

const HALF: sluice_types::capacity::EconomyTerms =
    sluice_types::capacity::EconomyTerms { discount: 0.5, window_hours: 24.0 };

fn economy_processor(pool: &PgPool, docs: &TempBlobs, fake: &FakeProvider) -> DocumentProcessor {
    DocumentProcessor {
        economy: Some(EconomyLane::new(pool.clone(), Duration::from_secs(3600))),
        ..processor(pool, docs, ProviderConfig { max_tokens: 256, ..fake_config(fake) }, 200_000, Budget::disabled())
    }
}

/// Poll the open batches until one ends.
async fn until_a_batch_ends(pool: &PgPool, processor: &DocumentProcessor) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while economy::poll_batches(pool, processor.provider.as_ref(), Duration::ZERO).await.unwrap() == 0 {
        assert!(Instant::now() < deadline, "the batch ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_economy_translation_goes_whole_into_one_batch_and_comes_back_checked_at_half_the_price(pool: PgPool) {
    let docs = docs("economy");
    let fake = FakeProvider::start().await;
    fake.behave_like(instant_model());
    fake.batch_timing(fakeprovider::BatchTiming { delay: Duration::from_millis(200), window: Duration::from_secs(30) });
    let user = users::create_user(&pool, "economy@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(40);
    let job = submit_in_lane(&pool, &docs, user.id, &text, "translate", 200_000, true).await;
    let processor = economy_processor(&pool, &docs, &fake);

    // Its first claim plans it and sends every part's call as one batch: no attempt used, the
    // job waits for the batch (until the window's end at most), and says so.
    work_once(&pool, &fast_worker("economy", 4), Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
    let waiting = queue::get(&pool, job).await.unwrap();
    let total = waiting.parts_total.expect("planned in parts") as u64;
    assert!(total >= 5, "{total} parts");
    assert_eq!(waiting.state, JobState::Queued, "{waiting:?}");
    assert!(waiting.run_at > chrono::Utc::now() + chrono::TimeDelta::minutes(50), "it waits for its batch");
    assert_eq!(fake.batch_requests(), total, "every part in one batch");
    assert!(economy::in_batch_since(&pool, &[job]).await.unwrap().contains_key(&job));

    // The poller finds the batch ended and makes the job due; a process started afresh (a
    // restart: nothing in memory) finishes it from the batch's answers.
    until_a_batch_ends(&pool, &processor).await;
    assert!(queue::get(&pool, job).await.unwrap().run_at <= chrono::Utc::now());
    assert!(economy::in_batch_since(&pool, &[job]).await.unwrap().is_empty());
    let restarted = economy_processor(&pool, &docs, &fake);
    let view = drive(&pool, &restarted, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!(
        words(view.result.as_ref().unwrap()["markdown"].as_str().unwrap()),
        words(&text),
        "every word, in order"
    );
    // Only the key terms were asked at once; every part was answered by the batch, once.
    assert_eq!(fake.calls(), total + 1, "the batch's requests and the one call for the key terms");
    let cost = HALF.price(PriceTable::default().price(sluice_types::capacity::estimate_input_tokens(
        sluice_types::capacity::SizeKind::Text,
        text.len() as u64,
    )));
    assert_eq!(view.cost as i64, cost);
    assert_eq!(ledger_of(&pool, job).await, vec![("debit".to_string(), -cost)], "one debit, at half the price");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM batch_requests WHERE job_id = $1 AND answer IS NOT NULL")
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kept, 0, "the batch's answers are not kept twice once taken");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn what_the_batch_did_not_answer_is_asked_at_once_at_no_extra_charge(pool: PgPool) {
    let docs = docs("economy-fallback");
    let fake = FakeProvider::start().await;
    fake.behave_like(instant_model());
    fake.batch_timing(fakeprovider::BatchTiming { delay: Duration::from_millis(100), window: Duration::from_secs(30) });
    // Inside the batch, part 2's request fails.
    fake.push_matching("part 2 of", [Reply::ServerError]);
    let user = users::create_user(&pool, "fallback-economy@example.com", "password123", Role::User, 20).await.unwrap();
    let text = report(40);
    let job = submit_in_lane(&pool, &docs, user.id, &text, "translate", 200_000, true).await;
    let processor = economy_processor(&pool, &docs, &fake);
    work_once(&pool, &fast_worker("economy", 4), Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
    let total = queue::get(&pool, job).await.unwrap().parts_total.unwrap() as u64;
    until_a_batch_ends(&pool, &processor).await;
    let failure: Option<String> =
        sqlx::query_scalar("SELECT failure FROM batch_requests WHERE job_id = $1 AND failure IS NOT NULL")
            .bind(job)
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert!(failure.is_some(), "the batch's failure is on the record");
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    assert_eq!(words(view.result.as_ref().unwrap()["markdown"].as_str().unwrap()), words(&text));
    assert_eq!(fake.calls(), total + 2, "the batch's requests, the key terms, and part 2 asked again at once");
    assert_eq!(ledger_of(&pool, job).await.len(), 1, "one debit: the call asked again costs the user nothing");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_batch_answer_holding_a_nul_is_kept_without_it_and_the_summary_is_done(pool: PgPool) {
    let docs = docs("economy-nul");
    let fake = FakeProvider::start().await;
    fake.batch_timing(fakeprovider::BatchTiming { delay: Duration::from_millis(100), window: Duration::from_secs(30) });
    // Postgres keeps no NUL in jsonb: a model writing one must not stall the lane.
    let finished = |text: &str| Reply::Finished {
        text: text.into(),
        stop_reason: "end_turn".into(),
        input_tokens: 100,
        output_tokens: 10,
    };
    fake.push_matching("part 1 of", [finished("The first part\u{0} in short.")]);
    let user = users::create_user(&pool, "nul@example.com", "password123", Role::User, 20).await.unwrap();
    let job = submit_in_lane(&pool, &docs, user.id, &report(60), "summarize", 600, true).await;
    let processor = DocumentProcessor { context_tokens: Some(600), ..economy_processor(&pool, &docs, &fake) };
    work_once(&pool, &fast_worker("economy", 4), Arc::new(processor.clone()), Arc::new(AccountHooks), 4).await.unwrap();
    until_a_batch_ends(&pool, &processor).await;
    let view = drive(&pool, &processor, job).await;
    assert_eq!(view.state, JobState::Done, "{view:?}");
    let first: String = sqlx::query_scalar("SELECT output FROM job_parts WHERE job_id = $1 AND level = 0 AND idx = 0")
        .bind(job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(first, "The first part in short.", "the batch's answer, without its NUL");
}
