import * as path from 'path';
import pg from 'pg';
import { admin as operator, allowConsoleError, expect, fromEnv, logIn, logInAsAdmin, newPage, open, scriptProvider, signUp, test, uniqueText, uploadFiles } from './helpers';


test('a non-admin cannot reach any console page or its server functions', async ({ page }) => {
  // The pages know the role from the header's "who am I": they ask nothing of the admin API.
  const adminCalls: string[] = [];
  page.on('request', (r) => {
    if (r.url().includes('/api/admin/')) adminCalls.push(r.url());
  });
  await signUp(page, 'plain');
  await expect(page.getByRole('link', { name: 'Admin' })).toHaveCount(0);
  for (const path of ['/admin', '/admin/jobs', '/admin/dead-letters', '/admin/users', '/admin/capacity', '/admin/processes', '/admin/audit']) {
    await open(page, path);
    await expect(page.getByText('Page not found.'), path).toBeVisible();
    await expect(page.getByRole('navigation', { name: 'Console' })).toHaveCount(0);
    await expect(page.getByRole('button', { name: 'Pause processing' })).toHaveCount(0);
  }
  await page.waitForLoadState('networkidle');
  expect(adminCalls).toEqual([]);
  for (const [name, form] of [
    ['set_processing', { enabled: 'false' }],
    ['pause_for', { minutes: '10' }],
    ['bulk_action', { action: 'cancel', 'filter[text]': '', confirmed: '1' }],
  ] as const) {
    const direct = await page.request.post(`/api/admin/${name}`, { form });
    expect(direct.status(), name).toBe(404);
  }
});

