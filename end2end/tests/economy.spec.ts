import { chooseFiles, expect, open, signUp, test } from './helpers';

// The economy lane: the fake provider speaks the batch APIs (its batches take a fraction of a
// second) and the server polls them every second.
test('"By tomorrow, at half the credits": the lower price before confirming, the job in the provider\'s batch, then done', async ({ page }) => {
  await signUp(page, 'economy');
  await open(page, '/upload');
  // About 30,000 tokens: 2 credits in the standard lane, in parts (the test server's context is 10,000).
  const text = `Economy report ${Date.now()}.` + ' The quarter went well for every region.'.repeat(4_000);
  const file = { name: 'quarterly.txt', mimeType: 'text/plain', buffer: Buffer.from(text) };
  await chooseFiles(page, file);
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'estimated');
  await expect(row.getByTestId('price')).toContainText('2 credits');
  await page.getByTestId('let-go').click();

  const economy = page.getByTestId('economy');
  await expect(economy.locator('xpath=..')).toContainText('By tomorrow, at half the credits');
  // The economy lane is neither urgent nor kept to a deadline: choosing one clears the other.
  await economy.check();
  await page.getByTestId('urgent').check();
  await expect(economy).not.toBeChecked();
  await economy.check();
  await expect(page.getByTestId('urgent')).not.toBeChecked();
  await chooseFiles(page, file);
  await expect(row).toHaveAttribute('data-outcome', 'estimated');
  await expect(row.getByTestId('price')).toContainText('1 credit');
  await page.getByTestId('confirm-upload').click();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await expect(page.getByTestId('who')).toContainText('19 credits');

  await row.getByRole('link', { name: 'View the job' }).click();
  // Sent as one batch; it waits there (no attempt used) until the batch answers.
  await expect(page.locator('.job-state .state-detail')).toContainText("In the provider's batch, submitted", { timeout: 15_000 });
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 30_000 });
  await expect(page.getByTestId('cost')).toHaveText(/^Cost 1 credit/);
  await expect(page.locator('article.result-rendered')).toContainText('A scripted answer from the fake provider');
});
