import * as path from 'path';
import { expect, open, scriptProvider, signUp, test, uniqueText, uploadFiles } from './helpers';

test('a running job shows its stage live: the pages read, then waiting for the provider since when', async ({ page }) => {
  await signUp(page, 'stage');
  await scriptProvider([{ kind: 'hang', millis: 4_000 }]);
  await open(page, '/upload');
  await uploadFiles(page, path.join(__dirname, '..', 'fixtures', 'report.pdf'));
  await page.locator('.upload').first().getByRole('link', { name: 'View the job' }).click();
  const detail = page.locator('.job-state .state-detail');
  await expect(detail).toHaveAttribute('data-stage', 'waiting_for_provider', { timeout: 10_000 });
  await expect(detail).toHaveText(/^Read 1 page\. Waiting for the provider since .+ \(\d+ s\)\.$/);
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  await expect(detail).not.toHaveAttribute('data-stage', /.+/);
  await expect(page.getByTestId('cost')).toHaveText('Cost 1 credit · 1 token in, 1 out');

  // The list shows the stage too, and each job's cost.
  await scriptProvider([{ kind: 'hang', millis: 4_000 }]);
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('second.txt'));
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await open(page, '/jobs');
  const running = page.locator('.job').first();
  await expect(running.locator('.state-detail')).toHaveAttribute('data-stage', 'waiting_for_provider', { timeout: 10_000 });
  await expect(running.getByTestId('cost')).toHaveText('Cost 1 credit');
});

test('a hostile result is shown rendered but harmless', async ({ page }) => {
  await signUp(page, 'hostile-result');
  await scriptProvider([
    {
      kind: 'success',
      text: '**Summary** with <script>window.__pwned = 1</script> and [a link](javascript:window.__pwned=2) and <img src=x onerror="window.__pwned=3">',
      input_tokens: 10,
      output_tokens: 5,
    },
  ]);
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('hostile.txt'));
  await page.locator('.upload').first().getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  const result = page.locator('article.result-rendered');
  await expect(result.locator('strong')).toHaveText('Summary');
  await expect(result).toContainText('<script>window.__pwned = 1</script>');
  await expect(result.locator('script, img, [onerror]')).toHaveCount(0);
  expect(await result.locator('a').getAttribute('href')).toBeNull();
  await result.locator('a').click();
  expect(await page.evaluate(() => (window as any).__pwned)).toBeUndefined();
});

test('a job that ends in a background tab is counted in the title and notified after opting in', async ({ page }) => {
  test.setTimeout(60_000);
  await page.context().grantPermissions(['notifications']);
  // Make the tab's visibility switchable, and record notifications instead of showing them.
  await page.addInitScript(() => {
    const w = window as any;
    w.__hidden = false;
    w.__notes = [];
    Object.defineProperty(document, 'visibilityState', { get: () => (w.__hidden ? 'hidden' : 'visible') });
    const Real = window.Notification;
    class Recorded {
      constructor(title: string, options?: NotificationOptions) {
        w.__notes.push({ title, body: options?.body });
      }
      static get permission() {
        return Real.permission;
      }
      static requestPermission() {
        return Real.requestPermission();
      }
    }
    w.Notification = Recorded;
  });
  await signUp(page, 'background');
  await expect(page).toHaveTitle('Sluice');
  await page.getByRole('button', { name: 'Notify me when a job ends' }).click();
  await expect(page.getByRole('button', { name: 'Turn off' })).toBeVisible();

  await scriptProvider([{ kind: 'hang', millis: 3_000 }]);
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('while-away.txt'));
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
  await open(page, '/jobs');
  await expect(page.locator('.job .badge').first()).not.toHaveAttribute('data-state', 'done');
  const setHidden = (hidden: boolean) =>
    page.evaluate((h) => {
      (window as any).__hidden = h;
      document.dispatchEvent(new Event('visibilitychange'));
    }, hidden);
  await setHidden(true);
  await expect(page).toHaveTitle('(1) Sluice', { timeout: 30_000 });
  const notes = await page.evaluate(() => (window as any).__notes);
  expect(notes).toEqual([{ title: 'while-away.txt is done', body: 'The result is ready in Sluice.' }]);
  await setHidden(false);
  await expect(page).toHaveTitle('Sluice');
});
