import { expect, Page } from '@playwright/test';

/** Open a page and wait until the client has hydrated it. */
export async function open(page: Page, url: string) {
  await page.goto(url);
  await expect(page.locator('body')).toHaveAttribute('data-hydrated', 'true');
}

/** Sign up a fresh user (a unique e-mail per call) and land on the jobs page. */
export async function signUp(page: Page, tag: string): Promise<string> {
  const email = `${tag}-${Date.now()}-${Math.floor(Math.random() * 1e6)}@example.com`;
  await open(page, '/signup');
  await page.getByLabel('E-mail address').fill(email);
  await page.getByLabel('Password').fill('a long password');
  await page.getByRole('button', { name: 'Sign up' }).click();
  await expect(page).toHaveURL(/\/jobs$/);
  return email;
}

/** Log in and land on the jobs page. */
export async function logIn(page: Page, email: string, password: string) {
  await open(page, '/login');
  await page.getByLabel('E-mail address').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page).toHaveURL(/\/jobs$/);
}

/** Queue answers on the scripted fake provider `cargo xtask test` runs (FAKE_PROVIDER_URL). */
export async function scriptProvider(replies: object[]) {
  const url = process.env.FAKE_PROVIDER_URL;
  if (!url) throw new Error('FAKE_PROVIDER_URL is not set: run the suite through `cargo xtask test`');
  const response = await fetch(`${url}/_script`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(replies),
  });
  expect(response.status).toBe(204);
}
