import { expect, test } from './helpers';

test('the first page hydrates and a click reaches Postgres through a server function', async ({ page, request }) => {
  await page.goto('/');
  await expect(page.getByRole('heading', { level: 1 })).toContainText('Documents in, results out');
  await expect(page.locator('body')).toHaveAttribute('data-hydrated', 'true');
  await expect(page.getByRole('link', { name: 'Create a free account' })).toHaveAttribute('href', '/signup');

  const result = page.locator('#ping-result');
  await expect(result).toHaveText('Not asked yet.');
  await page.getByRole('button', { name: 'Count a click in Postgres' }).click();
  await expect(result).toHaveText(/^Postgres has counted \d+ clicks\.$/);
  const first = Number((await result.textContent())!.match(/\d+/)![0]);

  // A second click is counted by the database, not by the page.
  await page.getByRole('button', { name: 'Count a click in Postgres' }).click();
  await expect(result).not.toHaveText(`Postgres has counted ${first} clicks.`);
  const second = Number((await result.textContent())!.match(/\d+/)![0]);
  expect(second).toBeGreaterThan(first);

  // The database health the server reports is real.
  const health = await request.get('/healthz');
  expect(health.status()).toBe(200);
  expect((await health.json()).database).toBe('ok');
});
