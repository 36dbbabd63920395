//! Queue benchmark: `cargo xtask bench` (release build, private Postgres).
//!
//! 1. Drain: 20,000 pre-inserted no-op jobs through the real engine with 24 worker tasks.
//! 2. Pickup: one job enqueued to an idle pool until its processor starts, 200 times.
//! 3. Place in line: `waiting_line` (what a waiting user's jobs page asks every 2 s) with the
//!    intake bound's 10,000 jobs waiting across 100 owners and 24 running, for a user with 3 and
//!    with 200 waiting jobs, 100 calls each.
//!
//! Prints each run and the medians, and a `RESULT drain=.. pickup_p50=.. pickup_p95=.. pickup_p99=.. pickup_max=..` line
//! that `cargo xtask bench` reads to set Sluice beside graphile-worker run by run, with the CPU
//! each drained job cost this process and Postgres (`worker_cpu_us=.. pg_cpu_us=..`; Postgres's
//! is read from /proc for the postmaster named by PG_POSTMASTER_PID and its children). Options:
//! --runs N (default 3), --jobs N (default 20000), --parts queue,line,scale (default queue,line).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::queue::hooks::NoHooks;
use engine::queue::worker::{WorkerConfig, WorkerPool};
use engine::queue::{ClaimedJob, JobError, JobOutput};
use sqlx::PgPool;
use tokio::sync::mpsc;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn config() -> WorkerConfig {
    WorkerConfig { name: "bench".into(), concurrency: 24, ..WorkerConfig::default() }
}

async fn noop(_job: ClaimedJob) -> Result<JobOutput, JobError> {
    Ok(JobOutput::default())
}

async fn reset(pool: &PgPool) {
    sqlx::query(
        "TRUNCATE jobs, job_attempts, job_parts, parts_read, job_writing, reviews, kept_answers, kept_scan_texts",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE jobs").execute(pool).await.unwrap();
}

/// The drain's rate in jobs/s, and the CPU microseconds per job of this process and of Postgres.
async fn drain_run(pool: &PgPool, jobs: usize) -> (f64, f64, f64) {
    reset(pool).await;
    // 100 owners, so the fair claim has real work to do.
    let drained = drain_owners(pool, jobs, 100).await;
    let per_job = |secs: f64| secs * 1e6 / jobs as f64;
    (drained.rate, per_job(drained.own_cpu_secs), per_job(drained.postgres_cpu_secs))
}

/// A drain's rate and the CPU it cost, from the workers' start to the last job done (the
/// graphile-worker benchmark's window: the jobs' insert is not in it).
struct Drained {
    rate: f64,
    own_cpu_secs: f64,
    postgres_cpu_secs: f64,
}

/// CPU seconds from /proc (100 ticks a second), as the graphile-worker benchmark reads them.
mod cpu {
    /// (parent pid, own seconds, reaped children's seconds) of `pid`.
    fn of(pid: &str) -> Option<(u32, f64, f64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
        Some((fields.get(1)?.parse().ok()?, ticks(11) + ticks(12), ticks(13) + ticks(14)))
    }

    pub fn own() -> f64 {
        of("self").map_or(f64::NAN, |(_, own, _)| own)
    }

    /// The postmaster, the backends it reaped, and those alive.
    pub fn postgres() -> f64 {
        let Some(postmaster) = std::env::var("PG_POSTMASTER_PID").ok().and_then(|p| p.parse::<u32>().ok()) else {
            return f64::NAN;
        };
        let Some((_, own, reaped)) = of(&postmaster.to_string()) else { return f64::NAN };
        let children: f64 = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|pid| of(&pid))
            .filter(|(parent, ..)| *parent == postmaster)
            .map(|(_, own, _)| own)
            .sum();
        own + reaped + children
    }
}

