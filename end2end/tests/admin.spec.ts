import { expect, test } from '@playwright/test';
import * as path from 'path';
import { logIn, open, scriptProvider, signUp } from './helpers';

const adminEmail = process.env.ADMIN_EMAIL ?? 'admin@sluice.test';
const adminPassword = process.env.ADMIN_PASSWORD ?? 'admin password for e2e';


test('a non-admin cannot reach the admin page or its server functions', async ({ page }) => {
  await signUp(page, 'plain');
  await expect(page.getByRole('link', { name: 'Admin' })).toHaveCount(0);
  await open(page, '/admin');
  await expect(page.getByText('Page not found.')).toBeVisible();
  const direct = await page.request.post('/api/admin/set_processing', { form: { enabled: 'false' } });
  expect(direct.status()).toBe(404);
});

test('an admin pauses processing, a new upload waits with the paused message, and resuming finishes it', async ({ browser }) => {
  const admin = await browser.newPage();
  await logIn(admin, adminEmail, adminPassword);
  await admin.getByRole('link', { name: 'Admin' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('On');
  admin.once('dialog', (d) => d.accept());
  await admin.getByRole('button', { name: 'Pause processing' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('Paused');

  const user = await browser.newPage();
  await signUp(user, 'paused');
  await open(user, '/upload');
  await user.locator('#files').setInputFiles(path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  await expect(user.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await user.goto('/jobs');
  const job = user.locator('.job').first();
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');
  await expect(job.locator('.state-detail')).toContainText('Processing is paused');
  await user.waitForTimeout(2500);
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'queued');

  admin.once('dialog', (d) => d.accept());
  await admin.getByRole('button', { name: 'Resume processing' }).click();
  await expect(admin.getByTestId('processing-state')).toHaveText('On');
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'done', { timeout: 15_000 });
  await expect(admin.locator('.audit')).toContainText(`${adminEmail} changed processing: off → on`);
});

test('an admin replays a dead-letter group and its jobs end done', async ({ browser }) => {
  const user = await browser.newPage();
  await signUp(user, 'dlq');
  await scriptProvider([
    { kind: 'rate_limited_seconds', seconds: 0 },
    { kind: 'rate_limited_seconds', seconds: 0 },
    { kind: 'rate_limited_seconds', seconds: 0 },
  ]);
  await open(user, '/upload');
  await user.locator('#files').setInputFiles(path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  await expect(user.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await user.goto('/jobs');
  await expect(user.locator('.job .badge').first()).toHaveAttribute('data-state', 'failed', { timeout: 25_000 });

  const admin = await browser.newPage();
  await logIn(admin, adminEmail, adminPassword);
  await open(admin, '/admin');
  const group = admin.getByTestId('dlq-group').filter({ hasText: 'rate limiting' });
  await expect(group).toContainText('retries exhausted');
  await group.getByRole('button', { name: 'Replay' }).click();
  await expect(admin.locator('.audit')).toContainText('dlq_replay');
  await expect(group).toHaveCount(0);
  // The provider answers again: the replayed job ends done.
  await user.reload();
  await expect(user.locator('.job .badge').first()).toHaveAttribute('data-state', 'done', { timeout: 15_000 });
});
