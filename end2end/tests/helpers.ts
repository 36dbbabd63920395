import { test as base, expect, Browser, Locator, Page, TestInfo } from '@playwright/test';
import { execFileSync } from 'child_process';

export { expect };

/** One test's console errors (from every page it opens) and the ones it expects. */
class ConsoleWatch {
  errors: string[] = [];
  allowed: RegExp[] = [];

  /** Record this page's console errors and uncaught exceptions. */
  watch(page: Page) {
    page.on('console', (m) => {
      if (m.type() === 'error') this.errors.push(`${page.url()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => this.errors.push(`${page.url()}: uncaught ${e.message}`));
  }

  unexpected(): string[] {
    return this.errors.filter((e) => !this.allowed.some((p) => p.test(e)));
  }
}

// Each test's watch lives as long as its fixture; keyed by the test, so nothing is shared.
const watches = new WeakMap<TestInfo, ConsoleWatch>();

function currentWatch(): ConsoleWatch {
  const watch = watches.get(base.info());
  if (!watch) throw new Error('no console watch: use `test` from ./helpers');
  return watch;
}

/** A console error this test expects (the browser logs refused uploads' statuses, for one). */
export function allowConsoleError(pattern: RegExp) {
  currentWatch().allowed.push(pattern);
}

/** Watch a page this test made itself (in its own browser context) for console errors. */
export function watchConsole(page: Page) {
  currentWatch().watch(page);
}

/** Another page (its own session), watched for console errors like the default one. */
export async function newPage(browser: Browser): Promise<Page> {
  const page = await browser.newPage();
  currentWatch().watch(page);
  return page;
}

/** Playwright's `test`, failing any test whose pages logged an unexpected console error. */
export const test = base.extend<{ noConsoleErrors: void }>({
  noConsoleErrors: [
    async ({ page }, use, testInfo) => {
      const watch = new ConsoleWatch();
      watches.set(testInfo, watch);
      watch.watch(page);
      await use();
      watches.delete(testInfo);
      expect(watch.unexpected()).toEqual([]);
    },
    { auto: true },
  ],
});

/** A setting `cargo xtask test` passes in the environment (no defaults: they would drift). */
export function fromEnv(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the suite through \`cargo xtask test\``);
  return value;
}

/** The operator account `cargo xtask test` creates. */
export const admin = {
  get email() {
    return fromEnv('ADMIN_EMAIL');
  },
  get password() {
    return fromEnv('ADMIN_PASSWORD');
  },
};

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
  // The free credits come when the address is confirmed by the link mailed to it.
  await open(page, await mailedLink(email, '/verify?token='));
  await page.getByRole('button', { name: 'Confirm my address' }).click();
  await expect(page.getByTestId('verified')).toBeVisible();
  await open(page, '/jobs');
  return email;
}

/** A mail the mailbox (a real SMTP server `cargo xtask test` starts) received. */
export interface Mail {
  to: string[];
  subject: string;
  text: string;
  list_unsubscribe: string | null;
}

/** The mails to `email` so far, oldest first. */
export async function mailsTo(email: string): Promise<Mail[]> {
  const response = await fetch(`${fromEnv('MAILBOX_URL')}/messages?to=${encodeURIComponent(email)}`);
  expect(response.ok).toBeTruthy();
  return (await response.json()) as Mail[];
}

/** The newest link to this site starting with `path` mailed to `email` (waits up to 15 s). */
export async function mailedLink(email: string, path: string, newerThan = 0): Promise<string> {
  const prefix = `${fromEnv('BASE_URL')}${path}`;
  let links: string[] = [];
  await expect
    .poll(async () => {
      const mails = (await mailsTo(email)).slice(newerThan);
      links = mails.flatMap((m) => m.text.split(/\s+/).filter((word) => word.startsWith(prefix)));
      return links.length;
    }, { timeout: 15_000 })
    .toBeGreaterThan(0);
  return links[links.length - 1];
}

/** Log in and land on the jobs page. */
export async function logIn(page: Page, email: string, password: string) {
  await open(page, '/login');
  await page.getByLabel('E-mail address').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await expect(page).toHaveURL(/\/jobs$/);
}

/** The scripted fake provider `cargo xtask test` runs (FAKE_PROVIDER_URL), and `path` on it. */
export function fakeProvider(path: string): string {
  const url = process.env.FAKE_PROVIDER_URL;
  if (!url) throw new Error('FAKE_PROVIDER_URL is not set: run the suite through `cargo xtask test`');
  return `${url}${path}`;
}

async function tellFakeProvider(path: string, body: unknown) {
  const response = await fetch(fakeProvider(path), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(response.status).toBe(204);
}

/** Queue answers on the scripted fake provider. */
export async function scriptProvider(replies: object[]) {
  await tellFakeProvider('/_script', replies);
}

/** Make the shared fake answer prompts holding `only_for` like a hosted model (time per
 * output token, answers as long as a translation's text, cut at max_tokens); see
 * `fakeprovider::HostedModel`. Other flows' scripts are left alone. */
export async function hostedModel(model: { only_for: string } & Record<string, unknown>) {
  await tellFakeProvider('/_model', model);
}

/** What the hosted model for `onlyFor` did (calls, most at once, answers cut, ...). */
export async function hostedModelReport(onlyFor: string) {
  return (await fetch(fakeProvider(`/_model?only_for=${encodeURIComponent(onlyFor)}`))).json();
}

/** Run an operator command (`server …`, set up by `cargo xtask test`) and return what it printed. */
export function serverCommand(args: string[]): string {
  const server = process.env.SLUICE_SERVER_BIN;
  if (!server || !process.env.DATABASE_URL) {
    throw new Error('SLUICE_SERVER_BIN and DATABASE_URL are not set: run the suite through `cargo xtask test`');
  }
  return execFileSync(server, args, { env: { ...process.env, SLUICE_LOG: 'warn' }, stdio: 'pipe' }).toString();
}

/** Change a user's balance the way an operator does: `server grant-credits`. */
export function grantCredits(email: string, amount: number) {
  serverCommand(['grant-credits', '--email', email, `--amount=${amount}`]);
}

/** Log in as the operator `cargo xtask test` creates. */
export async function logInAsAdmin(page: Page) {
  await logIn(page, admin.email, admin.password);
}

/** Flip the kill switch from the admin page (accepting the confirmation). */
export async function setProcessing(admin: Page, on: boolean) {
  await open(admin, '/admin');
  const want = on ? 'On' : 'Paused';
  const state = admin.getByTestId('processing-state');
  await expect(state).toHaveText(/^(On|Paused)$/);
  if ((await state.textContent()) !== want) {
    admin.once('dialog', (d) => d.accept());
    await admin.getByRole('button', { name: on ? 'Resume processing' : 'Pause processing' }).click();
  }
  await expect(state).toHaveText(want);
}

type Files = Parameters<Locator['setInputFiles']>[0];

/** Choose files on the upload page, and wait until each is priced and timed by the server (or
 * refused by its estimate): nothing is sent for good yet. */
export async function chooseFiles(page: Page, files: Files) {
  const rows = page.locator('.upload');
  const before = await rows.count();
  await page.locator('#files').setInputFiles(files);
  await expect(rows).toHaveCount(before + (Array.isArray(files) ? files.length : 1));
  await expect(page.locator('.upload[data-outcome="estimating"]')).toHaveCount(0, { timeout: 15_000 });
}

/** Choose files and confirm their upload, as a user does (a file its estimate refused is not
 * sent: there is then nothing to confirm). */
export async function uploadFiles(page: Page, files: Files) {
  await chooseFiles(page, files);
  const confirm = page.getByTestId('confirm-upload');
  if (await confirm.isVisible()) await confirm.click();
}

/** A small text document whose content (and so its duplicate check) is unique. */
export function uniqueText(name: string) {
  return {
    name,
    mimeType: 'text/plain',
    buffer: Buffer.from(`Notes ${name} ${Date.now()} ${Math.random()}\nThe quick brown fox.\n`),
  };
}

/** CRC-32 (the zip one), for the files below. */
function crc32(bytes: Buffer): number {
  let crc = ~0;
  for (const byte of bytes) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return ~crc >>> 0;
}

/** A zip of these entries, stored (not deflated), as a test builds one. */
function storedZip(entries: [string, string][]): Buffer {
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const [name, text] of entries) {
    const data = Buffer.from(text);
    const nameBytes = Buffer.from(name);
    const header = Buffer.alloc(30);
    header.writeUInt32LE(0x04034b50, 0);
    header.writeUInt16LE(20, 4);
    header.writeUInt32LE(crc32(data), 14);
    header.writeUInt32LE(data.length, 18);
    header.writeUInt32LE(data.length, 22);
    header.writeUInt16LE(nameBytes.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE(20, 4);
    central.writeUInt16LE(20, 6);
    central.writeUInt32LE(crc32(data), 16);
    central.writeUInt32LE(data.length, 20);
    central.writeUInt32LE(data.length, 24);
    central.writeUInt16LE(nameBytes.length, 28);
    central.writeUInt32LE(offset, 42);
    locals.push(header, nameBytes, data);
    centrals.push(central, nameBytes);
    offset += 30 + nameBytes.length + data.length;
  }
  const directory = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(entries.length, 8);
  end.writeUInt16LE(entries.length, 10);
  end.writeUInt32LE(directory.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, directory, end]);
}

/** A Word file (.docx) whose body is a heading and these paragraphs. */
export function wordFile(name: string, heading: string, paragraphs: string[]) {
  const p = (text: string, style = '') =>
    `<w:p>${style ? `<w:pPr><w:pStyle w:val="${style}"/></w:pPr>` : ''}<w:r><w:t xml:space="preserve">${text}</w:t></w:r></w:p>`;
  return wordFileOf(name, `${p(heading, 'Heading1')}${paragraphs.map((t) => p(t)).join('')}`);
}

/** A Word file (.docx) with this body XML (namespaces `w` and `r` declared) and other parts. */
export function wordFileOf(name: string, body: string, parts: [string, string][] = []) {
  const document = `<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><w:body>${body}</w:body></w:document>`;
  const buffer = storedZip([
    ['[Content_Types].xml', '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'],
    ['_rels/.rels', '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>'],
    ['word/document.xml', document],
    ...parts,
  ]);
  return { name, mimeType: 'application/vnd.openxmlformats-officedocument.wordprocessingml.document', buffer };
}

/** One entry of a zip (stored or deflated), found through its central directory. */
export function zipEntry(zip: Buffer, wanted: string): string {
  const end = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  let at = zip.readUInt32LE(end + 16);
  for (let i = 0; i < zip.readUInt16LE(end + 10); i++) {
    const method = zip.readUInt16LE(at + 10);
    const size = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const name = zip.subarray(at + 46, at + 46 + nameLength).toString();
    const local = zip.readUInt32LE(at + 42);
    if (name === wanted) {
      const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
      const data = zip.subarray(start, start + size);
      return (method === 8 ? require('zlib').inflateRawSync(data) : data).toString();
    }
    at += 46 + nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
  }
  throw new Error(`${wanted} is not in the zip`);
}
