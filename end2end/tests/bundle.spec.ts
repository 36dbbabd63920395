import { expect, logInAsAdmin, newPage, open, signUp, test } from './helpers';

/** The bundle's budget: what a user's pages download of WASM and JS, as served (brotli). */
const USER_BUDGET_BYTES = 400_000;

/** Every WASM and JS file a page fetches while `visit` runs, with the bytes that came over the wire. */
async function scriptsFetched(page: import('@playwright/test').Page, visit: () => Promise<void>) {
  const fetched: Promise<[string, number]>[] = [];
  const listen = (response: import('@playwright/test').Response) => {
    const url = response.url();
    if (/\/pkg\/.*\.(wasm|js)$/.test(url)) {
      fetched.push(response.request().sizes().then((s) => [url.replace(/^.*\/pkg\//, ''), s.responseBodySize] as [string, number]));
    }
  };
  page.on('response', listen);
  await visit();
  await page.waitForLoadState('networkidle');
  page.off('response', listen);
  // Each file once, as it first came over the wire (later loads come from the browser's cache).
  const seen = new Map<string, number>();
  for (const [file, bytes] of await Promise.all(fetched)) {
    if (bytes > 0 && !seen.has(file)) seen.set(file, bytes);
  }
  return [...seen.entries()];
}

test("a user's pages load a bundle within its budget, and never the console's code", async ({ page, browser }) => {
  const userFiles = await scriptsFetched(page, async () => {
    await signUp(page, 'bundle');
    for (const url of ['/upload', '/jobs', '/credits']) await open(page, url);
  });
  const total = userFiles.reduce((sum, [, bytes]) => sum + bytes, 0);
  console.log(`user pages: ${userFiles.map(([f, b]) => `${f} ${b} B`).join(', ')}; ${total} B in all`);
  expect(userFiles.some(([f]) => f.endsWith('.wasm')), 'the app itself').toBe(true);
  expect(total, `a user's pages download ${total} bytes of WASM and JS`).toBeLessThanOrEqual(USER_BUDGET_BYTES);

  // The console comes in chunks of its own, fetched when an admin opens it.
  const admin = await newPage(browser);
  const adminFiles = await scriptsFetched(admin, async () => {
    await logInAsAdmin(admin);
    await open(admin, '/admin');
    await expect(admin.getByTestId('processing-state')).toBeVisible();
  });
  const chunks = adminFiles.filter(([f]) => !userFiles.some(([u]) => u === f));
  console.log(`the console adds: ${chunks.map(([f, b]) => `${f} ${b} B`).join(', ')}`);
  expect(chunks.some(([f]) => f.endsWith('.wasm')), 'the console is a chunk of its own').toBe(true);
});
