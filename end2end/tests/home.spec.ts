import { expect, logIn, open, signUp, test } from './helpers';

test('the first page hydrates, and an account made through a server function is kept in Postgres', async ({ page, request }) => {
  await open(page, '/');
  await expect(page.getByRole('heading', { level: 1 })).toContainText('Documents in, results out');
  await expect(page.getByRole('link', { name: 'Create a free account' })).toHaveAttribute('href', '/signup');
  // It says what Sluice does today: every format read, prices by tokens with the estimate
  // first, translations back in their own format.
  const hero = page.locator('.hero');
  for (const format of ['PDFs', 'Word', 'OpenDocument', 'web pages', 'text', 'Markdown']) {
    await expect(hero).toContainText(format);
  }
  await expect(page.locator('.features')).toContainText("A document's price follows its length in tokens.");
  await expect(page.locator('.features')).toContainText('shows what each costs and when it should be done before anything is stored');
  await expect(page.locator('.features')).toContainText('comes back as a file of its kind');
  await expect(page.locator('.features')).not.toContainText('costs a credit');

  // Sign up (a server function writes the account), log out, and log in again: the account
  // and its sign-up grant come back from the database, not from the page.
  const email = await signUp(page, 'home');
  await page.getByRole('button', { name: 'Log out' }).click();
  await expect(page).toHaveURL(/\/login$/);
  await expect(page.getByTestId('who')).toHaveCount(0);
  await logIn(page, email, 'a long password');
  await expect(page.getByTestId('who')).toContainText(email);
  await expect(page.getByTestId('who')).toContainText('20 credits');

  // The database health the server reports is real.
  const health = await request.get('/healthz');
  expect(health.status()).toBe(200);
  expect((await health.json()).database).toBe('ok');
});

test('the production bundle is content-named, cached for a year, sent precompressed, and allowed by the page CSP', async ({ page }) => {
  const response = await page.goto('/');
  await expect(page.locator('body')).toHaveAttribute('data-hydrated', 'true');
  const csp = response!.headers()['content-security-policy'];
  expect(csp).toMatch(/script-src 'self' 'nonce-[\w-]+' 'wasm-unsafe-eval'/);
  const wasm = await page.locator('link[href$=".wasm"]').getAttribute('href');
  expect(wasm).toMatch(/^\/pkg\/sluice\.[\w-]{8,}\.wasm$/);
  const asset = await page.request.get(wasm!, { headers: { 'accept-encoding': 'br' } });
  expect(asset.status()).toBe(200);
  expect(asset.headers()['content-encoding']).toBe('br');
  expect(asset.headers()['cache-control']).toBe('public, max-age=31536000, immutable');
});
