import { execFileSync } from 'child_process';
import { allowConsoleError, expect, fromEnv, open, signUp, test } from './helpers';

/** Run pg_ctl on the suite's Postgres (as its unprivileged owner when we are root). */
function pgCtl(args: string[]) {
  const command = [fromEnv('E2E_PG_CTL'), '-D', fromEnv('E2E_PG_DATA'), ...args];
  const asRoot = process.getuid?.() === 0;
  execFileSync(asRoot ? 'runuser' : command[0], asRoot ? ['-u', 'postgres', '--', ...command] : command.slice(1), {
    stdio: 'pipe',
    cwd: '/',
  });
}

test('while Postgres restarts, pages say Sluice is restarting instead of failing, and recover by themselves', async ({ page }) => {
  test.setTimeout(60_000);
  allowConsoleError(/status of 503 \(Service Unavailable\)/);
  await signUp(page, 'restart');
  await open(page, '/jobs');
  await expect(page.getByText('No jobs yet')).toBeVisible();
  pgCtl(['stop', '-m', 'fast', '-w']);
  try {
    await page.reload();
    await expect(page.getByRole('alert')).toHaveText('Sluice is restarting, try again in a few seconds');
    await expect(page).toHaveURL(/\/jobs$/);
  } finally {
    pgCtl(['start', '-w', '-t', '60', '-o', fromEnv('E2E_PG_OPTIONS'), '-l', `${fromEnv('E2E_PG_DATA')}/server.log`]);
  }
  // The page asks again every 5 s and shows the jobs once Postgres is back.
  await expect(page.getByText('No jobs yet')).toBeVisible({ timeout: 20_000 });
});
