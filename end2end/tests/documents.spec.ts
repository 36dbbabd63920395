import * as path from 'path';
import { allowConsoleError, chooseFiles, expect, hostedModel, hostedModelReport, logInAsAdmin, newPage, open, scriptProvider, setProcessing, signUp, test, uniqueText, uploadFiles, wordFile, wordFileOf, zipEntry } from './helpers';


test('sign up, upload a PDF, watch it finish and open the result', async ({ page }) => {
  const email = await signUp(page, 'pdf');
  await expect(page.getByTestId('who')).toContainText(email);
  await expect(page.getByText('No jobs yet')).toBeVisible();

  await scriptProvider([
    { kind: 'success', text: '# Quarterly report\nRevenue grew by 12 percent.', input_tokens: 180, output_tokens: 12 },
  ]);
  await page.getByRole('link', { name: 'Upload documents' }).click();
  await expect(page).toHaveURL(/\/upload$/);
  // The page uploads through the upload server function, not the REST endpoint.
  const sent = page.waitForRequest((r) => r.method() === 'POST' && new URL(r.url()).pathname === '/api/upload_document');
  await uploadFiles(page, path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  expect((await sent).headers()['content-type']).toMatch(/^multipart\/form-data; boundary=/);
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await expect(row).toContainText('Accepted and queued.');
  // The header's balance follows the accepted upload at once.
  await expect(page.getByTestId('who')).toContainText('19 credits');

  await row.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  // The Markdown is rendered: a heading and a paragraph, not raw text.
  const result = page.locator('article.result-rendered');
  await expect(result.locator('h1')).toHaveText('Quarterly report');
  await expect(result.locator('p')).toHaveText('Revenue grew by 12 percent.');
  await expect(page.getByTestId('cost')).toHaveText('Cost 1 credit · 180 tokens in, 12 out');
  await expect(page.getByRole('link', { name: 'Download the result' })).toBeVisible();
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write']);
  await page.getByRole('button', { name: 'Copy the result' }).click();
  await expect(page.getByRole('button', { name: 'Copied' })).toBeVisible();
  expect(await page.evaluate(() => navigator.clipboard.readText())).toContain('# Quarterly report');

  await page.getByRole('link', { name: '← All jobs' }).click();
  const job = page.locator('.job').first();
  await expect(job.locator('.file-name')).toHaveText('report.pdf');
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'done');
  await expect(job.locator('.state-detail')).toHaveText(/^Done in \d+ s\.$/);
  await expect(job.getByRole('link', { name: 'Open the result' })).toHaveAttribute('href', /^\/jobs\/[0-9a-f-]{36}$/);
  await expect(page.getByTestId('who')).toContainText('19 credits');
});

test('an SVG file renamed .pdf is refused with the 415 message and costs nothing', async ({ page }) => {
  allowConsoleError(/status of 415 \(Unsupported Media Type\)/);
  await signUp(page, 'svg');
  await open(page, '/upload');
  await uploadFiles(page, {
    name: 'invoice.pdf',
    mimeType: 'application/pdf',
    buffer: Buffer.from('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'),
  });
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'refused');
  await expect(row).toContainText('Not a supported document');
  await expect(row).toContainText('SVG');
  await page.goto('/jobs');
  await expect(page.getByText('No jobs yet')).toBeVisible();
  await expect(page.getByTestId('who')).toContainText('20 credits');
});

test('wrong passwords get a helpful message', async ({ page }) => {
  allowConsoleError(/status of 401 \(Unauthorized\)/);
  await open(page, '/login');
  await page.getByLabel('E-mail address').fill(`nobody-${Date.now()}@example.com`);
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page.getByRole('alert')).toHaveText('That e-mail address and password do not match an account.');
});

