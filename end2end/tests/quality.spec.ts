import { expect, logInAsAdmin, open, signUp, test, uniqueText, uploadFiles, watchConsole } from './helpers';

test('a logged-out visitor is sent to log in, then back to the page they asked for', async ({ page }) => {
  const email = await signUp(page, 'next');
  await page.getByRole('button', { name: 'Log out' }).click();
  await expect(page).toHaveURL(/\/login$/);
  await expect(page.getByRole('link', { name: 'Log in' })).toBeVisible();

  await open(page, '/credits');
  await expect(page).toHaveURL(/\/login\?next=%2Fcredits|\/login\?next=\/credits/);
  await page.getByLabel('E-mail address').fill(email);
  await page.getByLabel('Password').fill('a long password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page).toHaveURL(/\/credits$/);
  await expect(page.getByTestId('balance')).toHaveText('20');
});

/** The page is no wider than the screen: nothing to scroll sideways on a phone. */
async function expectFitsTheScreen(page: import('@playwright/test').Page, url: string) {
  await open(page, url);
  await page.waitForLoadState('networkidle');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  expect(overflow, `${url} is ${overflow}px wider than the screen`).toBeLessThanOrEqual(0);
}

test('every page fits a phone screen', async ({ browser }) => {
  const phone = { viewport: { width: 360, height: 740 }, isMobile: true, hasTouch: true };
  const user = await browser.newContext(phone);
  const page = await user.newPage();
  watchConsole(page);
  await signUp(page, 'phone');
  await open(page, '/upload');
  await uploadFiles(page, uniqueText('a-rather-long-file-name-for-a-small-screen-report.txt'));
  await expect(page.locator('.upload[data-outcome="ok"]')).toHaveCount(1);
  await page.getByRole('link', { name: 'View the job' }).click();
  await expect(page.locator('.badge')).toHaveText('Done', { timeout: 15_000 });
  const job = page.url().replace(/^https?:\/\/[^/]+/, '');
  for (const url of ['/', '/upload', '/jobs', job, '/credits', '/notices']) {
    await expectFitsTheScreen(page, url);
  }

  const adminContext = await browser.newContext(phone);
  const admin = await adminContext.newPage();
  watchConsole(admin);
  await logInAsAdmin(admin);
  for (const url of ['/admin', '/admin/jobs', '/admin/dead-letters', '/admin/users', '/admin/capacity', '/admin/processes', '/admin/audit']) {
    await expectFitsTheScreen(admin, url);
    await expect(admin.locator('.console h1')).toBeVisible();
  }
  await user.close();
  await adminContext.close();
});
