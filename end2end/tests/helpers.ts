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