test('the provider failing shows retrying with a countdown, then failed with the refund notice and the balance restored', async ({ page }) => {
  await signUp(page, 'retry');
  await scriptProvider([
    { kind: 'rate_limited_seconds', seconds: 1 },
    { kind: 'overloaded' },
    { kind: 'server_error' },
  ]);
  await open(page, '/upload');
  await uploadFiles(page, path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');

  await page.goto('/jobs');
  const job = page.locator('.job').first();
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'retrying', { timeout: 10_000 });
  await expect(job.locator('.state-detail')).toContainText(/Attempt \d of 3 failed: .*Next attempt in \d+ s\./);
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'failed', { timeout: 20_000 });
  await expect(job.locator('.state-detail')).toHaveText(/^Gave up after 3 attempts: the provider had an error \(500\)\. 1 credit refunded\.$/);
  // The header is refreshed on navigation.
  await page.getByRole('link', { name: 'Notices' }).click();
  await expect(page).toHaveURL(/\/notices$/);
  await expect(page.getByTestId('unread')).toHaveText('1');
  await expect(page.getByTestId('who')).toContainText('20 credits');
  await expect(page.locator('.notices li.unread')).toContainText('1 credit refunded');
  // The month's totals: one document, charged and refunded.
  await open(page, '/credits');
  const month = page.getByTestId('months').locator('tbody tr').first();
  await expect(month.locator('td')).toHaveText([/^\d{4}-\d{2}$/, '1', '1', '1', /^\d+$/, /^\d+$/]);
});

test('the jobs list polls every 2 s while a job can change (without moving the layout), every 10 s while the tab is hidden, and stops when all are final', async ({ page, browser }) => {
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await setProcessing(admin, false);
  try {
    await signUp(page, 'poll');
    await open(page, '/upload');
    await uploadFiles(page, uniqueText('poll.txt'));
    await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(1);
    // The page's timers run on a clock the test moves, so every count below is exact.
    await page.clock.install();
    await open(page, '/jobs');
    const badge = page.locator('.job .badge');
    await expect(badge).toHaveAttribute('data-state', 'queued');
    await page.clock.pauseAt(Date.now() + 1000);

    let polls = 0;
    page.on('request', (r) => {
      if (r.url().endsWith('/api/list_jobs')) polls++;
    });
    const pollsAfter = async (expected: number) => {
      await expect.poll(() => polls).toBe(expected);
      await page.waitForTimeout(300); // and no more
      expect(polls).toBe(expected);
    };
    // Watch for anything a refresh might do to the layout: the list leaving the page (a loading
    // placeholder in its place) or changing height.
    const before = await page.locator('.jobs').boundingBox();
    await page.evaluate(() => {
      const w = window as unknown as { listGone: number };
      w.listGone = 0;
      new MutationObserver(() => {
        if (!document.querySelector('ul.jobs')) w.listGone++;
      }).observe(document.body, { childList: true, subtree: true });
    });
    // Two seconds at a time (all at once, the answers would overlap and be merged).
    for (const expected of [1, 2, 3]) {
      await page.clock.runFor(2000);
      await pollsAfter(expected);
    }
    expect(await page.evaluate(() => (window as unknown as { listGone: number }).listGone)).toBe(0);
    expect((await page.locator('.jobs').boundingBox())!.height).toBe(before!.height);

    const setVisibility = (state: 'hidden' | 'visible') =>
      page.evaluate((s) => {
        Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => s });
        document.dispatchEvent(new Event('visibilitychange'));
      }, state);
    await setVisibility('hidden');
    for (let i = 0; i < 4; i++) await page.clock.runFor(2000);
    await pollsAfter(3);
    // Hidden, it still asks every 10 s (so an ending can be told in the tab title).
    await page.clock.runFor(2000);
    await pollsAfter(4);
    // Shown again: it asks at once, with the clock standing still.
    await setVisibility('visible');
    await pollsAfter(5);

    await setProcessing(admin, true);
    await expect
      .poll(async () => {
        await page.clock.runFor(2000);
        return badge.getAttribute('data-state');
      }, { timeout: 15_000 })
      .toBe('done');
    const final = polls;
    for (let i = 0; i < 5; i++) await page.clock.runFor(2000);
    await pollsAfter(final);
  } finally {
    await setProcessing(admin, true);
  }
});

test('a waiting job is canceled from the jobs list and its credit comes back at once', async ({ page, browser }) => {
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await setProcessing(admin, false);
  try {
    await signUp(page, 'cancel');
    await open(page, '/upload');
    await uploadFiles(page, uniqueText('not-needed.txt'));
    await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(1);
    await expect(page.getByTestId('who')).toContainText('19 credits');
    await open(page, '/jobs');
    const job = page.locator('.job').first();
    await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');
    await job.getByRole('button', { name: 'Cancel not-needed.txt' }).click();
    // Asked first, with what it costs: nothing, since the provider has not started.
    await expect(job.locator('.cancel-question')).toHaveText('Cancel not-needed.txt? Your 1 credit comes back.');
    await job.getByRole('button', { name: 'Keep it' }).click();
    await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');
    await job.getByRole('button', { name: 'Cancel not-needed.txt' }).click();
    await job.getByRole('button', { name: 'Yes, cancel not-needed.txt' }).click();
    await expect(job.locator('.badge')).toHaveAttribute('data-state', 'canceled');
    await expect(job.locator('.state-detail')).toHaveText('Canceled. 1 credit refunded.');
    await expect(job.getByRole('button', { name: /^Cancel / })).toHaveCount(0);
    await expect(page.getByTestId('who')).toContainText('20 credits');
  } finally {
    await setProcessing(admin, true);
  }
});

