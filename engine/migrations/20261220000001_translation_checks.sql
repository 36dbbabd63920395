-- Translations a professional would sign off on (issue 57).

-- Output tokens a provider billed for answers that were not kept (a cut or flawed translation's
-- paragraphs asked again), per call: the job and the console's outcomes show output billed
-- against output kept. Kept apart from the jobs, pruned with the other evidence.
CREATE TABLE provider_output_discarded (
    id            bigserial PRIMARY KEY,
    job_id        uuid NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    output_tokens bigint NOT NULL CHECK (output_tokens > 0)
);
CREATE INDEX provider_output_discarded_at ON provider_output_discarded (at);
CREATE INDEX provider_output_discarded_job ON provider_output_discarded (job_id);
-- The job's own sum, shown on its page beside the output billed; and its paragraphs whose
-- inline formatting (bold, italics, links) came back wrong from the model and are plain.
ALTER TABLE jobs ADD COLUMN output_tokens_discarded bigint NOT NULL DEFAULT 0,
                 ADD COLUMN paragraphs_plain int NOT NULL DEFAULT 0,
                 -- Glossary entries an answer left out even asked again (`Supplier → Lieferant`).
                 ADD COLUMN terms_missed text[] NOT NULL DEFAULT '{}',
                 -- A translation in parts: the key terms one call found in its opening, kept
                 -- the same in every part (none yet: not looked for).
                 ADD COLUMN found_terms jsonb;

-- Glossaries saved by name in a user's account (DeepL's format when sent; entries as JSON).
CREATE TABLE glossaries (
    owner_id   bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 60),
    entries    jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_id, name)
);

-- Beside the provider's count of a prompt, what it bills for a translation per prompt token,
-- per target language (`translation:german`): learned from usage, parts are sized by it.
ALTER TABLE provider_token_ratios ADD COLUMN measure text NOT NULL DEFAULT 'prompt';
ALTER TABLE provider_token_ratios DROP CONSTRAINT provider_token_ratios_pkey;
ALTER TABLE provider_token_ratios ADD PRIMARY KEY (provider, model, measure);
