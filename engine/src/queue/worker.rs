//! The worker runtime: one dispatcher per process claims jobs in batches, keeps those it
//! cannot start yet in memory (a local queue a few milliseconds deep, for short jobs only),
//! and starts them as its slots free; a heartbeat keeps their leases, and shutdown hands back
//! whatever did not finish in time.
//!
//! The process counts the attempts it runs against the allowance its last claim handed it
//! (the gate less every other process's running rows): a slot is free the moment a processor
//! returns. No database transaction is open while a processor runs: a claim commits before
//! the task starts, and the outcome is written afterwards. Successful results go to the
//! completer, which writes whatever has accumulated in one transaction, with a few such
//! batches in flight at once; failures are rarer and written one by one, holding their slot.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::hooks::TerminalHooks;
use super::policy::retry::{ErrorClass, RetryPolicy};
use super::{ClaimedJob, JobError, JobOutput, Recorded, JOBS_CHANNEL, PAUSE_NOTICE};
use crate::queue;

/// Does the work of one job. The engine retries; a processor never should.
pub trait Processor: Send + Sync + 'static {
    fn process(&self, job: ClaimedJob) -> BoxFuture<'static, Result<JobOutput, JobError>>;
}

impl<F, Fut> Processor for F
where
    F: Fn(ClaimedJob) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<JobOutput, JobError>> + Send + 'static,
{
    fn process(&self, job: ClaimedJob) -> BoxFuture<'static, Result<JobOutput, JobError>> {
        Box::pin(self(job))
    }
}

/// How one process's worker pool runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Names this process in leases and attempt rows.
    pub name: String,
    /// What else the process does, for the console: `all` (it serves the web too) or `worker`.
    pub role: &'static str,
    /// Worker slots: the most jobs this process runs at once. The global gate decides how many
    /// run across all processes; these only bound this process's share (the default, 70, is
    /// the gate's maximum, so one process follows any gate).
    pub concurrency: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    /// The backstop poll when no notification arrives.
    pub poll_interval: Duration,
    /// How long shutdown waits for running jobs before handing them back.
    pub shutdown_timeout: Duration,
    /// A job fetched ahead (short jobs only) that has not started within this goes back to its
    /// place in line, where another process may have a free slot.
    pub fetched_ahead_wait: Duration,
    /// The longest one attempt may run (plus `deadline_per_100k_tokens` for every 100K input
    /// tokens its claim reserved); past it the attempt is abandoned as a transient timeout and
    /// its slot freed, so nothing can hold a gate slot for ever.
    pub attempt_deadline: Duration,
    pub deadline_per_100k_tokens: Duration,
    pub policy: RetryPolicy,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            name: unique_name("worker"),
            role: "worker",
            concurrency: 70,
            lease: Duration::from_secs(60),
            heartbeat: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(30),
            fetched_ahead_wait: FETCHED_AHEAD_WAIT,
            attempt_deadline: Duration::from_secs(600),
            deadline_per_100k_tokens: Duration::ZERO,
            policy: RetryPolicy::default(),
        }
    }
}

/// `prefix`, this process's id and a random suffix: the claim tells processes apart by this name
/// (each counts its own attempts), and a pid alone repeats across containers (often 1).
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// What a finished attempt did, for tests and logs.
#[derive(Clone, Debug)]
pub struct AttemptReport {
    pub job_id: Uuid,
    pub attempt: i32,
    pub recorded: Recorded,
}

