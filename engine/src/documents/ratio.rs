//! What a provider's tokenizer counts against ours. Parts are planned by our count
//! (`o200k_base`); Anthropic's tokenizer counts English prose at more tokens, and parts planned
//! at 90 % of a context by our count can go over it by theirs. The ratio of the input tokens a
//! provider reports to our count of the same prompt is learned from its usage, per provider and
//! model, kept in the database, and parts are planned with it.
//!
//! Beside it, per target language, a translation's *expansion*: the output tokens the provider
//! bills for a translation per token of its prompt by our count (German writes about a third
//! more than English, and a tokenizer counting more counts its answer so too). A translation's
//! parts are sized by it, so an answer fits what one call may write and nothing is paid twice.

use std::sync::{Arc, Mutex};

use sqlx::PgPool;

use super::providers::ProviderKind;

/// The ratio a provider starts at before anything is learned: a safe guess per vendor
/// (Anthropic's tokenizer counts prose some 15-25 % above `o200k_base`; OpenAI's is ours).
pub fn starting_ratio(kind: ProviderKind) -> f64 {
    match kind {
        ProviderKind::Anthropic => 1.25,
        ProviderKind::Openai | ProviderKind::Local => 1.0,
    }
}

/// Prompts shorter than this teach nothing (the message framing's few tokens dominate).
pub const MIN_SAMPLE_TOKENS: i64 = 1_000;
/// The ratios believed at all: outside them a report is broken, not a tokenizer.
const BELIEVABLE: (f64, f64) = (0.5, 4.0);

/// Pure: one report's ratio, if it teaches anything.
pub fn sample(reported: i64, counted: i64) -> Option<f64> {
    (counted >= MIN_SAMPLE_TOKENS && reported > 0)
        .then(|| reported as f64 / counted as f64)
        .filter(|r| (BELIEVABLE.0..=BELIEVABLE.1).contains(r))
}

/// Pure: the ratio after one more sample. The first samples move it most (a new model's
/// ratio is learned within a few calls); later ones a fifth of the way each.
pub fn learn(current: f64, samples: i64, observed: f64) -> f64 {
    let weight = if samples < 4 { 0.5 } else { 0.2 };
    (current + (observed - current) * weight).clamp(BELIEVABLE.0, BELIEVABLE.1)
}

/// Which learned ratio applies: the provider's and model's names, and the vendor's start.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenizer {
    pub provider: String,
    pub model: String,
    pub start: f64,
}

/// The ratio learned for `tokenizer` and its samples, or its start when none is.
pub async fn learned(pool: &PgPool, tokenizer: &Tokenizer) -> crate::error::Result<(f64, i64)> {
    let row: Option<(f64, i64)> = sqlx::query_as(
        "SELECT ratio, samples FROM provider_token_ratios WHERE provider = $1 AND model = $2 AND measure = $3",
    )
    .bind(&tokenizer.provider)
    .bind(&tokenizer.model)
    .bind(PROMPT_MEASURE)
    .fetch_optional(pool)
    .await?;
    Ok(row.unwrap_or((tokenizer.start, 0)))
}

#[derive(Debug)]
struct Learned {
    ratio: f64,
    samples: i64,
    /// It learns from usage (not: a ratio fixed for a test or a provider without a tokenizer).
    learns: bool,
}

/// What a prompt is measured by: the provider's count of its input, or of a translation's
/// answer into a language.
const PROMPT_MEASURE: &str = "prompt";

/// The measure of a translation into `language` (lower case, trimmed).
fn expansion_measure(language: &str) -> String {
    format!("translation:{}", language.trim().to_lowercase())
}

/// The ratio in use by a processor, shared by its calls, kept in `provider_token_ratios`, and
/// the translations' expansions per language beside it.
#[derive(Clone, Debug)]
pub struct TokenRatio {
    learned: Arc<Mutex<Learned>>,
    /// Per measure of a translation ([`expansion_measure`]), as learned so far.
    expansions: Arc<Mutex<std::collections::HashMap<String, Learned>>>,
    /// Where it is kept (none: in memory only, as in some tests).
    store: Option<(PgPool, String, String)>,
}

