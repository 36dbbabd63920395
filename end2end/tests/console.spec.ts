import pg from 'pg';
import { admin as operator, expect, fromEnv, logInAsAdmin, newPage, open, scriptProvider, serverCommand, setProcessing, signUp, test, uniqueText, uploadFiles } from './helpers';

const sections = [
  ['Overview', '/admin'],
  ['Jobs', '/admin/jobs'],
  ['Dead letters', '/admin/dead-letters'],
  ['Users', '/admin/users'],
  ['Capacity', '/admin/capacity'],
  ['Processes', '/admin/processes'],
  ['Audit', '/admin/audit'],
] as const;

test('the console has a page with its own URL per section, and the navigation shows where you are', async ({ page }) => {
  await logInAsAdmin(page);
  await page.getByRole('link', { name: 'Admin' }).click();
  await expect(page).toHaveURL(/\/admin$/);
  const nav = page.getByRole('navigation', { name: 'Console' });
  for (const [title, path] of sections) {
    await nav.getByRole('link', { name: title, exact: true }).click();
    await expect(page).toHaveURL(new RegExp(`${path}$`));
    await expect(page.locator('.console h1')).toHaveText(title);
    await expect(nav.locator('a[aria-current="page"]')).toHaveText(title);
  }
  // A URL opens its page directly (a reload, a link in a ticket).
  await open(page, '/admin/processes');
  await expect(nav.locator('a[aria-current="page"]')).toHaveText('Processes');
  // This server process: alive, serving the web and running workers, with its slots.
  const me = page.getByTestId('process').filter({ hasText: 'all' });
  await expect(me).toHaveCount(1);
  await expect(me).toHaveAttribute('data-alive', 'true');
  await expect(me.locator('td').nth(3)).toHaveText('70');
  await expect(page.getByTestId('effective-concurrency')).toHaveText(/^\d+$/);
});

test('a timed pause shows the time left, survives a reload, is on the record, and resuming ends it early', async ({ page }) => {
  await logInAsAdmin(page);
  await open(page, '/admin');
  await expect(page.getByTestId('processing-state')).toHaveText('On');
  await page.getByLabel('Pause for').selectOption('10');
  page.once('dialog', (d) => d.accept());
  await page.getByRole('button', { name: 'Pause for a while' }).click();
  try {
    await expect(page.getByTestId('processing-state')).toHaveText('Paused');
    await expect(page.getByTestId('resumes')).toHaveText(/^Resumes by itself at .+ \((9 min \d+ s|10 min 0 s) left\)\.$/);
    await page.reload();
    await expect(page.getByTestId('resumes')).toContainText('Resumes by itself');
    await open(page, '/admin/audit');
    await expect(page.locator('.audit li').first()).toContainText(`${operator.email} paused processing for 10 min`);
  } finally {
    await open(page, '/admin');
    page.once('dialog', (d) => d.accept());
    await page.getByRole('button', { name: 'Resume processing' }).click();
  }
  await expect(page.getByTestId('processing-state')).toHaveText('On');
  await expect(page.getByTestId('resumes')).toHaveCount(0);
});

test('the overview refreshes on its own until an admin pauses refreshing; "Refresh now" and the interval bring it back', async ({ page }) => {
  await logInAsAdmin(page);
  await open(page, '/admin');
  const state = page.getByTestId('processing-state');
  await expect(state).toHaveText('On');
  await page.getByLabel('Refresh').selectOption('0');
  await page.reload();
  await expect(page.getByLabel('Refresh')).toHaveValue('0');
  try {
    // Paused from the command line: the page, not refreshing, still says On...
    serverCommand(['pause', '--reason', 'e2e: refresh control']);
    await page.waitForTimeout(6_500);
    await expect(state).toHaveText('On');
    // ...until asked.
    await page.getByRole('button', { name: 'Refresh now' }).click();
    await expect(state).toHaveText('Paused');
    // Every 5 s again: the resume shows by itself.
    await page.getByLabel('Refresh').selectOption('5');
    serverCommand(['resume', '--reason', 'e2e: refresh control']);
    await expect(state).toHaveText('On', { timeout: 8_000 });
  } finally {
    serverCommand(['resume', '--reason', 'e2e: refresh control']);
    await page.getByLabel('Refresh').selectOption('5');
  }
});