/// The local queue holds at most this much work (by the attempts' average time), and never more
/// than [`LOCAL_QUEUE_MAX`] jobs: long jobs (documents) are never fetched ahead, so none waits in
/// one process's memory while another has a free slot.
const LOCAL_QUEUE_WORK: Duration = Duration::from_millis(10);
const LOCAL_QUEUE_MAX: usize = 500;
/// Result batches written at once: a slot is free before its result is written, so results
/// may arrive faster than one transaction at a time could write them.
const COMPLETION_WRITERS: usize = 2;
/// How long the completer gathers results while attempts still run, before it writes (see
/// [`gather`]).
const COMPLETION_GATHER: Duration = Duration::from_millis(1);
/// The default of [`WorkerConfig::fetched_ahead_wait`].
pub const FETCHED_AHEAD_WAIT: Duration = Duration::from_millis(100);
/// Results waiting to be written, past which no attempt starts: the completer is behind, and
/// running ahead of it would only grow the rows every claim and write reads. Room for two
/// local queues' worth, so the jobs of one claim start while the last claim's are written.
const COMPLETING_MAX: usize = 1024;
/// The average attempt assumed before any has finished: long, so nothing is fetched ahead.
const FIRST_ATTEMPT_GUESS_SECS: f64 = 1.0;

struct Shared {
    pool: PgPool,
    config: WorkerConfig,
    processor: Arc<dyn Processor>,
    hooks: Arc<dyn TerminalHooks>,
    /// Lease tokens of the jobs this process holds: fetched and waiting, running, or with a
    /// result being written (the heartbeat keeps them, shutdown hands back what is left).
    running: Mutex<HashSet<Uuid>>,
    /// Lease tokens of the attempts whose processor runs: the heartbeat records them started.
    started: Mutex<HashSet<Uuid>>,
    wake: Notify,
    /// Attempts whose processor runs (or whose failure is being recorded): the slots in use.
    in_flight: AtomicUsize,
    /// Jobs fetched and waiting in memory (the completer gathers results while any wait).
    queued_locally: AtomicUsize,
    /// Results on their way to the database.
    completing: AtomicUsize,
    /// Processing was paused: what waits in memory goes back.
    paused: AtomicBool,
    /// The attempts' moving average, in seconds (how deep the local queue may be).
    attempt_secs: Mutex<f64>,
}

impl Shared {
    fn new(pool: PgPool, config: WorkerConfig, processor: Arc<dyn Processor>, hooks: Arc<dyn TerminalHooks>) -> Self {
        Shared {
            pool,
            config,
            processor,
            hooks,
            running: Mutex::new(HashSet::new()),
            started: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            in_flight: AtomicUsize::new(0),
            queued_locally: AtomicUsize::new(0),
            completing: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            attempt_secs: Mutex::new(FIRST_ATTEMPT_GUESS_SECS),
        }
    }

    fn attempt_took(&self, took: Duration) {
        let mut average = self.attempt_secs.lock().unwrap();
        *average = 0.8 * *average + 0.2 * took.as_secs_f64();
    }

    /// How many jobs beyond its free slots the process fetches ahead.
    fn prefetch(&self, slots: usize) -> usize {
        let average = *self.attempt_secs.lock().unwrap();
        local_queue_depth(average, slots)
    }
}

/// Pure: how many jobs hold [`LOCAL_QUEUE_WORK`] of work for `slots` running attempts that
/// take `attempt_secs` on average, at most [`LOCAL_QUEUE_MAX`].
fn local_queue_depth(attempt_secs: f64, slots: usize) -> usize {
    // No time measured (zero, or not a number): as short as can be.
    if attempt_secs.is_nan() || attempt_secs <= 0.0 {
        return LOCAL_QUEUE_MAX;
    }
    let jobs = LOCAL_QUEUE_WORK.as_secs_f64() / attempt_secs * slots as f64;
    if jobs >= LOCAL_QUEUE_MAX as f64 {
        LOCAL_QUEUE_MAX
    } else {
        jobs as usize
    }
}

/// A running worker pool. Dropping it aborts everything without handing jobs back, like a
/// crash would; call [`WorkerPool::shutdown`] to stop gracefully.
pub struct WorkerPool {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    dispatcher: Option<tokio::task::JoinHandle<JoinSet<()>>>,
    completer: Option<tokio::task::JoinHandle<()>>,
    background: JoinSet<()>,
}

/// What a graceful shutdown did with the jobs it was running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    pub finished: usize,
    pub handed_back: u64,
}

