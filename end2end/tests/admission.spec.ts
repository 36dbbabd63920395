import * as path from 'path';
import { allowConsoleError, expect, grantCredits, logInAsAdmin, newPage, open, setProcessing, signUp, test, uniqueText, uploadFiles } from './helpers';

test('out of credits: the 402 message gives the cost and the balance, and nothing is queued', async ({ page }) => {
  allowConsoleError(/status of 402 \(Payment Required\)/);
  const email = await signUp(page, 'broke');
  grantCredits(email, -20);
  await open(page, '/upload');
  await uploadFiles(page, path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'refused');
  await expect(row).toContainText('Out of credits: this document costs 1 and your balance is 0. Nothing was charged.');
  await page.goto('/jobs');
  await expect(page.getByText('No jobs yet')).toBeVisible();
  await expect(page.getByTestId('who')).toContainText('0 credits');
});

test('at the in-flight limit: the 429 message says how many are in flight, and the rest are queued', async ({ browser }) => {
  allowConsoleError(/status of 429 \(Too Many Requests\)/);
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  // Paused, nothing finishes, so the sixth upload meets the limit of five.
  await setProcessing(admin, false);
  try {
    const user = await newPage(browser);
    await signUp(user, 'busy');
    await open(user, '/upload');
    const files = [1, 2, 3, 4, 5, 6].map((n) => uniqueText(`notes-${n}.txt`));
    await uploadFiles(user, files);
    const rows = user.locator('.upload');
    await expect(rows).toHaveCount(6);
    await expect(user.locator('.upload[data-outcome]')).toHaveCount(6);
    await expect(user.locator('.upload[data-outcome="ok"]')).toHaveCount(5);
    const refused = user.locator('.upload[data-outcome="refused"]');
    await expect(refused).toHaveCount(1);
    await expect(refused).toContainText(/You have 5 of 5 documents in progress\. Try again in \d+ s, when one has finished\./);

    await user.goto('/jobs');
    await expect(user.locator('.job')).toHaveCount(5);
    await expect(user.locator('.job .state-detail').first()).toContainText('Processing is paused');
    await setProcessing(admin, true);
    await expect(user.locator('.job .badge[data-state="done"]')).toHaveCount(5, { timeout: 20_000 });
  } finally {
    await setProcessing(admin, true);
  }
});