test('the jobs list filters by state and searches by file name', async ({ page }) => {
  await signUp(page, 'filters');
  await open(page, '/upload');
  await uploadFiles(page, [uniqueText('alpha-notes.txt'), uniqueText('beta-minutes.txt')]);
  await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(2);
  await open(page, '/jobs');
  await expect(page.locator('.job')).toHaveCount(2);
  await expect(page.locator('.job .badge[data-state="done"]')).toHaveCount(2, { timeout: 15_000 });
  await page.getByLabel('File name').fill('BETA');
  await expect(page.locator('.job')).toHaveCount(1);
  await expect(page.locator('.job .file-name')).toHaveText('beta-minutes.txt');
  await page.getByLabel('File name').fill('');
  await page.getByLabel('State').selectOption('failed');
  await expect(page.getByText('No jobs match.')).toBeVisible();
  await page.getByLabel('State').selectOption('done');
  await expect(page.locator('.job')).toHaveCount(2);
  await expect(page.getByTestId('page')).toHaveText('Page 1');
  await expect(page.getByRole('button', { name: 'Older' })).toBeDisabled();
});

test('a document longer than one provider call is done in parts: "n of N done" advances, then one combined result', async ({ page }) => {
  await signUp(page, 'parts');
  // About 30,000 tokens, more than the e2e server's context (10,000): done in parts side by
  // side, at least 8 of them. The shared fake answers this document like a hosted model
  // writing 100 tokens a second, so the parts take a few seconds; their summaries are then
  // combined into one.
  const marker = `parts-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  await hostedModel({ first_token_ms: 500, prefill_tokens_per_sec: 100000, output_tokens_per_sec: 100, only_for: marker });
  const text = Array.from({ length: 1000 }, (_, i) =>
    `Clause-${String(i + 1).padStart(4, '0')} ${marker} binds both parties to the terms set out in schedule A.\n\n`).join('');
  await open(page, '/upload');
  await uploadFiles(page, { name: 'contract.txt', mimeType: 'text/plain', buffer: Buffer.from(text) });
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await row.getByRole('link', { name: 'View the job' }).click();

  const parts = page.locator('.parts');
  await expect(parts).toHaveAttribute('data-parts-total', /^([5-9]|[1-3]\d)$/, { timeout: 15_000 });
  const total = Number(await parts.getAttribute('data-parts-total'));
  await expect(parts).toContainText(new RegExp(`Summarizing ${total} parts, \\d+ done`));
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 60_000 });
  await expect(parts).toHaveText(`Done in ${total} parts`);
  const result = page.locator('article.result-rendered');
  await expect(result.locator('h2').first()).toHaveText('Summary');
  await expect(result).toContainText('Clause-0001');
  const report = await hostedModelReport(marker);
  expect(report.most_at_once).toBeGreaterThan(1);
  expect(report.calls).toBeGreaterThan(total);

  // The jobs list says the same, and the API gives the parts to programs.
  await page.getByRole('link', { name: '← All jobs' }).click();
  await expect(page.locator('.job').first().locator('.parts')).toHaveAttribute('data-parts-done', String(total));
});

test('a multi-page text translated comes back whole, every paragraph in order, its parts side by side', async ({ page }) => {
  await signUp(page, 'translate');
  // The shared fake answers this document like a hosted model: time per output token, and an
  // answer as long as its text ("[translated] …" per paragraph), cut at max_tokens if longer.
  const marker = `hosted-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  await hostedModel({ first_token_ms: 200, prefill_tokens_per_sec: 200000, output_tokens_per_sec: 4000, only_for: marker });
  // About 26,000 tokens: parts of about 4,000 tokens, side by side.
  const count = 1200;
  const text = Array.from({ length: count }, (_, i) =>
    `Paragraph ${String(i + 1).padStart(4, '0')} ${marker}: the supplier delivers the goods named in schedule A by the agreed date.\n\n`).join('');
  await open(page, '/upload');
  await page.locator('#preset').selectOption('translate');
  await page.locator('#language').fill('German');
  await uploadFiles(page, { name: 'contract.txt', mimeType: 'text/plain', buffer: Buffer.from(text) });
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await row.getByRole('link', { name: 'View the job' }).click();

  const parts = page.locator('.parts');
  await expect(parts).toHaveAttribute('data-parts-total', /^([3-9]|[1-5]\d)$/, { timeout: 15_000 });
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 60_000 });
  await expect(parts).toHaveText(/Done in ([3-9]|[1-5]\d) parts/);
  const rendered = await page.locator('article.result-rendered').innerText();
  const numbers = [...rendered.matchAll(/\[translated\] Paragraph (\d{4})/g)].map((m) => Number(m[1]));
  expect(numbers).toEqual(Array.from({ length: count }, (_, i) => i + 1));

  const report = await hostedModelReport(marker);
  expect(report.cut).toBe(0);
  expect(report.most_at_once).toBeGreaterThan(1);
});