impl WorkerPool {
    /// Start claiming and running jobs: the dispatcher, the completer, the listener and the
    /// heartbeat, each a task on the current runtime.
    pub fn start(
        pool: PgPool,
        config: WorkerConfig,
        processor: Arc<dyn Processor>,
        hooks: Arc<dyn TerminalHooks>,
    ) -> WorkerPool {
        let shared = Arc::new(Shared::new(pool, config, processor, hooks));
        let (stop, stop_rx) = watch::channel(false);
        let mut background = JoinSet::new();
        background.spawn(listen(shared.clone()));
        background.spawn(heartbeat(shared.clone()));
        let (completions, completions_rx) = mpsc::unbounded_channel();
        let completer = Some(tokio::spawn(complete_batches(shared.clone(), completions_rx)));
        let dispatcher = Some(tokio::spawn(dispatch(shared.clone(), stop_rx, completions)));
        WorkerPool { shared, stop, dispatcher, completer, background }
    }

    /// How many jobs this pool holds now: running, fetched and waiting, or being written.
    pub fn running(&self) -> usize {
        self.shared.running.lock().unwrap().len()
    }

    /// Jobs fetched ahead and waiting in this process's memory.
    pub fn queued_locally(&self) -> usize {
        self.shared.queued_locally.load(Ordering::SeqCst)
    }

    /// Results handed to the completer and not yet written.
    pub fn completing(&self) -> usize {
        self.shared.completing.load(Ordering::SeqCst)
    }

    /// Stop claiming, let running jobs finish up to the shutdown timeout, then hand the rest
    /// back to `queued` without using their attempt.
    pub async fn shutdown(mut self) -> ShutdownReport {
        let _ = self.stop.send(true);
        let mut tasks = match self.dispatcher.take() {
            Some(handle) => handle.await.unwrap_or_default(),
            None => JoinSet::new(),
        };
        let mut finished = 0;
        let deadline = tokio::time::sleep(self.shared.config.shutdown_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tasks.join_next() => match next {
                    Some(_) => finished += 1,
                    None => break,
                },
                _ = &mut deadline => break,
            }
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        // Every sender is gone now: the completer writes what it holds and ends.
        if let Some(completer) = self.completer.take() {
            let _ = completer.await;
        }
        if let Err(e) = queue::processes::retire(&self.shared.pool, &self.shared.config.name).await {
            tracing::warn!(error = %e, "could not retire this worker process");
        }
        let leftover: Vec<Uuid> = self.shared.running.lock().unwrap().drain().collect();
        let handed_back = match queue::hand_back(&self.shared.pool, &leftover).await {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "could not hand jobs back; their leases will expire");
                0
            }
        };
        self.background.abort_all();
        ShutdownReport { finished, handed_back }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        if let Some(handle) = self.dispatcher.take() {
            handle.abort();
        }
        if let Some(handle) = self.completer.take() {
            handle.abort();
        }
        self.background.abort_all();
    }
}

/// A successful attempt on its way to the completer (its slot is free already).
struct Completion {
    job: ClaimedJob,
    output: JobOutput,
}

