import * as path from 'path';
import { expect, logInAsAdmin, newPage, open, scriptProvider, signUp, test, uniqueText, uploadFiles } from './helpers';

// The book's pictures (docs/src/screenshots), taken from the real pages on every run so they stay current.
const shots = path.join(__dirname, '..', '..', 'docs', 'src', 'screenshots');

test('the book screenshots: upload, jobs, a job, the console', async ({ page, browser }) => {
  await page.setViewportSize({ width: 1100, height: 760 });
  await signUp(page, 'screens');
  await scriptProvider([
    {
      kind: 'success',
      text: '# Quarterly report\n\nRevenue grew by **12 percent**, led by the new region.\n\n- Costs fell 3 percent\n- Headcount stayed flat\n\n| Quarter | Revenue |\n|---|---|\n| Q1 | 1.2 M |\n| Q2 | 1.35 M |',
      input_tokens: 1840,
      output_tokens: 96,
    },
    { kind: 'hang', millis: 4_000 },
  ]);
  await open(page, '/upload');
  await uploadFiles(page, [uniqueText('quarterly-report.txt'), uniqueText('meeting-notes.md')]);
  await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(2);
  await page.screenshot({ path: path.join(shots, 'upload.png') });

  await open(page, '/jobs');
  await expect(page.locator('.job .badge[data-state="done"]')).toHaveCount(1, { timeout: 15_000 });
  await page.screenshot({ path: path.join(shots, 'jobs.png') });
  await page.locator('.job').filter({ has: page.locator('.badge[data-state="done"]') }).getByRole('link', { name: 'Open the result' }).click();
  await expect(page.locator('article.result-rendered h1')).toBeVisible();
  await page.screenshot({ path: path.join(shots, 'job.png'), fullPage: true });

  const admin = await newPage(browser);
  await admin.setViewportSize({ width: 1100, height: 900 });
  await logInAsAdmin(admin);
  await open(admin, '/admin');
  await expect(admin.getByTestId('chart-max')).toBeVisible();
  await expect(admin.getByTestId('outcome-row')).toHaveCount(24);
  await admin.screenshot({ path: path.join(shots, 'admin.png'), fullPage: true });
  await open(admin, '/admin/dead-letters');
  await expect(admin.getByTestId('reviews')).toBeVisible();
  await admin.screenshot({ path: path.join(shots, 'console-dead-letters.png'), fullPage: true });
  await open(admin, '/admin/processes');
  await expect(admin.getByTestId('process').first()).toBeVisible();
  await admin.screenshot({ path: path.join(shots, 'console-processes.png') });
});