test('a translation being written says how far it is as it streams', async ({ page }) => {
  await signUp(page, 'streamed');
  // About 1,800 tokens, one call (under a part's size), written at 100 tokens a second: the
  // answer streams for some 18 s, and the page says how far it is.
  const marker = `streamed-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  await hostedModel({ first_token_ms: 200, prefill_tokens_per_sec: 200000, output_tokens_per_sec: 100, only_for: marker });
  const text = Array.from({ length: 60 }, (_, i) =>
    `Paragraph ${i + 1} ${marker}: the supplier delivers the goods named in schedule A.`).join('\n\n');
  await open(page, '/upload');
  await page.locator('#preset').selectOption('translate');
  await page.locator('#language').fill('German');
  await uploadFiles(page, { name: 'streamed.txt', mimeType: 'text/plain', buffer: Buffer.from(text) });
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await row.getByRole('link', { name: 'View the job' }).click();
  const detail = page.locator('.job-state .state-detail');
  await expect(detail).toHaveText(/Waiting for the provider since .+\. About [\d,]+ of [\d,]+ tokens written\.$/, { timeout: 15_000 });
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 45_000 });
  await expect(detail).not.toContainText('tokens written');
  await expect(page.locator('article.result-rendered')).toContainText('[translated] Paragraph 60');
});

test('a Word contract is priced and timed before it is confirmed, translated, and comes back as a Word file with every paragraph in place', async ({ page }) => {
  await signUp(page, 'word');
  const marker = `word-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  await hostedModel({ first_token_ms: 50, prefill_tokens_per_sec: 200000, output_tokens_per_sec: 20000, only_for: marker });
  const clauses = ['The supplier delivers the goods.', 'The buyer pays within 30 days.', `Reference ${marker}.`];
  await open(page, '/upload');
  await page.locator('#preset').selectOption('translate');
  await page.locator('#language').fill('German');
  // Chosen, it is priced and timed before anything is stored or charged; the user confirms.
  await chooseFiles(page, wordFile('contract.docx', 'Service agreement', clauses));
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'estimated');
  await expect(row.getByTestId('price')).toHaveText(/^\d+ credits? held, settled to its text's price once read/);
  await expect(row.getByTestId('estimate')).toContainText('Translate into German');
  await expect(row.getByTestId('eta')).toHaveText(/^Done (in about|within) \d+ (s|min)/);
  await expect(page.getByTestId('confirm-bar')).toContainText('1 document:');
  await expect(page.getByTestId('who')).toContainText('20 credits');
  // "Not now" lets it go; chosen again, it is confirmed.
  await page.getByTestId('let-go').click();
  await expect(page.locator('.upload')).toHaveCount(0);
  await chooseFiles(page, wordFile('contract.docx', 'Service agreement', clauses));
  await page.getByTestId('confirm-upload').click();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await expect(page.getByTestId('confirm-bar')).toHaveCount(0);
  await row.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 60_000 });
  await expect(page.locator('article.result-rendered')).toContainText('[translated] The buyer pays within 30 days.');
  // Held at its size's price, settled by its text: what it came to, then what was held.
  await expect(page.getByTestId('cost')).toHaveText(/^Cost 1 credit( \(\d+ held, \d+ returned\))? · \d+ tokens in/);

  const downloading = page.waitForEvent('download');
  await page.getByTestId('translated-file').click();
  const download = await downloading;
  expect(download.suggestedFilename()).toBe('contract-translated.docx');
  const fs = require('fs');
  const file: Buffer = fs.readFileSync(await download.path());
  const xml = zipEntry(file, 'word/document.xml');
  expect(xml).toContain('<w:pStyle w:val="Heading1"/>');
  const texts = [...xml.matchAll(/<w:t[^>]*>([^<]*)<\/w:t>/g)].map((m) => m[1]).filter((t) => t.trim());
  expect(texts).toEqual(['[translated] Service agreement', ...clauses.map((c) => `[translated] ${c}`)]);
});