test('an admin pauses processing, a new upload waits with the paused message, and resuming finishes it', async ({ browser }) => {
  const admin = await newPage(browser);
  await logIn(admin, operator.email, operator.password);
  await admin.getByRole('link', { name: 'Admin' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('On');
  admin.once('dialog', (d) => d.accept());
  await admin.getByRole('button', { name: 'Pause processing' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('Paused');

  const user = await newPage(browser);
  await signUp(user, 'paused');
  await open(user, '/upload');
  await uploadFiles(user, path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  await expect(user.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await user.goto('/jobs');
  const job = user.locator('.job').first();
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');
  await expect(job.locator('.state-detail')).toContainText('Processing is paused');
  await user.waitForTimeout(2500);
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');
  // The vital signs see the waiting job; the chart is drawn from the last hour's minutes.
  await admin.reload();
  await expect(admin.getByTestId('backlog')).toHaveText(/^[1-9]\d*$/);
  await expect(admin.locator('svg.chart polyline.intake')).toHaveAttribute('points', /^40\.0,[\d.]+( [\d.]+,[\d.]+){59}$/);
  // Axes with a scale and units, and each minute's values on hover.
  await expect(admin.getByTestId('chart-max')).toHaveText(/^[1-9]\d*$/);
  await expect(admin.locator('svg.chart .axis')).toContainText('jobs per minute');
  await expect(admin.locator('svg.chart rect.hover title')).toHaveCount(60);
  await expect(admin.locator('svg.chart rect.hover title').last()).toHaveText(/^this minute: \d+ accepted, \d+ finished$/);

  admin.once('dialog', (d) => d.accept());
  await admin.getByRole('button', { name: 'Resume processing' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('On');
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'done', { timeout: 15_000 });
  await admin.getByRole('navigation', { name: 'Console' }).getByRole('link', { name: 'Audit' }).click();
  await expect(admin).toHaveURL(/\/admin\/audit$/);
  await expect(admin.locator('.audit li').first()).toContainText(`${operator.email} resumed processing`);
});

test('an admin inspects a dead-letter group, replays one job, then the rest of the group, and the jobs end done', async ({ browser }) => {
  const user = await newPage(browser);
  await signUp(user, 'dlq');
  // Two documents, three rate-limited answers each: both exhaust their retries.
  await scriptProvider(Array(6).fill({ kind: 'rate_limited_seconds', seconds: 0 }));
  await open(user, '/upload');
  await uploadFiles(user, [uniqueText('agenda.txt'), uniqueText('memo.txt')]);
  await expect(user.locator('.upload[data-outcome="ok"]')).toHaveCount(2);
  await user.goto('/jobs');
  await expect(user.locator('.job .badge[data-state="failed"]')).toHaveCount(2, { timeout: 25_000 });

  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await open(admin, '/admin/dead-letters');
  const group = admin.getByTestId('dlq-group').filter({ hasText: 'rate limiting' });
  await expect(group).toContainText('retries exhausted');
  await expect(group).toContainText('2 jobs');
  await group.getByRole('button', { name: 'Show jobs' }).click();
  const jobs = group.getByTestId('dlq-job');
  await expect(jobs).toHaveCount(2);
  // Each job shows its owner and every attempt with the provider's error.
  const memo = jobs.filter({ hasText: 'memo.txt' });
  await expect(memo).toContainText(/dlq-.*@example\.com/);
  await expect(memo.locator('.timeline li')).toHaveCount(3);
  await expect(memo.locator('.timeline li').last()).toContainText('(HTTP 429)');

  await memo.getByRole('button', { name: 'Replay', exact: true }).click();
  await expect(group).toContainText('1 job');
  await group.getByRole('button', { name: 'Replay all' }).click();
  await expect(admin.getByTestId('dlq-group').filter({ hasText: 'rate limiting' })).toHaveCount(0);
  await open(admin, '/admin/audit');
  await expect(admin.locator('.audit li').nth(0)).toContainText(/replayed group retries exhausted: .*rate limiting.* \(1 queued\)/);
  await expect(admin.locator('.audit li').nth(1)).toContainText(/replayed job [0-9a-f-]+ from the dead-letter queue \(1 queued\)/);
  // The provider answers again: both replayed jobs end done.
  await user.reload();
  await expect(user.locator('.job .badge[data-state="done"]')).toHaveCount(2, { timeout: 15_000 });
});

test('with the gate at one, waiting jobs show their place in line, then all run', async ({ browser }) => {
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await open(admin, '/admin/capacity');
  const setGate = async (size: number) => {
    await admin.getByLabel('Jobs at once (1 to 70)').fill(String(size));
    await admin.getByRole('button', { name: 'Set the gate' }).click();
    await expect(admin.getByText(`at most ${size} at once`)).toBeVisible();
  };
  await setGate(1);
  try {
    // The first document holds the only slot for a while.
    await scriptProvider([{ kind: 'hang', millis: 4500 }]);
    const user = await newPage(browser);
    await signUp(user, 'line');
    await open(user, '/upload');
    await uploadFiles(user, [uniqueText('first.txt'), uniqueText('second.txt'), uniqueText('third.txt')]);
    await expect(user.locator('.upload[data-outcome="ok"]')).toHaveCount(3);
    await user.goto('/jobs');
    const details = user.locator('.job .state-detail');
    await expect(details.filter({ hasText: /^Next in line; / })).toHaveCount(1);
    await expect(details.filter({ hasText: /^1 job ahead; / })).toHaveCount(1);
    await expect(user.locator('.job .badge[data-state="done"]')).toHaveCount(3, { timeout: 20_000 });
    await open(admin, '/admin/audit');
    await expect(admin.locator('.audit li').first()).toContainText(/set the gate from \d+ to 1 jobs at once/);
  } finally {
    await open(admin, '/admin/capacity');
    await setGate(24);
  }
});

test('an admin runs a reconciliation and reads the report', async ({ browser }) => {
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await open(admin, '/admin/audit');
  const card = admin.getByTestId('reconciliation');
  await card.getByRole('button', { name: 'Run a reconciliation now' }).click();
  await expect(card.getByTestId('reconciliation-summary')).toHaveText(
    new RegExp(`^Report \\d+ at .+ by ${operator.email.replace('.', '\\.')}: everything adds up\\.$`),
  );
  await expect(card.locator('tbody tr')).toHaveCount(8);
  await expect(card.getByText('Stored bytes equal the documents and parts kept')).toBeVisible();
  await expect(card.locator('tbody tr').first()).toContainText('Balances equal their ledgers');
  // The run is kept: the page shows it again after a reload.
  await admin.reload();
  await expect(card.getByTestId('reconciliation-summary')).toContainText('everything adds up');
});

test("support finds a user's job by e-mail and opens it, sets the user's limit, and the user runs the document again", async ({ browser }) => {
  const user = await newPage(browser);
  const email = await signUp(user, 'support');
  await open(user, '/upload');
  await uploadFiles(user, uniqueText('stuck-notes.txt'));
  await expect(user.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await user.goto('/jobs');
  const job = user.locator('.job').first();
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'done', { timeout: 20_000 });

  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  await open(admin, '/admin/jobs');
  const search = admin.getByTestId('job-search');
  await search.getByLabel('Job id, e-mail or file name').fill(email);
  await search.getByRole('button', { name: 'Search' }).click();
  const found = search.getByTestId('found-job');
  await expect(found).toHaveCount(1);
  await expect(found).toContainText(email);
  await expect(found.locator('.badge')).toHaveAttribute('data-state', 'done');
  await search.getByLabel('State').selectOption('failed');
  await search.getByRole('button', { name: 'Search' }).click();
  await expect(search.getByText('No jobs match.')).toBeVisible();
  await search.getByLabel('State').selectOption('');
  await search.getByRole('button', { name: 'Search' }).click();
  await found.locator('a.file-name').click();
  await expect(admin).toHaveURL(/\/jobs\/[0-9a-f-]{36}$/);
  await expect(admin.locator('h1.file-name')).toHaveText('stuck-notes.txt');

  // The user's in-flight limit, from the console's users page and on the record.
  await open(admin, '/admin/users');
  const users = admin.getByTestId('user-admin');
  await users.getByLabel('E-mail').fill(email);
  await users.getByRole('button', { name: 'Look up' }).click();
  await expect(users.getByTestId('user-summary')).toHaveText(new RegExp(`^${email.replace(/[.]/g, '\\.')}: \\d+ credits, 0 of \\d+ jobs in flight\\.$`));
  await users.getByLabel('In-flight limit').fill('9');
  await users.getByRole('button', { name: 'Set the limit' }).click();
  await expect(users.getByTestId('user-summary')).toContainText('0 of 9 jobs in flight');
  await open(admin, '/admin/audit');
  await expect(admin.locator('.audit li').first()).toContainText(`${operator.email} set the in-flight limit of user`);

  // Run again: a new job of the same document, charged again.
  const firstUrl = await job.locator('a.file-name').getAttribute('href');
  await job.locator('a.file-name').click();
  await expect(user.locator('h1.file-name')).toHaveText('stuck-notes.txt');
  await user.getByRole('button', { name: 'Run again' }).click();
  await expect(user).not.toHaveURL(new RegExp(`${firstUrl}$`));
  await expect(user).toHaveURL(/\/jobs\/[0-9a-f-]{36}$/);
  await expect(user.locator('.job-state .badge')).toHaveAttribute('data-state', 'done', { timeout: 20_000 });
  await user.goto('/jobs');
  await expect(user.locator('.job')).toHaveCount(2);
});

test('a firing alert shows on the admin page: what, since when, its value and threshold', async ({ browser }) => {
  // The books made not to add up, as a reconciliation would report it (the suite's own
  // database, which `cargo xtask test` names in DATABASE_URL).
  const db = new pg.Client({ connectionString: fromEnv('DATABASE_URL') });
  await db.connect();
  const report = (found: number) =>
    db.query("INSERT INTO reconciliation_reports (started_at, actor, checks, discrepancies, found) VALUES (now(), 'e2e', '[]', '[]', $1)", [found]);
  try {
    await report(3);
    const admin = await newPage(browser);
    await logInAsAdmin(admin);
    await open(admin, '/admin');
    // Evaluated every second here; the page refreshes every 5 s.
    const firing = admin.getByTestId('alert-firing').filter({ hasText: 'The books do not add up' });
    await expect(firing).toBeVisible({ timeout: 15_000 });
    await expect(firing).toContainText('the latest reconciliation found 3 discrepancies (now 3, threshold 0)');
    await expect(firing.locator('.when')).toHaveText(/^ since .+: $/);
    await expect(admin.getByTestId('alerts')).toContainText('No alert webhook is set');
  } finally {
    // Leave nothing behind for later tests and the screenshots: the fake reports go, and the
    // firing (held for five minutes otherwise) is resolved.
    await db.query("DELETE FROM reconciliation_reports WHERE actor = 'e2e'");
    await db.query("UPDATE alert_firings SET resolved_at = now() WHERE rule = 'reconciliation_drift' AND resolved_at IS NULL");
    await db.end();
  }
});
