import * as path from 'path';
import { allowConsoleError, expect, open, scriptProvider, signUp, test, uploadFiles } from './helpers';


test('a document that cannot be processed fails with its reason, a refund and a notice', async ({ page }) => {
  await signUp(page, 'locked');
  await open(page, '/upload');
  await uploadFiles(page, path.join(__dirname, '..', 'fixtures', 'locked.pdf'));
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');

  await page.goto('/jobs');
  const job = page.locator('.job').first();
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'failed', { timeout: 15_000 });
  await expect(job.locator('.state-detail')).toContainText('The PDF is encrypted');
  await expect(job.locator('.state-detail')).toContainText('1 credit refunded');

  await expect(page.getByTestId('unread')).toHaveText('1');
  await page.getByRole('link', { name: 'Notices' }).click();
  await expect(page.locator('.notices li.unread')).toContainText('1 credit refunded');
  await page.getByRole('button', { name: 'Mark all as read' }).click();
  await expect(page.locator('.notices li.unread')).toHaveCount(0);

  await page.getByRole('link', { name: 'Credits' }).click();
  await expect(page.getByTestId('balance')).toHaveText('20');
  await expect(page.locator('.ledger tbody tr')).toHaveCount(3); // grant, debit, refund
  await expect(page.locator('.ledger tr.refund')).toContainText('+1');
});

test('an API token is shown once and can be revoked', async ({ page, request }) => {
  await signUp(page, 'token');
  await open(page, '/credits');
  await page.getByLabel('Name').fill('nightly import');
  await page.getByRole('button', { name: 'Create a token' }).click();
  const secret = (await page.getByTestId('token-secret').textContent())!;
  expect(secret).toMatch(/^slc_[0-9a-f]{64}$/);

  const anon = await request.get('/api/v1/jobs/00000000-0000-0000-0000-000000000000', {
    headers: { Authorization: `Bearer ${secret}` },
  });
  expect(anon.status()).toBe(404); // authenticated, and nobody's job

  await page.getByRole('button', { name: 'Revoke' }).click();
  await expect(page.locator('.tokens')).toContainText('revoked');
  const revoked = await request.get('/api/v1/jobs/00000000-0000-0000-0000-000000000000', {
    headers: { Authorization: `Bearer ${secret}` },
  });
  expect(revoked.status()).toBe(401);
});

test('a user deletes a finished document, then the account, which then cannot log in', async ({ page }) => {
  allowConsoleError(/status of 401 \(Unauthorized\)/);
  const email = await signUp(page, 'erase');
  await scriptProvider([{ kind: 'success', text: 'Private summary.', input_tokens: 20, output_tokens: 3 }]);
  await open(page, '/upload');
  await uploadFiles(page, {
    name: 'private-notes.txt',
    mimeType: 'text/plain',
    buffer: Buffer.from('Private notes. They have two sentences.'),
  });
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await page.locator('.upload').first().getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });

  // Deleting asks first, says what goes, and leaves the job as a line of the history.
  await page.getByRole('button', { name: 'Delete this document' }).click();
  await expect(page.getByRole('alert')).toContainText('Delete private-notes.txt?');
  await page.getByRole('button', { name: 'Yes, delete' }).click();
  await expect(page.getByTestId('deleted')).toContainText('Deleted by you');
  await expect(page.locator('h1.file-name')).toHaveText('Deleted document');
  await expect(page.locator('article.result-rendered')).toHaveCount(0);
  await expect(page.getByRole('link', { name: 'Download the original' })).toHaveCount(0);
  await open(page, '/jobs');
  await expect(page.locator('.job .file-name').first()).toHaveText('Deleted document');

  // The account: the password first, then it is gone and its log-in with it.
  await open(page, '/credits');
  await expect(page.getByTestId('balance')).toHaveText('19');
  await page.getByLabel('Your password').fill('a long password');
  await page.getByRole('button', { name: 'Delete my account' }).click();
  await expect(page).toHaveURL(/\/login$/);
  await open(page, '/login');
  await page.getByLabel('E-mail address').fill(email);
  await page.getByLabel('Password').fill('a long password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page.getByRole('alert')).toHaveText('That e-mail address and password do not match an account.');
});