test('a Word contract with bold, italics, a link, a note and a table comes back with each span translated in place and the glossary used', async ({ page }) => {
  await signUp(page, 'inline');
  const marker = `inline-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  await hostedModel({ first_token_ms: 50, prefill_tokens_per_sec: 200000, output_tokens_per_sec: 20000, only_for: marker });
  const run = (text: string, props = '') => `<w:r>${props ? `<w:rPr>${props}</w:rPr>` : ''}<w:t xml:space="preserve">${text}</w:t></w:r>`;
  const body = [
    `<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr>${run('Service agreement')}</w:p>`,
    `<w:p>${run('The ')}${run('Supplier', '<w:b/>')}${run(' delivers ')}${run('in good time', '<w:i/>')}${run('.')}<w:r><w:rPr><w:rStyle w:val="FootnoteReference"/></w:rPr><w:footnoteReference w:id="1"/></w:r></w:p>`,
    `<w:p>${run('Questions go to ')}<w:hyperlink r:id="rId9">${run('our terms page', '<w:rStyle w:val="Hyperlink"/>')}</w:hyperlink>${run(' before signing.')}</w:p>`,
    `<w:tbl><w:tr><w:tc><w:p>${run('The Buyer pays')}</w:p></w:tc><w:tc><w:p>${run('100 EUR')}</w:p></w:tc></w:tr></w:tbl>`,
    `<w:p>${run(`Reference ${marker}.`)}</w:p>`,
  ].join('');
  const contract = wordFileOf('contract.docx', body, [
    ['word/_rels/document.xml.rels', '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId9" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink" Target="https://example.com/terms" TargetMode="External"/></Relationships>'],
    ['word/footnotes.xml', '<w:footnotes xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:footnote w:id="1"><w:p><w:r><w:t>Prices exclude tax.</w:t></w:r></w:p></w:footnote></w:footnotes>'],
  ]);
  await open(page, '/upload');
  await page.locator('#preset').selectOption('translate');
  await page.locator('#language').fill('German');
  await page.getByTestId('formality').selectOption('formal');
  await page.getByTestId('glossary').fill('Supplier, Lieferant\nBuyer, Käufer');
  await uploadFiles(page, contract);
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await row.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 60_000 });
  // A reader sees the bold word bold, with its agreed translation.
  await expect(page.locator('article.result-rendered strong')).toHaveText('Lieferant');
  await expect(page.locator('article.result-rendered em')).toHaveText('in good time');
  await expect(page.getByTestId('formatting-lost')).toHaveCount(0);

  const downloading = page.waitForEvent('download');
  await page.getByTestId('translated-file').click();
  const download = await downloading;
  const fs = require('fs');
  const file: Buffer = fs.readFileSync(await download.path());
  const xml = zipEntry(file, 'word/document.xml');
  // Each span in a run of its own look, translated in place; the glossary's terms used.
  expect(xml).toContain('<w:r><w:rPr><w:b/></w:rPr><w:t xml:space="preserve">Lieferant</w:t></w:r>');
  expect(xml).toContain('<w:r><w:rPr><w:i/></w:rPr><w:t xml:space="preserve">in good time</w:t></w:r>');
  expect(xml).toMatch(/<w:hyperlink r:id="rId9"><w:r><w:rPr><w:rStyle w:val="Hyperlink"\/><\/w:rPr><w:t xml:space="preserve">our terms page<\/w:t><\/w:r><\/w:hyperlink>/);
  expect(xml).toContain('<w:footnoteReference w:id="1"/>');
  expect(xml).toContain('[translated] The Käufer pays');
  expect(xml).not.toContain('Supplier');
  const texts = [...xml.matchAll(/<w:t[^>]*>([^<]*)<\/w:t>/g)].map((m) => m[1]).filter((t) => t.trim());
  expect(texts.slice(0, 7)).toEqual(['[translated] Service agreement', '[translated] The ', 'Lieferant', ' delivers ', 'in good time', '.', '[translated] Questions go to ']);
  expect(zipEntry(file, 'word/_rels/document.xml.rels')).toContain('https://example.com/terms');
  expect(zipEntry(file, 'word/footnotes.xml')).toContain('[translated] Prices exclude tax.');
});

test('a document needed by a time says so before it is sent and on its job, and goes in the urgent lane when asked', async ({ page, browser }) => {
  const email = await signUp(page, 'deadline');
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  try {
    await page.getByRole('link', { name: 'Upload documents' }).click();
    // Two hours from now, as the browser's local date and time (what the picker gives).
    const due = new Date(Date.now() + 2 * 3600 * 1000);
    const pad = (n: number) => String(n).padStart(2, '0');
    const local = `${due.getFullYear()}-${pad(due.getMonth() + 1)}-${pad(due.getDate())}T${pad(due.getHours())}:${pad(due.getMinutes())}`;
    await page.getByTestId('due-by').fill(local);
    await page.getByTestId('urgent').check();
    await chooseFiles(page, uniqueText('needed-soon.txt'));
    // The estimate was asked with the deadline: two hours is time enough.
    await expect(page.getByTestId('eta')).toContainText('It should be done before it is needed.');
    // Held in line while it is looked at.
    await setProcessing(admin, false);
    await page.getByTestId('confirm-upload').click();
    const row = page.locator('.upload').first();
    await expect(row).toHaveAttribute('data-outcome', 'ok');
    await row.getByRole('link', { name: 'View the job' }).click();
    // Waiting (processing is paused), with two hours to spare: on track, shown in local time.
    const deadline = page.getByTestId('deadline');
    await expect(deadline).toHaveText(`Needed by ${local.replace('T', ' ')}: on track`);
    await expect(deadline).toHaveAttribute('data-standing', 'on track');
    // An operator puts it first in line from the console's search, on the record.
    const id = page.url().split('/').pop();
    await open(admin, '/admin/jobs');
    const search = admin.getByTestId('job-search');
    await search.getByLabel('Job id, e-mail or file name').fill(email);
    await search.getByRole('button', { name: 'Search' }).click();
    await expect(search.getByTestId('found-job')).toHaveCount(1);
    await search.getByRole('button', { name: /^Run .* next$/ }).click();
    await open(admin, '/admin/audit');
    await expect(admin.locator('.audit li').filter({ hasText: `put job ${id} first in line` })).toHaveCount(1);
  } finally {
    await setProcessing(admin, true);
  }
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  await expect(page.getByTestId('deadline')).toHaveAttribute('data-standing', 'met');
  await admin.close();
});

test('a scanned PDF is priced by its pages before it is confirmed, shows the page being read, and says how OCR read it', async ({ page }) => {
  await signUp(page, 'scan');
  // The scan's own words (read by OCR) reach the model: it answers for them alone.
  await hostedModel({ first_token_ms: 50, prefill_tokens_per_sec: 200000, output_tokens_per_sec: 20000, only_for: '4471' });
  await open(page, '/upload');
  await page.locator('#preset').selectOption('translate');
  await page.locator('#language').fill('German');
  await chooseFiles(page, path.join(__dirname, '..', 'fixtures', 'scan.pdf'));
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'estimated');
  // Twelve scanned pages at 0.3 credits: 3.6, so 4.
  await expect(row.getByTestId('price')).toHaveText('12 scanned pages: 4 credits');
  await page.getByTestId('confirm-upload').click();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await expect(page.getByTestId('who')).toContainText('16 credits');
  await row.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.state-detail')).toHaveText(/^Reading page \d+ of 12 \(scanned, by OCR\)/, { timeout: 30_000 });
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 90_000 });
  await expect(page.getByTestId('scan-report')).toContainText('12 pages of 12 read by OCR (eng): pages 1, 2, 3');
  const result = page.locator('article.result-rendered');
  await expect(result).toContainText('[translated] Survey reference 4471, page 1.');
  await expect(result).toContainText('Finding 12: the north wall needs repointing.');
});