impl TokenRatio {
    /// A ratio that never changes.
    pub fn fixed(ratio: f64) -> TokenRatio {
        TokenRatio {
            learned: Arc::new(Mutex::new(Learned { ratio, samples: 0, learns: false })),
            expansions: Arc::default(),
            store: None,
        }
    }

    /// A ratio learned in memory only, from `start`.
    pub fn in_memory(start: f64) -> TokenRatio {
        TokenRatio {
            learned: Arc::new(Mutex::new(Learned { ratio: start, samples: 0, learns: true })),
            expansions: Arc::default(),
            store: None,
        }
    }

    /// The ratio learned for this provider and model, or its vendor's starting one.
    pub async fn load(pool: &PgPool, kind: ProviderKind, provider: &str, model: &str) -> TokenRatio {
        let tokenizer = Tokenizer { provider: provider.into(), model: model.into(), start: starting_ratio(kind) };
        let (ratio, samples) = learned(pool, &tokenizer).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read the provider's token ratio; starting afresh");
            (tokenizer.start, 0)
        });
        let expansions: Vec<(String, f64, i64)> = sqlx::query_as(
            "SELECT measure, ratio, samples FROM provider_token_ratios
             WHERE provider = $1 AND model = $2 AND measure <> $3",
        )
        .bind(provider)
        .bind(model)
        .bind(PROMPT_MEASURE)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not read the translations' expansions; starting afresh");
            Vec::new()
        });
        let expansions = expansions
            .into_iter()
            .map(|(measure, ratio, samples)| (measure, Learned { ratio, samples, learns: true }))
            .collect();
        TokenRatio {
            learned: Arc::new(Mutex::new(Learned { ratio, samples, learns: true })),
            expansions: Arc::new(Mutex::new(expansions)),
            store: Some((pool.clone(), provider.to_string(), model.to_string())),
        }
    }

    /// A translation into `language`'s expansion: output tokens billed per token of its prompt
    /// by our count, as learned, or a conservative start (the language's growth, counted as
    /// the provider counts).
    pub fn expansion(&self, language: &str) -> f64 {
        let measure = expansion_measure(language);
        let learned = self.expansions.lock().unwrap().get(&measure).map(|l| l.ratio);
        learned.unwrap_or_else(|| self.get() * super::providers::vendor::translation_expansion(Some(language)))
    }

    /// A translation into `language` whose prompt we counted at `counted` tokens came back
    /// whole in `billed` output tokens.
    pub fn observe_expansion(&self, language: &str, billed: i64, counted: i64) {
        let Some(observed) = sample(billed, counted) else { return };
        if !self.learned.lock().unwrap().learns {
            return;
        }
        let measure = expansion_measure(language);
        let start = self.expansion(language);
        let (ratio, samples) = {
            let mut expansions = self.expansions.lock().unwrap();
            let learned =
                expansions.entry(measure.clone()).or_insert(Learned { ratio: start, samples: 0, learns: true });
            learned.ratio = learn(learned.ratio, learned.samples, observed);
            learned.samples += 1;
            (learned.ratio, learned.samples)
        };
        self.keep_measure(&measure, ratio, samples);
    }

    /// The ratio now.
    pub fn get(&self) -> f64 {
        self.learned.lock().unwrap().ratio
    }

    /// The provider reported `reported` input tokens for a prompt we counted at `counted`.
    pub fn observe(&self, reported: i64, counted: i64) {
        let Some(observed) = sample(reported, counted) else { return };
        let (ratio, samples) = {
            let mut learned = self.learned.lock().unwrap();
            if !learned.learns {
                return;
            }
            learned.ratio = learn(learned.ratio, learned.samples, observed);
            learned.samples += 1;
            (learned.ratio, learned.samples)
        };
        self.keep(ratio, samples);
    }

    /// The provider refused a prompt we counted at `counted` as `reported` tokens, past its
    /// context: the ratio is at least that at once (the next split must fit).
    pub fn at_least(&self, reported: u64, counted: i64) {
        let Some(observed) = sample(reported.min(i64::MAX as u64) as i64, counted) else { return };
        let (ratio, samples) = {
            let mut learned = self.learned.lock().unwrap();
            if !learned.learns {
                return;
            }
            learned.ratio = learned.ratio.max(observed);
            learned.samples += 1;
            (learned.ratio, learned.samples)
        };
        self.keep(ratio, samples);
    }

    fn keep(&self, ratio: f64, samples: i64) {
        self.keep_measure(PROMPT_MEASURE, ratio, samples);
    }

    /// Keep a measure for the next start (off the call's path; a failure only loses a sample).
    /// Writes may land out of order: one from fewer samples than the row's is older, and left
    /// out.
    fn keep_measure(&self, measure: &str, ratio: f64, samples: i64) {
        let Some((pool, provider, model)) = self.store.clone() else { return };
        let measure = measure.to_string();
        tokio::spawn(async move {
            let kept = sqlx::query(
                "INSERT INTO provider_token_ratios (provider, model, measure, ratio, samples) VALUES ($1, $2, $5, $3, $4)
                 ON CONFLICT (provider, model, measure) DO UPDATE SET ratio = $3, samples = $4, updated_at = now()
                 WHERE provider_token_ratios.samples <= excluded.samples",
            )
            .bind(provider)
            .bind(model)
            .bind(ratio)
            .bind(samples)
            .bind(measure)
            .execute(&pool)
            .await;
            if let Err(e) = kept {
                tracing::debug!(error = %e, "could not keep the provider's token ratio");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_ratio_is_learned_within_a_few_calls_and_noise_teaches_nothing() {
        let mut ratio = starting_ratio(ProviderKind::Openai);
        for n in 0..6 {
            ratio = learn(ratio, n, sample(115_000, 100_000).unwrap());
        }
        assert!((ratio - 1.15).abs() < 0.01, "{ratio}");
        assert_eq!(sample(150, 100), None, "a short prompt is mostly framing");
        assert_eq!(sample(1_000_000, 1_000), None, "a thousandfold report is broken");
        assert_eq!(sample(0, 5_000), None);
    }

    #[test]
    fn a_refusal_raises_the_ratio_at_once_and_it_is_kept_in_memory() {
        let fixed = TokenRatio::fixed(1.0);
        fixed.at_least(200_000, 100_000);
        assert_eq!(fixed.get(), 1.0);
        let ratio = TokenRatio::in_memory(1.0);
        ratio.observe(1_100, 1_000);
        assert!((ratio.get() - 1.05).abs() < 1e-9);
        ratio.at_least(207_000, 180_000);
        assert!((ratio.get() - 1.15).abs() < 1e-9);
        ratio.at_least(100_000, 180_000);
        assert!((ratio.get() - 1.15).abs() < 1e-9, "a refusal never lowers it");
    }

    #[test]
    fn an_expansion_starts_conservative_per_language_and_is_learned_apart() {
        let ratio = TokenRatio::in_memory(1.15);
        let start = ratio.expansion("German");
        assert!(start >= 1.15 * 1.3, "{start}");
        for _ in 0..8 {
            ratio.observe_expansion("German", 1_550, 1_000);
        }
        assert!((ratio.expansion(" german ") - 1.55).abs() < 0.02, "{}", ratio.expansion("german"));
        assert_eq!(
            ratio.expansion("Japanese"),
            1.15 * super::super::providers::vendor::translation_expansion(Some("Japanese"))
        );
        let fixed = TokenRatio::fixed(1.0);
        fixed.observe_expansion("German", 3_000, 1_000);
        assert_eq!(fixed.expansion("German"), start / 1.15, "a fixed ratio learns nothing");
    }

    proptest! {
        #[test]
        fn the_ratio_stays_believable(start in 0.5f64..4.0, samples in 0i64..100, observed in -1e9f64..1e9) {
            let r = learn(start, samples, observed);
            prop_assert!((0.5..=4.0).contains(&r));
        }
    }
}
