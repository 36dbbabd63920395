import { Page } from '@playwright/test';
import { expect, logInAsAdmin, newPage, open, signUp, test } from './helpers';

test('files dropped on the page upload; the same file again finds the existing job and links to it', async ({ page }) => {
  await signUp(page, 'drop');
  await open(page, '/upload');
  const content = `Minutes ${Date.now()} ${Math.random()}\nWe agreed to ship on Friday.\n`;
  // A real drop event carrying a file, as the browser sends it when a file is dragged in.
  const drop = async () => {
    const transfer = await page.evaluateHandle((text) => {
      const dt = new DataTransfer();
      dt.items.add(new File([text], 'minutes.txt', { type: 'text/plain' }));
      return dt;
    }, content);
    await page.locator('.dropzone').dispatchEvent('dragover', { dataTransfer: transfer });
    await expect(page.locator('.dropzone')).toHaveClass(/dragging/);
    await page.locator('.dropzone').dispatchEvent('drop', { dataTransfer: transfer });
    // Priced and timed first; then confirmed.
    await expect(page.locator('.upload').last()).toHaveAttribute('data-outcome', 'estimated');
    await page.getByTestId('confirm-upload').click();
  };
  await drop();
  const first = page.locator('.upload').nth(0);
  await expect(first).toHaveAttribute('data-outcome', 'ok');
  await expect(page.locator('.dropzone')).not.toHaveClass(/dragging/);
  const firstLink = await first.getByRole('link', { name: 'View the job' }).getAttribute('href');

  await drop();
  const second = page.locator('.upload').nth(1);
  await expect(second).toHaveAttribute('data-outcome', 'duplicate');
  await expect(second).toContainText('You uploaded this already; here is the existing job.');
  await expect(second.getByRole('link', { name: 'View the job' })).toHaveAttribute('href', firstLink!);
  // Charged once.
  await page.goto('/jobs');
  await expect(page.locator('.job')).toHaveCount(1);
  await expect(page.getByTestId('who')).toContainText('19 credits');
});

/** Form controls on the current page with neither a label nor an accessible name. */
async function unlabelledControls(page: Page) {
  await page.waitForLoadState('networkidle');
  return page.evaluate(() =>
    Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea, button'))
      .filter((el) => {
        const labels = (el as HTMLInputElement).labels;
        const named = el.getAttribute('aria-label') || (el.tagName === 'BUTTON' && el.textContent!.trim());
        return !named && !(labels && labels.length > 0);
      })
      .map((el) => el.outerHTML.slice(0, 80)),
  );
}

test('every form control on the pages has a label', async ({ page, browser }) => {
  await signUp(page, 'labels');
  for (const url of ['/', '/upload', '/jobs', '/credits', '/notices', '/login', '/signup']) {
    await open(page, url);
    expect(await unlabelledControls(page), url).toEqual([]);
  }
  const admin = await newPage(browser);
  await logInAsAdmin(admin);
  for (const url of ['/admin', '/admin/jobs', '/admin/dead-letters', '/admin/users', '/admin/capacity', '/admin/processes', '/admin/audit']) {
    await open(admin, url);
    await expect(admin.locator('.console h1')).toBeVisible();
    await admin.waitForLoadState('networkidle');
    expect(await unlabelledControls(admin), url).toEqual([]);
  }
});
