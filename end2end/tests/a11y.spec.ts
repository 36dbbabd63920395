import AxeBuilder from '@axe-core/playwright';
import { Page } from '@playwright/test';
import { expect, logInAsAdmin, open, signUp, test, uniqueText, uploadFiles, watchConsole } from './helpers';

/** Serious and critical accessibility violations on the current page, by axe-core. */
async function seriousViolations(page: Page) {
  await page.waitForLoadState('networkidle');
  const results = await new AxeBuilder({ page }).withTags(['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']).analyze();
  return results.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
}

test('no page has a serious or critical accessibility violation', async ({ page, browser }) => {
  test.setTimeout(90_000);
  for (const url of ['/', '/login', '/signup']) {
    await open(page, url);
    expect(await seriousViolations(page), url).toEqual([]);
  }
  await signUp(page, 'axe');
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('axe.txt'));
  await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(1);
  expect(await seriousViolations(page), '/upload with an upload').toEqual([]);
  await page.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  expect(await seriousViolations(page), 'a job').toEqual([]);
  for (const url of ['/jobs', '/credits', '/notices']) {
    await open(page, url);
    expect(await seriousViolations(page), url).toEqual([]);
  }
  // Its own context: axe-core needs one (a bare browser.newPage() has none it can use).
  const context = await browser.newContext();
  const admin = await context.newPage();
  watchConsole(admin);
  await logInAsAdmin(admin);
  for (const url of ['/admin', '/admin/jobs', '/admin/dead-letters', '/admin/users', '/admin/capacity', '/admin/processes', '/admin/audit']) {
    await open(admin, url);
    await expect(admin.locator('.console h1')).toBeVisible();
    await admin.waitForLoadState('networkidle');
    expect(await seriousViolations(admin), url).toEqual([]);
  }
  await context.close();
});

test('the drop zone is reachable and usable from the keyboard, with visible focus', async ({ page }) => {
  await signUp(page, 'keyboard');
  await open(page, '/upload');
  let reached = false;
  for (let i = 0; i < 25 && !reached; i++) {
    await page.keyboard.press('Tab');
    reached = await page.evaluate(() => document.activeElement?.id === 'files');
  }
  expect(reached, 'Tab reaches the file chooser').toBe(true);
  // The focus shows on the drop zone (the input itself is visually hidden).
  const outline = await page.locator('.dropzone').evaluate((el) => getComputedStyle(el).outlineStyle);
  expect(outline).not.toBe('none');
  const chooser = page.waitForEvent('filechooser');
  await page.keyboard.press('Space');
  await (await chooser).setFiles(uniqueText('by-keyboard.txt'));
  // Priced and timed, it is confirmed from the keyboard too.
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'estimated');
  let confirm = false;
  for (let i = 0; i < 15 && !confirm; i++) {
    await page.keyboard.press('Tab');
    confirm = await page.evaluate(() => document.activeElement?.getAttribute('data-testid') === 'confirm-upload');
  }
  expect(confirm, 'Tab reaches the Upload button').toBe(true);
  await page.keyboard.press('Enter');
  await expect(page.locator('.upload').first()).toHaveAttribute('data-outcome', 'ok');
});