test('a dead-letter group is handed to a reviewer and resolved with no action; a failed job reviewed from the search is resolved by its replay', async ({ browser }) => {
  const user = await newPage(browser);
  const email = await signUp(user, 'review');
  // Two documents the provider refuses outright: both fail at once.
  await scriptProvider([{ kind: 'bad_request' }, { kind: 'bad_request' }]);
  await open(user, '/upload');
  await uploadFiles(user, [uniqueText('refused-a.txt'), uniqueText('refused-b.txt')]);
  await expect(user.locator('.upload[data-outcome="ok"]')).toHaveCount(2);
  await user.goto('/jobs');
  await expect(user.locator('.job .badge[data-state="failed"]')).toHaveCount(2, { timeout: 20_000 });

  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await open(admin, '/admin/dead-letters');
  const group = admin.getByTestId('dlq-group').filter({ hasText: 'provider rejected' });
  await group.getByRole('button', { name: 'Needs review…' }).first().click();
  await group.getByLabel('Assign to').selectOption(operator.email);
  await group.getByLabel('Note').fill('check what the prompt sends');
  await group.getByRole('button', { name: 'Mark for review' }).click();
  await expect(group.getByTestId('review')).toHaveText(
    new RegExp(`^Needs review by ${operator.email.replace('.', '\\.')} \\(since .+, marked by .+\\): check what the prompt sends$`),
  );
  // Their owner sees someone is on it (the group holds both), until the review ends.
  const lookedInto = user.locator('.job .state-detail').filter({ hasText: 'An operator is looking into this.' });
  await user.reload();
  await expect(lookedInto).toHaveCount(2);
  const reviews = admin.getByTestId('reviews');
  const open_ = reviews.getByTestId('review-item').filter({ hasText: 'check what the prompt sends' });
  await expect(open_).toHaveAttribute('data-open', 'true');
  await open_.getByLabel('Why no action').fill('the provider fixed it');
  await open_.getByRole('button', { name: 'Resolved, no action' }).click();
  await expect(open_).toHaveAttribute('data-open', 'false');
  await expect(open_).toContainText(`resolved, no action by ${operator.email}`);
  await expect(open_).toContainText(': the provider fixed it');
  await expect(group.getByTestId('review')).toHaveCount(0);
  await user.reload();
  await expect(user.locator('.job .badge[data-state="failed"]')).toHaveCount(2);
  await expect(lookedInto).toHaveCount(0);

  // One of the jobs, from the search: marked, found by "Needs review", then replayed.
  await open(admin, '/admin/jobs');
  const search = admin.getByTestId('job-search');
  await search.getByLabel('Job id, e-mail or file name').fill(email);
  await search.getByLabel('State').selectOption('failed');
  await search.getByRole('button', { name: 'Search' }).click();
  await expect(search.getByTestId('found-job')).toHaveCount(2);
  const job = search.getByTestId('found-job').filter({ hasText: 'refused-a.txt' });
  await job.getByRole('button', { name: 'Needs review…' }).click();
  await job.getByLabel('Assign to').selectOption(operator.email);
  await job.getByLabel('Note').fill('a refusal on a plain text?');
  await job.getByRole('button', { name: 'Mark for review' }).click();
  await expect(job.getByTestId('review')).toContainText('a refusal on a plain text?');
  await search.getByLabel('Needs review').check();
  await search.getByRole('button', { name: 'Search' }).click();
  await expect(search.getByTestId('found-job')).toHaveCount(1);
  await job.getByRole('button', { name: 'Replay' }).click();
  await open(admin, '/admin/dead-letters');
  const replayed = admin.getByTestId('review-item').filter({ hasText: 'a refusal on a plain text?' });
  await expect(replayed).toContainText(`replayed by ${operator.email}`);
  // Its owner is told, with the way to the job.
  await open(user, '/notices');
  const told = user.locator('.notices li').filter({ hasText: 'An operator looked into your failed document and is running it again' });
  await expect(told).toHaveCount(1);
  await expect(told.getByRole('link', { name: 'View the job' })).toHaveAttribute('href', /^\/jobs\/[0-9a-f-]{36}$/);
  await open(admin, '/admin/audit');
  await expect(admin.locator('.audit').last()).toContainText('marked job');
  await expect(admin.locator('.audit').last()).toContainText('resolved the review of group provider rejected: the provider refused the request (400): no action: the provider fixed it');
});