/// Insert `jobs` waiting no-op jobs across `owners`, then time 24 worker tasks emptying them.
async fn drain_owners(pool: &PgPool, jobs: usize, owners: usize) -> Drained {
    sqlx::query(
        "INSERT INTO jobs (owner_id, payload) SELECT g % $2, jsonb_build_object('n', g) FROM generate_series(1, $1) g",
    )
    .bind(jobs as i32)
    .bind(owners as i32)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE jobs").execute(pool).await.unwrap();
    let started = Instant::now();
    let (own, postgres) = (cpu::own(), cpu::postgres());
    let workers = WorkerPool::start(pool.clone(), config(), Arc::new(noop), Arc::new(NoHooks));
    // Asked of the partial indexes of waiting and running jobs, so polling does not steal the
    // machine's two cores: one condition over all three states read the whole table, 2.4 ms a
    // poll (132 ms of Postgres in a drain of 20,000 jobs, where graphile-worker's poll cost it
    // next to nothing). Scalar subqueries in the indexes' order, because the planner drops an
    // EXISTS's order and then, its statistics taken before the drain, reads the table.
    loop {
        let busy: bool = sqlx::query_scalar(
            "SELECT (SELECT 1 FROM jobs WHERE state IN ('queued', 'retrying') ORDER BY fair_tag, run_at, id LIMIT 1)
                        IS NOT NULL
                 OR (SELECT 1 FROM jobs WHERE state = 'running' ORDER BY lease_expires_at LIMIT 1) IS NOT NULL",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if !busy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let (own, postgres) = (cpu::own() - own, cpu::postgres() - postgres);
    workers.shutdown().await;
    Drained { rate: jobs as f64 / elapsed.as_secs_f64(), own_cpu_secs: own, postgres_cpu_secs: postgres }
}

/// Claims at scale: the drain with 100, 1,000 and 10,000 owners waiting, above 1,000,000
/// finished jobs of history (the cost should stay flat as owners and history grow).
async fn scale(pool: &PgPool, jobs: usize) {
    reset(pool).await;
    sqlx::query(
        "INSERT INTO jobs (owner_id, payload, state, attempts, accepted_at, run_at, started_at, finished_at)
         SELECT g % 10000, '{}', 'done', 1, now() - interval '1 day', now() - interval '1 day',
                now() - interval '1 day', now() - interval '1 day'
         FROM generate_series(1, 1000000) g",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE jobs").execute(pool).await.unwrap();
    for owners in [100, 1_000, 10_000] {
        let rate = drain_owners(pool, jobs, owners).await.rate;
        println!("claims at scale: {jobs} jobs across {owners} owners above 1,000,000 done jobs: {rate:.0} jobs/s");
        sqlx::query("DELETE FROM jobs WHERE payload ? 'n'").execute(pool).await.unwrap();
        sqlx::query("VACUUM ANALYZE jobs").execute(pool).await.unwrap();
    }
}

/// Pickup latency from the enqueue call (insert and commit included) to the processor's start;
/// also returns the median from the commit's return alone.
/// Enqueue-to-start milliseconds: [p50, p95, p99, max], and the p50 counted from the commit.
async fn pickup_run(pool: &PgPool, samples: usize) -> ([f64; 4], f64) {
    reset(pool).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let processor = move |_job: ClaimedJob| {
        let _ = tx.send(Instant::now());
        async { Ok::<_, JobError>(JobOutput::default()) }
    };
    let workers = WorkerPool::start(pool.clone(), config(), Arc::new(processor), Arc::new(NoHooks));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut latencies = Vec::with_capacity(samples);
    let mut after_commit = Vec::with_capacity(samples);
    for _ in 0..samples {
        let enqueued = Instant::now();
        sqlx::query("INSERT INTO jobs (owner_id) VALUES (1)").execute(pool).await.unwrap();
        let committed = Instant::now();
        let started = rx.recv().await.unwrap();
        latencies.push((started - enqueued).as_secs_f64() * 1000.0);
        after_commit.push(started.saturating_duration_since(committed).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    workers.shutdown().await;
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    ([0.5, 0.95, 0.99, 1.0].map(|p| percentile(&latencies, p)), median(&mut after_commit))
}

/// Milliseconds per `waiting_line` call, p50 and p95 over `calls`: the intake bound's worth of
/// jobs waiting across 100 owners with 24 running, asked by a user with `mine` waiting jobs.
async fn place_in_line_run(pool: &PgPool, waiting: usize, mine: usize, calls: usize) -> (f64, f64) {
    reset(pool).await;
    sqlx::query(
        "INSERT INTO jobs (owner_id, payload, state, attempts, lease_token, lease_expires_at)
         SELECT g % 100, '{}', 'running', 1, gen_random_uuid(), now() + interval '1 hour' FROM generate_series(1, 24) g",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO jobs (owner_id, payload) SELECT g % 100, '{}' FROM generate_series(1, $1) g")
        .bind(waiting as i32)
        .execute(pool)
        .await
        .unwrap();
    let asking = 1_000_i64;
    let shown: Vec<uuid::Uuid> = sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, payload) SELECT $1, '{}' FROM generate_series(1, $2) RETURNING id",
    )
    .bind(asking)
    .bind(mine as i32)
    .fetch_all(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE jobs").execute(pool).await.unwrap();
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let line = engine::queue::waiting_line(pool, asking, &shown).await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(line.ahead.len(), shown.len());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (percentile(&times, 0.5), percentile(&times, 0.95))
}

/// The place in line as the web app answers it: every poll through one shared snapshot, read
/// at most once a second. 10,000 jobs wait across 100 owners; polls come for 3 seconds as fast
/// as one task can ask, each from an owner with 3 waiting jobs. Prints the snapshot's read time
/// and the time per poll, snapshot reads included.
async fn shared_line_run(pool: &PgPool) {
    place_in_line_run(pool, 10_000, 3, 1).await;
    let owners: Vec<(i64, Vec<uuid::Uuid>)> = {
        let rows: Vec<(i64, uuid::Uuid)> = sqlx::query_as(
            "SELECT owner_id, id FROM (SELECT owner_id, id, row_number() OVER (PARTITION BY owner_id ORDER BY run_at, id) AS n
                                       FROM waiting_jobs) w WHERE n <= 3 ORDER BY owner_id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let mut by_owner: std::collections::BTreeMap<i64, Vec<uuid::Uuid>> = Default::default();
        for (owner, id) in rows {
            by_owner.entry(owner).or_default().push(id);
        }
        by_owner.into_iter().collect()
    };
    let started = Instant::now();
    let snapshot = engine::queue::LineSnapshot::read(pool).await.unwrap().unwrap();
    let read_ms = started.elapsed().as_secs_f64() * 1000.0;
    drop(snapshot);
    let line = engine::queue::SharedLine::default();
    let started = Instant::now();
    let mut polls = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        let (owner, jobs) = &owners[polls as usize % owners.len()];
        let answer = line.waiting_line(pool, *owner, jobs).await.unwrap();
        assert_eq!(answer.ahead.len(), jobs.len());
        polls += 1;
    }
    let per_poll = started.elapsed().as_secs_f64() * 1000.0 / polls as f64;
    println!(
        "place in line through the shared snapshot (10,000 waiting, 100 owners): one read {read_ms:.1} ms a second; {polls} polls in 3 s, {per_poll:.4} ms a poll, reads included"
    );
}

#[tokio::main]
async fn main() {
    let runs = arg("--runs", 3);
    let jobs = arg("--jobs", 20_000);
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 40).await.unwrap();
    let parts = std::env::args().skip_while(|a| a != "--parts").nth(1).unwrap_or_else(|| "queue,line".into());
    if parts.split(',').any(|p| p == "queue") {
        queue(&pool, runs, jobs).await;
    }
    if parts.split(',').any(|p| p == "line") {
        line(&pool).await;
    }
    if parts.split(',').any(|p| p == "scale") {
        scale(&pool, jobs).await;
    }
}

/// Make the claim commit without waiting for the WAL flush, as it did before issue 58 (or
/// durable again): the claim function's text with the line the issue took out put back.
async fn claims_asynchronous(pool: &PgPool, asynchronous: bool) {
    const DURABLE: &str = "RETURN QUERY\n    -- The due jobs with the lowest tags";
    const ASYNC: &str = "PERFORM set_config('synchronous_commit', 'off', true);\n    RETURN QUERY\n    -- The due jobs with the lowest tags";
    let (from, to) = if asynchronous { (DURABLE, ASYNC) } else { (ASYNC, DURABLE) };
    sqlx::query(
        "DO $do$ DECLARE d text; BEGIN
             SELECT pg_get_functiondef('sluice_claim_with_places(bigint, text, float8, bigint, bigint)'::regprocedure) INTO d;
             EXECUTE replace(d, current_setting('bench.from'), current_setting('bench.to'));
         END $do$",
    )
    .execute(&mut *{
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("SELECT set_config('bench.from', $1, false), set_config('bench.to', $2, false)")
            .bind(from)
            .bind(to)
            .execute(&mut *conn)
            .await
            .unwrap();
        conn
    })
    .await
    .unwrap();
}

async fn queue(pool: &PgPool, runs: usize, jobs: usize) {
    let (mut rates, mut pickups, mut worker_cpu, mut pg_cpu) = (vec![], vec![[0.0; 4]; 0], vec![], vec![]);
    let mut durable_over_async = Vec::new();
    for run in 1..=runs {
        // The claim's durability, priced in the same run: a drain with it taken back out.
        claims_asynchronous(pool, true).await;
        let (async_rate, ..) = drain_run(pool, jobs).await;
        claims_asynchronous(pool, false).await;
        let (rate, worker_us, pg_us) = drain_run(pool, jobs).await;
        // On stderr: `cargo xtask bench` reads this program's stdout for its RESULT line.
        eprintln!(
            "run {run}: drain with claims committed asynchronously (before issue 58) {async_rate:.0} jobs/s, durable {rate:.0} (ratio {:.2})",
            rate / async_rate
        );
        durable_over_async.push(rate / async_rate);
        worker_cpu.push(worker_us);
        pg_cpu.push(pg_us);
        let (pickup, from_commit) = pickup_run(pool, 200).await;
        let [p50, p95, p99, max] = pickup;
        println!(
            "run {run}: drain {rate:>8.0} jobs/s (CPU a job: this process {worker_us:.1} µs, Postgres {pg_us:.1} µs)   pickup p50 {p50:>6.2} ms  p95 {p95:>6.2} ms  p99 {p99:>6.2} ms  max {max:>6.2} ms  (p50 after the commit returned: {from_commit:.2} ms)"
        );
        rates.push(rate);
        pickups.push(pickup);
    }
    let rate = median(&mut rates);
    let [p50, p95, p99, max] = [0, 1, 2, 3].map(|i| median(&mut pickups.iter().map(|p| p[i]).collect::<Vec<_>>()));
    println!(
        "median of {runs}: drain {rate:.0} jobs/s ({jobs} no-op jobs, 24 worker tasks); pickup p50 {p50:.2} ms, p95 {p95:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
    );
    let (worker_us, pg_us) = (median(&mut worker_cpu), median(&mut pg_cpu));
    eprintln!(
        "drain with durable claims over the same with asynchronous ones (before issue 58): median {:.2} (runs {:?})",
        median(&mut durable_over_async.clone()),
        durable_over_async.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>()
    );
    println!(
        "RESULT drain={rate:.1} pickup_p50={p50:.3} pickup_p95={p95:.3} pickup_p99={p99:.3} pickup_max={max:.3} \
         worker_cpu_us={worker_us:.2} pg_cpu_us={pg_us:.2}"
    );
}

async fn line(pool: &PgPool) {
    shared_line_run(pool).await;
    for mine in [3, 200] {
        let (p50, p95) = place_in_line_run(pool, 10_000, mine, 100).await;
        println!(
            "place in line for a user with {mine} waiting (10,000 more across 100 owners, 24 running): p50 {p50:.2} ms, p95 {p95:.2} ms"
        );
    }
}
