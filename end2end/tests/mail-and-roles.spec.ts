// Accounts people can keep: a forgotten password reset by a link read from the SMTP server,
// the old session ended, the link good once; mail choices; each staff role sees only what it
// may do in the console.
import { allowConsoleError, expect, logIn, mailedLink, mailsTo, newPage, open, serverCommand, signUp, test } from './helpers';

test('a forgotten password is reset by the mailed link, once, and the old session ends', async ({ page, browser }) => {
  // The browser logs the refused log-in (401) and the spent link (410).
  allowConsoleError(/status of 401/);
  allowConsoleError(/status of 410/);
  const email = await signUp(page, 'forgetful');
  // Another device, logged in before the reset.
  const other = await newPage(browser);
  await logIn(other, email, 'a long password');

  const fresh = await newPage(browser);
  await open(fresh, '/login');
  await fresh.getByRole('link', { name: 'Forgot your password?' }).click();
  await expect(fresh).toHaveURL(/\/forgot$/);
  const before = (await mailsTo(email)).length;
  await fresh.getByLabel('E-mail address').fill(email);
  await fresh.getByRole('button', { name: 'Mail me a link' }).click();
  await expect(fresh.getByTestId('reset-sent')).toContainText('If an account uses that address');

  const link = await mailedLink(email, '/reset?token=', before);
  const mail = (await mailsTo(email)).slice(-1)[0];
  expect(mail.subject).toBe('Reset your Sluice password');
  expect(mail.list_unsubscribe).toBeNull();
  await open(fresh, link);
  await fresh.getByLabel('New password').fill('a brand new password');
  await fresh.getByRole('button', { name: 'Set the password' }).click();
  await expect(fresh).toHaveURL(/\/account\?reset=1$/);
  await expect(fresh.getByTestId('password-reset')).toBeVisible();
  await expect(fresh.getByTestId('account-email')).toHaveText(email);

  // The device logged in before is signed out.
  await open(other, '/jobs');
  await expect(other).toHaveURL(/\/login\?next=\/jobs$/);
  // The old password no longer works; the new one does.
  await open(other, '/login');
  await other.getByLabel('E-mail address').fill(email);
  await other.getByLabel('Password').fill('a long password');
  await other.getByRole('button', { name: 'Log in' }).click();
  await expect(other.getByRole('alert')).toContainText('do not match an account');
  await logIn(other, email, 'a brand new password');

  // The link works once.
  await open(other, link);
  await other.getByLabel('New password').fill('yet another password');
  await other.getByRole('button', { name: 'Set the password' }).click();
  await expect(other.getByRole('alert')).toContainText('expired or was already used');
});

test('an unknown address is answered like a known one, and nothing is mailed', async ({ page }) => {
  const nobody = `nobody-${Date.now()}@example.com`;
  await open(page, '/forgot');
  await page.getByLabel('E-mail address').fill(nobody);
  await page.getByRole('button', { name: 'Mail me a link' }).click();
  await expect(page.getByTestId('reset-sent')).toContainText('If an account uses that address');
  await page.waitForTimeout(1000);
  expect(await mailsTo(nobody)).toEqual([]);
});

test('the account page changes the password and saves which notices come by mail', async ({ page }) => {
  allowConsoleError(/status of 422/); // the wrong current password
  const email = await signUp(page, 'chooser');
  await open(page, '/account');
  await expect(page.getByTestId('account-email')).toHaveText(email);
  await expect(page.getByTestId('unconfirmed')).toHaveCount(0);
  const done = page.getByLabel('A document is done');
  await expect(done).toBeChecked();
  await done.uncheck();
  await expect(done).not.toBeChecked();
  await page.reload();
  await expect(page.locator('body')).toHaveAttribute('data-hydrated', 'true');
  await expect(page.getByLabel('A document is done')).not.toBeChecked();
  await expect(page.getByLabel('My credits run low')).toBeChecked();

  await page.getByLabel('Current password').fill('not my password');
  await page.getByLabel('New password').fill('a changed password');
  await page.getByRole('button', { name: 'Change the password' }).click();
  await expect(page.getByRole('alert')).toContainText('current password is not right');
  await page.getByLabel('Current password').fill('a long password');
  await page.getByRole('button', { name: 'Change the password' }).click();
  await expect(page.getByTestId('password-changed')).toBeVisible();
  // This session stays.
  await open(page, '/jobs');
  await expect(page).toHaveURL(/\/jobs$/);
});

test('support reads the console without its actions; an operator acts but sets no gate', async ({ page, browser }) => {
  const email = await signUp(page, 'helpdesk');
  serverCommand(['set-role', '--email', email, '--role', 'support']);
  // A change of role ends the account's sessions: its holder logs in again.
  await logIn(page, email, 'a long password');
  await open(page, '/admin');
  await expect(page.getByTestId('kill-switch')).toBeVisible();
  await expect(page.getByTestId('processing-state')).toHaveText(/^(On|Paused)$/);
  await expect(page.getByRole('button', { name: 'Pause processing' })).toHaveCount(0);
  await expect(page.getByRole('button', { name: 'Resume processing' })).toHaveCount(0);
  await expect(page.getByRole('button', { name: 'Set the gate' })).toHaveCount(0);

  const operatorPage = await newPage(browser);
  const operator = await signUp(operatorPage, 'operator');
  serverCommand(['set-role', '--email', operator, '--role', 'operator']);
  await logIn(operatorPage, operator, 'a long password');
  await open(operatorPage, '/admin');
  await expect(operatorPage.getByRole('button', { name: /^(Pause|Resume) processing$/ })).toBeVisible();
  await expect(operatorPage.getByRole('button', { name: 'Set the gate' })).toHaveCount(0);
  await open(operatorPage, '/admin/users');
  await operatorPage.getByLabel('E-mail').fill(email);
  await operatorPage.getByRole('button', { name: 'Look up' }).click();
  await expect(operatorPage.getByTestId('user-summary')).toContainText(email);
  await expect(operatorPage.getByRole('button', { name: 'Grant' })).toHaveCount(0);

  // A plain user finds no console at all.
  serverCommand(['set-role', '--email', email, '--role', 'user']);
  await logIn(page, email, 'a long password');
  await open(page, '/admin');
  await expect(page.getByText('Page not found.')).toBeVisible();
});