test('an admin acknowledges a firing alert and a reconciliation report, each with who, when and the note', async ({ browser }) => {
  const db = new pg.Client({ connectionString: fromEnv('DATABASE_URL') });
  await db.connect();
  try {
    await db.query("INSERT INTO reconciliation_reports (started_at, actor, checks, discrepancies, found) VALUES (now(), 'e2e', '[]', '[]', 2)");
    const admin = await newPage(browser);
    await logInAsAdmin(admin);
    await open(admin, '/admin');
    const firing = admin.getByTestId('alert-firing').filter({ hasText: 'The books do not add up' });
    await expect(firing).toBeVisible({ timeout: 15_000 });
    await firing.getByLabel('Acknowledgement note').fill('looking at the ledger');
    await firing.getByRole('button', { name: 'Acknowledge' }).click();
    await expect(firing.getByTestId('acknowledged')).toHaveText(
      new RegExp(`^Acknowledged by ${operator.email.replace('.', '\\.')} at .+: looking at the ledger$`),
    );
    // The report too, on the audit page.
    await open(admin, '/admin/audit');
    const report = admin.getByTestId('reconciliation');
    await expect(report.getByTestId('reconciliation-summary')).toContainText('by e2e');
    await report.getByRole('button', { name: 'Acknowledge' }).click();
    await expect(report.getByTestId('acknowledged')).toHaveText(new RegExp(`^Acknowledged by ${operator.email.replace('.', '\\.')} at .+$`));
  } finally {
    await db.query("DELETE FROM reconciliation_reports WHERE actor = 'e2e'");
    await db.query("UPDATE alert_firings SET resolved_at = now() WHERE rule = 'reconciliation_drift' AND resolved_at IS NULL");
    await db.end();
  }
});

test('a bulk cancel counts what the search matches, asks with the count, refunds every job, and shows in outcomes and the audit', async ({ browser }) => {
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await setProcessing(admin, false);
  try {
    const user = await newPage(browser);
    const email = await signUp(user, 'bulk');
    await open(user, '/upload');
    await uploadFiles(user, [uniqueText('one.txt'), uniqueText('two.txt'), uniqueText('three.txt')]);
    await expect(user.locator('.upload[data-outcome="ok"]')).toHaveCount(3);

    await open(admin, '/admin/jobs');
    const search = admin.getByTestId('job-search');
    await search.getByLabel('Job id, e-mail or file name').fill(email);
    await search.getByLabel('State').selectOption('queued');
    await search.getByRole('button', { name: 'Search' }).click();
    await expect(search.getByTestId('found-job')).toHaveCount(3);
    const bulk = search.getByTestId('bulk');
    await bulk.getByRole('button', { name: 'Cancel…' }).click();
    await expect(bulk.getByTestId('bulk-confirm')).toContainText('Cancel 3 jobs? Waiting ones are refunded at once');
    await bulk.getByRole('button', { name: 'Yes, cancel 3' }).click();
    await expect(bulk.getByTestId('bulk-done')).toHaveText('Done: 3 of 3 matched jobs changed (the rest were not in a state it applies to).');
    await expect(search.getByText('No jobs match.')).toBeVisible();

    await user.goto('/jobs');
    await expect(user.locator('.job .badge[data-state="canceled"]')).toHaveCount(3);
    await open(admin, '/admin/audit');
    await expect(admin.locator('.audit li').first()).toContainText(
      `${operator.email} canceled the jobs matching text "${email}", state queued: 3 of 3 matched`,
    );
    // This hour's outcomes count the refunds; per day the table has a row a day.
    await open(admin, '/admin');
    const outcomes = admin.getByTestId('outcomes');
    await expect(outcomes.getByTestId('outcome-row')).toHaveCount(24);
    const refunded = Number(await outcomes.getByTestId('outcome-row').first().locator('td').nth(5).innerText());
    expect(refunded).toBeGreaterThanOrEqual(3);
    await outcomes.getByRole('button', { name: 'Per day' }).click();
    await expect(outcomes.getByTestId('outcome-row')).toHaveCount(30);
    await expect(outcomes.locator('th').first()).toHaveText('Day (UTC)');
  } finally {
    await setProcessing(admin, true);
  }
});

test('the owner of a job waiting out a long backoff retries it now, and it ends done', async ({ page }) => {
  await signUp(page, 'retry-now');
  // The provider says "come back in ten minutes"; then it answers.
  await scriptProvider([{ kind: 'rate_limited_seconds', seconds: 600 }]);
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('patient.txt'));
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await page.getByRole('link', { name: 'View the job' }).click();
  const badge = page.locator('.job-state .badge');
  await expect(badge).toHaveAttribute('data-state', 'retrying', { timeout: 15_000 });
  await page.getByRole('button', { name: 'Retry patient.txt now' }).click();
  await expect(badge).toHaveAttribute('data-state', 'done', { timeout: 15_000 });
  await expect(page.getByRole('button', { name: /Retry .* now/ })).toHaveCount(0);
});