/// The claim loop. Returns the set of still-running job tasks when told to stop, having handed
/// back what waited in memory.
async fn dispatch(
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    completions: mpsc::UnboundedSender<Completion>,
) -> JoinSet<()> {
    let concurrency = shared.config.concurrency;
    let mut tasks: JoinSet<()> = JoinSet::new();
    // Jobs fetched ahead, with when they came.
    let mut local: VecDeque<(Instant, ClaimedJob)> = VecDeque::new();
    // How many attempts this process may run at once: set by every claim.
    let mut allowance = 0;
    let mut failures = 0u32;
    loop {
        if *stop.borrow() {
            hand_back_local(&shared, &mut local, |_| true).await;
            return tasks;
        }
        while tasks.try_join_next().is_some() {}
        if shared.paused.swap(false, Ordering::SeqCst) && !local.is_empty() && !processing_enabled(&shared.pool).await {
            hand_back_local(&shared, &mut local, |_| true).await;
        }
        // Fetched ahead and still waiting after a while (the jobs turned out long, or the gate
        // was cut): back to the line, where another process may have a free slot.
        let (now, most) = (Instant::now(), shared.config.fetched_ahead_wait);
        if local.front().is_some_and(|(came, _)| now.duration_since(*came) > most) {
            hand_back_local(&shared, &mut local, |came| now.duration_since(came) > most).await;
        }
        let limit = allowance.min(concurrency);
        let behind = shared.completing.load(Ordering::SeqCst) >= COMPLETING_MAX;
        while !behind && shared.in_flight.load(Ordering::SeqCst) < limit {
            let Some((_, job)) = local.pop_front() else { break };
            let slot = Slot::take(&shared);
            tasks.spawn(run_attempt(shared.clone(), job, slot, completions.clone()));
        }
        shared.queued_locally.store(local.len(), Ordering::SeqCst);
        let busy = shared.in_flight.load(Ordering::SeqCst) + local.len();
        let prefetch = shared.prefetch(if allowance > 0 { limit } else { concurrency });
        let mut wait = match local.front() {
            Some((came, _)) => (*came + most).saturating_duration_since(now).max(Duration::from_millis(1)),
            None => shared.config.poll_interval,
        };
        // Claim when a slot could take a job now, or the jobs fetched ahead are running low.
        if !behind && busy < concurrency && local.len() <= prefetch / 2 {
            let room = concurrency + prefetch - busy;
            let claimed =
                queue::claim_batch(&shared.pool, &shared.config.name, room, shared.config.lease, busy, prefetch);
            match claimed.await {
                Ok(batch) => {
                    failures = 0;
                    let got = batch.jobs.len();
                    allowance = batch.allowance;
                    shared.running.lock().unwrap().extend(batch.jobs.iter().map(|j| j.lease_token));
                    let came = Instant::now();
                    local.extend(batch.jobs.into_iter().map(|job| (came, job)));
                    if got == room || (got > 0 && shared.in_flight.load(Ordering::SeqCst) < allowance.min(concurrency))
                    {
                        continue;
                    }
                    // Sleep no longer than until the next retry falls due. When jobs are due and
                    // none could be claimed, the gate or the provider budget is full: look again
                    // in a moment (a slot or tokens come back), not in a spin on the settings row.
                    if let Ok(Some(due)) = queue::next_due(&shared.pool).await {
                        let until = (due - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
                        let floor = Duration::from_millis(if got == 0 { 25 } else { 5 });
                        wait = wait.min(until.max(floor));
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "claim failed; backing off");
                    wait = wait.min(Duration::from_millis(100 * 2u64.pow(failures.min(5))));
                }
            }
        }
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}

/// An attempt's gate slot in this process, freed when dropped (also when its task panics or is
/// aborted: the job's lease stays held, for shutdown to hand back or the rescue to settle).
struct Slot(Arc<Shared>);

impl Slot {
    fn take(shared: &Arc<Shared>) -> Slot {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        Slot(shared.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

/// One attempt: run the processor, free the slot the moment it returns, and hand a result to
/// the completer; a failure is recorded here, holding the slot until it is.
async fn run_attempt(shared: Arc<Shared>, job: ClaimedJob, slot: Slot, completions: mpsc::UnboundedSender<Completion>) {
    let started = Instant::now();
    shared.started.lock().unwrap().insert(job.lease_token);
    let outcome = run_processor(&shared, &job).await;
    shared.started.lock().unwrap().remove(&job.lease_token);
    match outcome {
        Ok(output) => {
            // Only successes set the local queue's depth: a burst of instant failures says
            // nothing about how long the next jobs take.
            shared.attempt_took(started.elapsed());
            shared.completing.fetch_add(1, Ordering::SeqCst);
            drop(slot);
            if completions.send(Completion { job, output }).is_err() {
                // The completer is gone (an abort): the lease expires and the rescue settles it.
                shared.completing.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Err(error) => {
            // Even a panic while recording must free the slot; the lease then expires and the
            // rescue settles the job.
            let recording = AssertUnwindSafe(record_failure(&shared, &job, &error));
            if recording.catch_unwind().await.is_err() {
                tracing::error!(job = %job.id, "recording a failure panicked");
            }
            if matches!(error.class, ErrorClass::RateLimited | ErrorClass::Overloaded | ErrorClass::QuotaExhausted) {
                // The provider says "fewer at once": the adaptive gate. A spent quota too:
                // when its hold ends, a few calls try again, not the whole gate.
                let cut = queue::capacity::provider_refused(&shared.pool, error.provider_status);
                if let Err(e) = cut.await {
                    tracing::warn!(error = %e, "could not cut the gate");
                }
            }
            // Recorded (or its lease left to expire): this process holds the job no more.
            shared.running.lock().unwrap().remove(&job.lease_token);
            drop(slot);
        }
    }
}

/// Whether processing is on (when in doubt, on: the claims check it anyway).
async fn processing_enabled(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT processing_enabled FROM queue_settings WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap_or(true)
}

/// Jobs fetched ahead that have not started go back to their place in line, as if never
/// claimed: all of them on a pause or a stop, or those `whose` wait is over.
async fn hand_back_local(
    shared: &Shared,
    local: &mut VecDeque<(Instant, ClaimedJob)>,
    whose: impl Fn(Instant) -> bool,
) {
    let tokens: Vec<Uuid> = local.iter().filter(|(came, _)| whose(*came)).map(|(_, j)| j.lease_token).collect();
    if tokens.is_empty() {
        return;
    }
    match with_db_retries("jobs fetched ahead", || queue::unclaim(&shared.pool, &tokens)).await {
        Some(_) => {
            let mut running = shared.running.lock().unwrap();
            for token in &tokens {
                running.remove(token);
            }
            drop(running);
            local.retain(|(came, _)| !whose(*came));
            shared.queued_locally.store(local.len(), Ordering::SeqCst);
        }
        // Kept: they run when processing resumes, or their leases expire.
        None => tracing::error!("could not hand back the jobs fetched ahead"),
    }
}

/// Write successful results in batches: whatever arrived while the writers were busy goes in
/// the next transaction, with up to [`COMPLETION_WRITERS`] transactions at once.
async fn complete_batches(shared: Arc<Shared>, mut completions: mpsc::UnboundedReceiver<Completion>) {
    const MAX_BATCH: usize = 256;
    let writers = Arc::new(Semaphore::new(COMPLETION_WRITERS));
    let mut writing = JoinSet::new();
    loop {
        let Ok(writer) = writers.clone().acquire_owned().await else { break };
        let mut batch: Vec<Completion> = Vec::with_capacity(MAX_BATCH);
        if completions.recv_many(&mut batch, MAX_BATCH).await == 0 {
            break;
        }
        let more_coming =
            || shared.in_flight.load(Ordering::SeqCst) > 0 || shared.queued_locally.load(Ordering::SeqCst) > 0;
        gather(&mut completions, &mut batch, MAX_BATCH, tokio::time::Instant::now() + COMPLETION_GATHER, more_coming)
            .await;
        writing.spawn(write_batch(shared.clone(), batch, writer));
        while writing.try_join_next().is_some() {}
    }
    while writing.join_next().await.is_some() {}
}

/// Add to `batch` the results that come before `until`, up to `max`, for as long as
/// `more_coming` says attempts still run: a burst is then written in a few large transactions
/// rather than its first results one commit each (which held both writers while the rest piled
/// up behind them). With nothing running, the batch is written at once.
async fn gather<T>(
    results: &mut mpsc::UnboundedReceiver<T>,
    batch: &mut Vec<T>,
    max: usize,
    until: tokio::time::Instant,
    more_coming: impl Fn() -> bool,
) {
    while batch.len() < max && more_coming() {
        let room = max - batch.len();
        match tokio::time::timeout_at(until, results.recv_many(batch, room)).await {
            Ok(got) if got > 0 => {}
            _ => return,
        }
    }
}

async fn write_batch(shared: Arc<Shared>, batch: Vec<Completion>, _writer: OwnedSemaphorePermit) {
    let items: Vec<(&ClaimedJob, &JobOutput)> = batch.iter().map(|c| (&c.job, &c.output)).collect();
    let written =
        with_db_retries("results", || queue::complete_many(&shared.pool, shared.hooks.as_ref(), &items)).await;
    if written.is_none() && items.len() > 1 {
        // One bad job (say, a hook that refuses it) must not hold back the others.
        for (job, output) in &items {
            with_db_retries("a result", || queue::complete(&shared.pool, shared.hooks.as_ref(), job, output)).await;
        }
    }
    let mut running = shared.running.lock().unwrap();
    for c in &batch {
        running.remove(&c.job.lease_token);
    }
    drop(running);
    shared.completing.fetch_sub(batch.len(), Ordering::SeqCst);
    shared.wake.notify_one();
}

/// Run the processor in a span naming the job, its attempt and its owner (so every line it
/// logs carries them), and count and time the attempt by outcome and provider status.
async fn run_processor(shared: &Shared, job: &ClaimedJob) -> Result<JobOutput, JobError> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "job",
        otel.name = "attempt",
        job_id = %job.id,
        attempt = job.attempt,
        user_id = job.owner_id,
        queue_wait_ms = tracing::field::Empty,
    );
    if crate::telemetry::exporting() {
        join_upload_trace(&shared.pool, job, &span).await;
    }
    let started = std::time::Instant::now();
    let result = run_within_deadline(shared, job).instrument(span.clone()).await;
    let (outcome, status) = match &result {
        Ok(output) => {
            metrics::counter!("sluice_provider_tokens_total", "direction" => "in")
                .increment(output.input_tokens.unwrap_or(0).max(0) as u64);
            metrics::counter!("sluice_provider_tokens_total", "direction" => "out")
                .increment(output.output_tokens.unwrap_or(0).max(0) as u64);
            ("succeeded", "200".to_string())
        }
        Err(e) => (e.class.as_str(), e.provider_status.map_or_else(|| "none".to_string(), |s| s.to_string())),
    };
    metrics::counter!("sluice_attempts_total", "outcome" => outcome, "provider_status" => status).increment(1);
    metrics::histogram!("sluice_attempt_duration_seconds", "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    span.in_scope(|| tracing::debug!(outcome, "attempt finished"));
    result
}

/// Traces only: make the attempt's span part of its upload's trace, and record how long the
/// job waited in line for this attempt (since it was accepted, or since its retry was due).
async fn join_upload_trace(pool: &PgPool, job: &ClaimedJob, span: &tracing::Span) {
    let found: Option<(Option<String>, f64)> = sqlx::query_as(
        "SELECT trace_parent,
                extract(epoch FROM now() - CASE WHEN attempts > 1 THEN run_at ELSE accepted_at END)::float8 * 1000
         FROM jobs WHERE id = $1",
    )
    .bind(job.id)
    .fetch_optional(pool)
    .await
    .unwrap_or(None);
    let Some((trace_parent, waited_ms)) = found else { return };
    span.record("queue_wait_ms", waited_ms.max(0.0) as i64);
    if let Some(trace_parent) = trace_parent {
        crate::telemetry::join_upload_trace(span, &trace_parent);
    }
}

/// Run the processor within the attempt deadline. A processor past the deadline is dropped
/// (a sandboxed child with it) and counts as a timeout; a panicking one as a server error.
async fn run_within_deadline(shared: &Shared, job: &ClaimedJob) -> Result<JobOutput, JobError> {
    let deadline = Duration::from_secs_f64(sluice_types::capacity::scaled_secs(
        shared.config.attempt_deadline.as_secs_f64(),
        shared.config.deadline_per_100k_tokens.as_secs_f64(),
        job.est_input_tokens as f64,
    ));
    let timed = ClaimedJob { deadline: Some(std::time::Instant::now() + deadline), ..job.clone() };
    let attempt = AssertUnwindSafe(shared.processor.process(timed)).catch_unwind();
    let Ok(outcome) = tokio::time::timeout(deadline, attempt).await else {
        tracing::warn!(job = %job.id, ?deadline, "attempt abandoned at its deadline");
        let limit = match deadline.as_secs() {
            s if s < 120 => format!("{:.1} s", deadline.as_secs_f64()),
            s => format!("{} min", s / 60),
        };
        return Err(JobError::new(
            ErrorClass::Timeout,
            format!("the attempt took longer than {limit} and was stopped"),
        ));
    };
    outcome.unwrap_or_else(|_| Err(JobError::new(ErrorClass::ServerError, "the processor panicked")))
}

async fn record_failure(shared: &Shared, job: &ClaimedJob, error: &JobError) -> Option<Recorded> {
    let recorded = with_db_retries("a failure", || {
        queue::fail(&shared.pool, shared.hooks.as_ref(), &shared.config.policy, job, error)
    })
    .await;
    if recorded == Some(Recorded::Stale) {
        tracing::warn!(job = %job.id, "stale attempt: the lease moved on, outcome discarded");
    }
    recorded
}

/// Retry a write briefly while the database is unreachable (e.g. restarting). If it never
/// gets through, the lease expires and the rescue task takes the job.
pub(crate) async fn with_db_retries<T, F, Fut>(what: &str, mut write: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::error::Result<T>>,
{
    let mut delay = Duration::from_millis(50);
    for _ in 0..12 {
        match write().await {
            Ok(value) => return Some(value),
            Err(e) => {
                tracing::warn!(error = %e, "could not record {what}; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    None
}

/// Wake the dispatcher on NOTIFY. On reconnect, wake it too: notifications may have been lost.
async fn listen(shared: Arc<Shared>) {
    loop {
        match PgListener::connect_with(&shared.pool).await {
            Ok(mut listener) => {
                if let Err(e) = listener.listen(JOBS_CHANNEL).await {
                    tracing::warn!(error = %e, "LISTEN failed");
                } else {
                    // A pause may have come while the listener was away.
                    shared.paused.store(true, Ordering::SeqCst);
                    shared.wake.notify_one();
                    loop {
                        match listener.try_recv().await {
                            Ok(Some(notice)) => {
                                if notice.payload() == PAUSE_NOTICE {
                                    shared.paused.store(true, Ordering::SeqCst);
                                }
                                shared.wake.notify_one()
                            }
                            // Connection lost: sqlx reconnects on the next call; we may have missed
                            // notifications, so wake the dispatcher.
                            Ok(None) => {
                                shared.paused.store(true, Ordering::SeqCst);
                                shared.wake.notify_one()
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "notification listener failed");
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot connect the notification listener"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Extend the leases of every job this process runs, in one statement per beat.
async fn heartbeat(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.config.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let tokens: Vec<Uuid> = shared.running.lock().unwrap().iter().copied().collect();
        let started: Vec<Uuid> = shared.started.lock().unwrap().iter().copied().collect();
        let me = queue::processes::Announcement {
            name: &shared.config.name,
            role: shared.config.role,
            slots: shared.config.concurrency,
            running: tokens.len(),
            heartbeat: shared.config.heartbeat,
        };
        // Alive first, then the leases: a process whose beat is not seen is taken for dead
        // (its work is rescued), so its leases must not be kept alive without it.
        if let Err(e) = queue::processes::announce(&shared.pool, &me).await {
            tracing::warn!(error = %e, "could not announce this worker process; its leases are not renewed");
            continue;
        }
        if let Err(e) = queue::heartbeat(&shared.pool, &tokens, &started, shared.config.lease).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }
}

/// Claim up to `max` jobs and run them to completion, one step, in the caller's task.
/// For tests and tools that want to drive the queue deterministically.
pub async fn work_once(
    pool: &PgPool,
    config: &WorkerConfig,
    processor: Arc<dyn Processor>,
    hooks: Arc<dyn TerminalHooks>,
    max: i64,
) -> crate::error::Result<Vec<AttemptReport>> {
    let jobs = queue::claim(pool, &config.name, max, config.lease).await?;
    let shared = Shared::new(pool.clone(), config.clone(), processor, hooks);
    let outcomes = futures::future::join_all(jobs.iter().map(|job| run_processor(&shared, job))).await;
    let mut reports = Vec::with_capacity(jobs.len());
    for (job, outcome) in jobs.iter().zip(outcomes) {
        let recorded = match outcome {
            Ok(output) => queue::complete(pool, shared.hooks.as_ref(), job, &output).await?,
            Err(error) => queue::fail(pool, shared.hooks.as_ref(), &config.policy, job, &error).await?,
        };
        reports.push(AttemptReport { job_id: job.id, attempt: job.attempt, recorded });
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::{gather, local_queue_depth, LOCAL_QUEUE_MAX};
    use proptest::prelude::*;
    use std::time::Duration;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    /// A burst: the first result now, the other 99 `later`.
    fn burst(later: Duration) -> mpsc::UnboundedReceiver<u32> {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(0).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(later).await;
            for n in 1..100 {
                tx.send(n).unwrap();
            }
        });
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn results_that_come_while_attempts_run_are_written_together() {
        let mut results = burst(Duration::from_millis(1));
        let mut batch = Vec::new();
        results.recv_many(&mut batch, 256).await;
        gather(&mut results, &mut batch, 256, Instant::now() + Duration::from_millis(5), || true).await;
        assert_eq!(batch, (0..100).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn gathering_stops_at_the_batch_size_at_the_deadline_and_when_nothing_runs() {
        let mut batch = Vec::new();
        let mut results = burst(Duration::from_millis(1));
        results.recv_many(&mut batch, 256).await;
        gather(&mut results, &mut batch, 40, Instant::now() + Duration::from_millis(5), || true).await;
        assert_eq!(batch.len(), 40, "no more than a batch");

        let (mut batch, mut results) = (Vec::new(), burst(Duration::from_millis(5)));
        results.recv_many(&mut batch, 256).await;
        gather(&mut results, &mut batch, 256, Instant::now() + Duration::from_millis(1), || true).await;
        assert_eq!(batch, [0], "the rest came after the deadline");

        let (mut batch, mut results) = (Vec::new(), burst(Duration::from_millis(1)));
        results.recv_many(&mut batch, 256).await;
        let started = Instant::now();
        gather(&mut results, &mut batch, 256, started + Duration::from_millis(1), || false).await;
        assert_eq!((batch.len(), started.elapsed()), (1, Duration::ZERO), "nothing running: written at once");
    }

    #[test]
    fn long_attempts_are_never_fetched_ahead_and_short_ones_up_to_the_cap() {
        // A document takes seconds: nothing waits in one process's memory.
        assert_eq!(local_queue_depth(1.0, 70), 0);
        assert_eq!(local_queue_depth(0.015, 5), 3);
        assert_eq!(local_queue_depth(0.000_001, 24), LOCAL_QUEUE_MAX);
        assert_eq!(local_queue_depth(0.0, 24), LOCAL_QUEUE_MAX);
        assert_eq!(local_queue_depth(f64::NAN, 24), LOCAL_QUEUE_MAX);
    }

    proptest! {
        #[test]
        fn the_local_queue_holds_at_most_its_work_and_shrinks_as_attempts_grow(
            secs in 0.000_001f64..100.0, longer in 1.0f64..10.0, slots in 1usize..=70,
        ) {
            let depth = local_queue_depth(secs, slots);
            prop_assert!(depth <= LOCAL_QUEUE_MAX);
            // Its jobs take no more than 10 ms across the slots.
            prop_assert!(depth as f64 * secs / slots as f64 <= 0.010 + 1e-12);
            prop_assert!(local_queue_depth(secs * longer, slots) <= depth);
        }
    }
}
