import pg from 'pg';
import { expect, fromEnv, logInAsAdmin, newPage, open, signUp, test, uploadFiles } from './helpers';

test('the capacity planner sizes the gate from measured attempts, and other limits show their result at once', async ({ browser }) => {
  // Ten attempts the size of seed 000's (316 s, 129K tokens in, 16K out) under a preset name of
  // their own, written to the suite's database so the figures are known exactly.
  const db = new pg.Client({ connectionString: fromEnv('DATABASE_URL') });
  await db.connect();
  try {
    const owner = (await db.query('SELECT id FROM users ORDER BY id LIMIT 1')).rows[0].id;
    await db.query(
      `WITH j AS (
         INSERT INTO jobs (owner_id, state, payload, accepted_at, started_at, finished_at)
         SELECT $1, 'done', '{"preset": "planner_probe"}', now() - interval '10 minutes', now() - interval '316 seconds', now()
         FROM generate_series(1, 10) RETURNING id)
       INSERT INTO job_attempts (id, job_id, attempt, worker, started_at, finished_at, outcome, input_tokens, output_tokens)
       SELECT gen_random_uuid(), j.id, 1, 'e2e', now() - interval '316 seconds', now(), 'succeeded', 129000, 16000 FROM j`,
      [owner],
    );
    const admin = await newPage(browser);
    await logInAsAdmin(admin);
    await open(admin, '/admin/capacity');
    // The gate beside the worker slots alive: the suite's one server process has the default
    // 70 slots, so the gate in force decides how many run.
    const concurrency = admin.getByTestId('concurrency');
    await expect(concurrency.getByTestId('worker-slots')).toHaveText('70 in 1 process');
    await expect(concurrency.getByTestId('effective-concurrency')).toHaveText(
      await concurrency.getByTestId('gate-size').innerText(),
    );
    await expect(admin.getByTestId('slots-short')).toHaveCount(0);

    const card = admin.getByTestId('capacity');
    await expect(card.getByTestId('budget')).toHaveText('No provider limits are configured: claims are held only by the gate.');
    const row = card.locator('[data-preset="planner_probe"]');
    await expect(row).toContainText('10');
    await expect(row).toContainText('316.0 / 316.0 / 316.0');
    // Seed 003: this server's provider timeout (5 s, plus 300 s per 100K tokens) is 392 s at
    // 129K tokens, and 316 s is over half of it: the card warns.
    await expect(card.getByTestId('timeout-warnings')).toContainText(
      'p99 attempt 316 s is over half the provider timeout (392 s at 129000 tokens)',
    );
    // Unlimited (this server sets no limits): nothing binds, nothing to recommend.
    await expect(row.getByTestId('at-p90')).toHaveText('unlimited');

    // Anthropic's Tier 4 for Sonnet: input tokens bind at about 82 slots, as in the seed.
    await card.getByTestId('limit-rpm').fill('4000');
    await card.getByTestId('limit-itpm').fill('2,000,000');
    await card.getByTestId('limit-otpm').fill('400k');
    await expect(row.getByTestId('at-p90')).toHaveText('81.7 (input tokens per minute)');
    await expect(row.getByTestId('recommended-gate')).toHaveText('20');

    // "What if we move to the next tier": twice the input tokens, and output tokens bind.
    await card.getByTestId('limit-itpm').fill('4M');
    await expect(row.getByTestId('at-p90')).toHaveText('131.7 (output tokens per minute)');
    await expect(row.getByTestId('recommended-gate')).toHaveText('32');
    await card.getByTestId('limit-otpm').fill('');
    await expect(row.getByTestId('at-p90')).toHaveText('163.3 (input tokens per minute)');
    await expect(row.getByTestId('recommended-gate')).toHaveText('40');
    await card.getByTestId('limit-rpm').fill('lots');
    await expect(card.getByTestId('planner-error')).toContainText('is not a limit');

    // After a 429 the gate card says what is in force, since when and why (the cut written as
    // the worker writes it; the suite's gate grows back a slot a second).
    await db.query(
      `UPDATE queue_settings SET adaptive_gate = 1, adaptive_since = now(),
         adaptive_reason = 'the provider answered 429 (too many requests): gate cut from 2 to 1; it grows back one slot at a time'`,
    );
    await open(admin, '/admin/capacity');
    await expect(admin.getByTestId('gate-reduced')).toHaveText(
      /^In force now: \d+, since .+: the provider answered 429 \(too many requests\): gate cut from 2 to 1; it grows back one slot at a time\.$/,
    );
  } finally {
    await db.query('UPDATE queue_settings SET adaptive_gate = NULL, adaptive_since = NULL, adaptive_reason = NULL');
    await db.query(`DELETE FROM jobs WHERE payload->>'preset' = 'planner_probe'`);
    await db.end();
  }
});

test('the upload page shows the price by size before uploading, and the answer what was charged', async ({ page }) => {
  await signUp(page, 'prices');
  await open(page, '/upload');
  await expect(page.locator('.dropzone .hint')).toHaveText(
    'Up to 50 MB each. Priced by size: 1 credit up to 97 KB of text (975 KB as PDF), 2 credits up to 390 KB (3.8 MB), 4 credits up to 781 KB (7.6 MB), and 4 more for each 781 KB (7.6 MB) after that. Scans (PDF pages without text, PNG, JPEG, TIFF) are read by OCR at 0.3 credits a page.',
  );
  await expect(page.getByTestId('refund-policy')).toContainText('Unreadable files are refunded 3 times a day; after that they are charged.');
  // 120 KB of text is past the first step: 2 credits, shown as soon as the file is chosen.
  const text = 'A long report. '.repeat(8192);
  await uploadFiles(page, { name: 'report.txt', mimeType: 'text/plain', buffer: Buffer.from(text) });
  const row = page.locator('.upload').filter({ hasText: 'report.txt' });
  await expect(row.getByTestId('price')).toHaveText('2 credits');
  await expect(row).toContainText('Accepted and queued. 2 credits charged.');
  await expect(page.getByTestId('who')).toContainText('18 credits');
});
