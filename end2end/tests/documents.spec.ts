import { expect, test } from '@playwright/test';
import * as path from 'path';
import { open, signUp } from './helpers';


test('sign up, upload a PDF, watch it finish and open the result', async ({ page }) => {
  const errors: string[] = [];
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  const email = await signUp(page, 'pdf');
  await expect(page.getByTestId('who')).toContainText(email);
  await expect(page.getByText('No jobs yet')).toBeVisible();

  await page.getByRole('link', { name: 'Upload documents' }).click();
  await expect(page).toHaveURL(/\/upload$/);
  await page.locator('#files').setInputFiles(path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'ok');
  await expect(row).toContainText('Accepted and queued.');

  await row.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  await expect(page.locator('.result-text')).toContainText('Quarterly report');
  await expect(page.locator('.result-text')).toContainText('words');
  await expect(page.getByRole('link', { name: 'Download the result' })).toBeVisible();

  await page.getByRole('link', { name: '← All jobs' }).click();
  const job = page.locator('.job').first();
  await expect(job.locator('.file-name')).toHaveText('report.pdf');
  await expect(job.locator('.badge')).toHaveAttribute('data-state', 'done');
  await expect(page.getByTestId('who')).toContainText('19 credits');
  expect(errors).toEqual([]);
});

test('an HTML file renamed .pdf is refused with the 415 message and costs nothing', async ({ page }) => {
  await signUp(page, 'html');
  await open(page, '/upload');
  await page.locator('#files').setInputFiles({
    name: 'invoice.pdf',
    mimeType: 'application/pdf',
    buffer: Buffer.from('<!DOCTYPE html><html><body><script>alert(1)</script></body></html>'),
  });
  const row = page.locator('.upload').first();
  await expect(row).toHaveAttribute('data-outcome', 'refused');
  await expect(row).toContainText('Not a supported document');
  await expect(row).toContainText('HTML');
  await page.goto('/jobs');
  await expect(page.getByText('No jobs yet')).toBeVisible();
  await expect(page.getByTestId('who')).toContainText('20 credits');
});

test('wrong passwords get a helpful message', async ({ page }) => {
  await open(page, '/login');
  await page.getByLabel('E-mail address').fill(`nobody-${Date.now()}@example.com`);
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page.getByRole('alert')).toHaveText('That e-mail address and password do not match an account.');
});
