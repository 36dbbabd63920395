//! Operator commands beside `serve`: accounts (create an admin, grant credits, list users),
//! the queue (pause, resume, gate, dead letters, one job), and migrations.
//! With the embedded default they use the running server's cluster, or start it briefly.

use anyhow::Context;
use engine::accounts::{users, Role};
use engine::hooks::SluiceHooks;
use engine::queue::{self, dlq, switches};
use engine::FailureKind;

use crate::cli::{Command, Config, DlqAction, JobsAction, RepairAction};
use crate::database::{Cluster, Database};

/// Run one operator command against the configured database (or the embedded cluster).
pub async fn run(config: Config, command: Command) -> anyhow::Result<()> {
    let database = Database::open(&config, Cluster::Borrow).await?;
    let result = match command {
        // Into an empty database: before anything connects (connecting migrates).
        Command::Restore { from } => restore(&database.url, &config, &from).await,
        command => run_with(&database.url, command, config.blobs().ok()).await,
    };
    database.close().await;
    result
}

/// `server restore --from DIR`, then the migrations (a backup of an older version catches up).
async fn restore(url: &str, config: &Config, from: &std::path::Path) -> anyhow::Result<()> {
    let blobs = config.blobs().context("the blob store")?;
    let bin = pgcluster::find_bin_dir().context("pg_restore (Postgres' binaries) not found")?;
    let m = engine::backup::restore(url, &blobs, &bin, from).await?;
    engine::db::connect(url, 1).await.context("migrating the restored database")?.close().await;
    println!(
        "restored the backup of {}: {} jobs, {} documents; start the server to go on where it stopped",
        m.taken_at.to_rfc3339(),
        m.jobs,
        m.documents
    );
    Ok(())
}

/// `server create-admin`: a new account, never an existing one unless the operator says so and
/// the account's holder proved the address (a stranger may have signed up with it first).
async fn create_admin(pool: &sqlx::PgPool, email: &str, promote_existing: bool) -> anyhow::Result<()> {
    let existing = match users::find_by_email(pool, email).await {
        Ok(user) => Some(user),
        Err(engine::EngineError::NotFound) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(user) = existing {
        let age = chrono::Utc::now() - user.created_at;
        let verified = match user.email_verified_at {
            Some(at) => format!("address verified {}", at.format("%Y-%m-%d %H:%M UTC")),
            None => "address NOT verified".to_string(),
        };
        println!(
            "{} already has an account: id {}, made {} ({} days ago), {verified}, role {}",
            user.email,
            user.id,
            user.created_at.format("%Y-%m-%d %H:%M UTC"),
            age.num_days(),
            user.role.as_str()
        );
        anyhow::ensure!(
            promote_existing,
            "create-admin never adopts an existing account (anyone may have signed up with this address). \
             If the address is yours: verify it (the link mailed at sign-up, or a password reset), then run \
             create-admin --email {} --promote-existing; the account's password becomes the one given then",
            user.email
        );
        let password = admin_password(&user.email)?;
        let user = engine::accounts::staff::adopt_as_admin(pool, user.id, &password, "cli").await?;
        println!("{} is an admin now, with the password given here; its sessions and tokens have ended", user.email);
        return Ok(());
    }
    let password = admin_password(email)?;
    let user = users::create_user(pool, email, &password, Role::Admin, 0).await?;
    println!("created admin {} (id {})", user.email, user.id);
    Ok(())
}

/// The admin's password: `SLUICE_ADMIN_PASSWORD`, else asked for.
fn admin_password(email: &str) -> anyhow::Result<String> {
    match std::env::var("SLUICE_ADMIN_PASSWORD") {
        Ok(p) => Ok(p),
        Err(_) => Ok(rpassword::prompt_password(format!("Password for {email}: "))?),
    }
}

async fn run_with(url: &str, command: Command, blobs: Option<engine::documents::Blobs>) -> anyhow::Result<()> {
    let pool = engine::db::connect(url, 2).await.context("connecting to Postgres")?;
    match command {
        Command::CreateAdmin { email, promote_existing } => create_admin(&pool, &email, promote_existing).await?,
        Command::GrantCredits { email, amount } => {
            let user = users::find_by_email(&pool, &email).await.with_context(|| format!("no user {email}"))?;
            let balance =
                engine::accounts::ledger::admin_adjust(&pool, user.id, amount, "cli", "granted from the command line")
                    .await?;
            println!("{}: balance {balance}", user.email);
        }
        Command::SetRole { email, role } => {
            let user = users::find_by_email(&pool, &email).await.with_context(|| format!("no user {email}"))?;
            let user = engine::accounts::staff::set_role(&pool, user.id, role, "cli").await?;
            println!("{} is now {}", user.email, user.role.as_str());
        }
        Command::SetLane { email, urgent } => {
            let user = users::find_by_email(&pool, &email).await.with_context(|| format!("no user {email}"))?;
            engine::queue::lanes::set_account_urgent(&pool, user.id, urgent).await?;
            let lane = if urgent { "the urgent lane" } else { "the lane their size gives" };
            println!("{}'s next documents go in {lane}", user.email);
        }
        Command::RunNext { job } => match engine::queue::run_next::run_next(&pool, job, "cli").await {
            Ok(engine::queue::run_next::RunNext::Next) => println!("job {job} is first in line"),
            Ok(engine::queue::run_next::RunNext::NotWaiting(state)) => {
                anyhow::bail!("job {job} is {}, not waiting: only a waiting job can be moved", state.as_str())
            }
            Err(engine::EngineError::NotFound) => anyhow::bail!("no job {job}"),
            Err(e) => return Err(e.into()),
        },
        Command::ListUsers => {
            println!("{:>6}  {:<40} {:<8} {:>8} {:>9}", "id", "email", "role", "balance", "in flight");
            for u in users::list(&pool).await? {
                println!(
                    "{:>6}  {:<40} {:<8} {:>8} {:>5} / {}",
                    u.id,
                    u.email,
                    u.role.as_str(),
                    u.balance,
                    u.in_flight,
                    u.max_in_flight
                );
            }
        }
        Command::Migrate => println!("migrations applied"), // connecting ran them
        Command::Backup { to } => {
            let blobs = blobs.context("the blob store")?;
            let bin = pgcluster::find_bin_dir().context("pg_dump (Postgres' binaries) not found")?;
            let m = engine::backup::backup(&pool, url, &blobs, &bin, &to).await?;
            println!(
                "backup in {}: {} jobs, {} documents ({} bytes), Postgres {}, {:.1} s",
                to.display(),
                m.jobs,
                m.documents,
                m.document_bytes,
                m.postgres,
                m.took_ms as f64 / 1000.0
            );
        }
        Command::Restore { .. } => unreachable!("restored before connecting"),
        Command::Pause { reason, for_minutes } => {
            let settings = match for_minutes {
                Some(minutes) => switches::pause_for(&pool, minutes, &cli_actor(&reason)).await?,
                None => switches::set_processing(&pool, false, &cli_actor(&reason)).await?,
            };
            match settings.resume_at {
                Some(at) => println!(
                    "processing paused until {} (gate {}); uploads are still accepted",
                    at.format("%Y-%m-%d %H:%M:%S UTC"),
                    settings.gate_size
                ),
                None => println!("processing paused (gate {}); uploads are still accepted", settings.gate_size),
            }
        }
        Command::Resume { reason } => {
            switches::set_processing(&pool, true, &cli_actor(&reason)).await?;
            println!("processing resumed");
        }
        Command::Gate { size } => {
            let settings = switches::set_gate_size(&pool, size, "cli").await?;
            println!("gate: {} jobs at once", settings.gate_size);
        }
        Command::Dlq { action: DlqAction::List } => {
            println!("{:>6}  {:<18} {:<25} reason", "jobs", "kind", "newest");
            for group in dlq::groups(&pool).await? {
                println!(
                    "{:>6}  {:<18} {:<25} {}",
                    group.jobs,
                    group.failure_kind.as_str(),
                    group.newest.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                    group.failure_reason
                );
            }
        }
        Command::Dlq { action: DlqAction::Replay { kind, reason } } => {
            let kind = FailureKind::parse(&kind).with_context(|| format!("no failure kind {kind:?}"))?;
            let selection = dlq::Selection::Group { kind, reason };
            let replayed = dlq::replay(&pool, &SluiceHooks, &selection, "cli").await?;
            println!(
                "replayed {} job(s); {} left failed because their owner uploaded the document again; {} because \
                 their document was released (its replay window ended: the owner has to upload it again)",
                replayed.ids.len(),
                replayed.already_reuploaded.len(),
                replayed.document_released.len()
            );
        }
        Command::Reconcile => {
            let report = engine::reconcile::run(&pool, blobs.as_ref(), "cli").await?;
            for check in &report.checks {
                println!("{:<30} examined {:>8}  found {}", check.check, check.examined, check.found);
            }
            for d in &report.discrepancies {
                println!("  {}: {}: {}", d.check, d.subject, d.detail);
            }
            println!("report {} stored", report.id);
            if !report.discrepancies.is_empty() {
                pool.close().await;
                anyhow::bail!(
                    "reconciliation found {} discrepancies",
                    report.checks.iter().map(|c| c.found).sum::<i64>()
                );
            }
        }
        Command::Repair { action: RepairAction::Counters } => {
            let repaired = engine::repair::repair_counters(&pool, "cli").await?;
            for r in &repaired {
                println!("user {}: {} {} -> {}", r.user_id, r.counter, r.was, r.now);
            }
            println!("{} counter(s) repaired", repaired.len());
        }
        Command::Repair { action: RepairAction::Orphans } => {
            let blobs = blobs.as_ref().context("no blob storage configured")?;
            let grace = std::time::Duration::from_secs(3600);
            let removed = engine::documents::sweep::remove_orphans(&pool, blobs, grace, "cli").await?;
            println!("{removed} document(s) no job points at deleted");
        }
        Command::Alerts => {
            let firing = engine::alerts::firing(&pool).await?;
            if firing.is_empty() {
                println!("nothing is firing");
            }
            for f in firing {
                println!(
                    "FIRING {} since {}: {} (value {}, threshold {})",
                    f.rule, f.fired_at, f.detail, f.value, f.threshold
                );
            }
            for f in engine::alerts::recent(&pool, 10).await?.into_iter().filter(|f| f.resolved_at.is_some()) {
                println!("resolved {} {} .. {}: {}", f.rule, f.fired_at, f.resolved_at.unwrap_or(f.fired_at), f.detail);
            }
        }
        Command::Capacity { days, requests_per_min, input_tokens_per_min, output_tokens_per_min } => {
            let status = queue::capacity::status(&pool).await?;
            let limits = engine::sizing::ProviderLimits {
                requests_per_min: requests_per_min.or(status.limits.requests_per_min),
                input_tokens_per_min: input_tokens_per_min.or(status.limits.input_tokens_per_min),
                output_tokens_per_min: output_tokens_per_min.or(status.limits.output_tokens_per_min),
            };
            print!("{}", capacity_report(&queue::capacity::attempt_stats(&pool, days).await?, &limits, &status, days));
        }
        Command::Cancel { id } => {
            let id: uuid::Uuid = id.parse().with_context(|| format!("{id:?} is not a job id"))?;
            match queue::cancel(&pool, &SluiceHooks, id, "cli", true).await? {
                queue::Canceled::Now => println!("job {id} canceled and refunded"),
                queue::Canceled::Requested => println!("job {id} is running: it stops at its next safe point"),
                queue::Canceled::AlreadyEnded(state) => println!("job {id} had already ended ({})", state.as_str()),
            }
        }
        Command::Jobs { action: JobsAction::Show { id } } => {
            let id: uuid::Uuid = id.parse().with_context(|| format!("{id:?} is not a job id"))?;
            let job = queue::get(&pool, id).await.with_context(|| format!("no job {id}"))?;
            let owner = match users::get(&pool, job.owner_id).await {
                Ok(owner) => owner.email,
                Err(engine::EngineError::NotFound) => engine::accounts::deletion::deleted_label(job.owner_id),
                Err(e) => return Err(e.into()),
            };
            println!("job {}  {}  owner {} (id {})", job.id, job.state.as_str(), owner, job.owner_id);
            println!(
                "accepted {}  attempts {} of {}  cost {}",
                job.accepted_at, job.attempts, job.max_attempts, job.cost
            );
            if let (Some(kind), Some(reason)) = (job.failure_kind, &job.failure_reason) {
                println!("failed: {} ({reason})", kind.as_str());
            }
            for a in queue::attempts(&pool, id).await? {
                println!(
                    "  attempt {} on {} at {}: {}{}{}",
                    a.attempt,
                    a.worker,
                    a.started_at,
                    a.outcome.map_or("running", |o| o.words()),
                    a.provider_status.map(|s| format!(" (HTTP {s})")).unwrap_or_default(),
                    a.error.map(|e| format!(": {e}")).unwrap_or_default()
                );
            }
        }
        Command::Serve | Command::Web | Command::Worker | Command::Extract { .. } => {
            unreachable!("not an operator command")
        }
    }
    pool.close().await;
    Ok(())
}

/// Who the audit log names for a command-line change, with the operator's reason.
fn cli_actor(reason: &str) -> String {
    format!("cli ({})", reason.trim())
}

/// Pure: the planner's answer as the `capacity` command prints it.
pub fn capacity_report(
    stats: &[engine::sizing::AttemptStats],
    limits: &engine::sizing::ProviderLimits,
    status: &queue::capacity::CapacityStatus,
    days: u32,
) -> String {
    use std::fmt::Write;
    let per_min = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| format!("{v}/min"));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "limits: requests {}, input tokens {}, output tokens {}",
        per_min(limits.requests_per_min),
        per_min(limits.input_tokens_per_min),
        per_min(limits.output_tokens_per_min)
    );
    let _ = writeln!(out, "gate: {} configured, {} in force now", status.configured_gate, status.effective_gate);
    if let Some((reason, since)) = &status.reduced {
        let _ = writeln!(out, "  lower since {since}: {reason}");
    }
    if stats.is_empty() {
        let _ = writeln!(out, "no successful attempts in the last {days} days: nothing to size from");
        return out;
    }
    for s in stats {
        let plan = engine::sizing::plan(s, limits);
        let _ = writeln!(
            out,
            "{}: {} attempts; duration p50/p90/p99 {:.1}/{:.1}/{:.1} s; input tokens {:.0}/{:.0}/{:.0}; output tokens {:.0}/{:.0}/{:.0}",
            s.preset, s.attempts, s.duration_secs.p50, s.duration_secs.p90, s.duration_secs.p99,
            s.input_tokens.p50, s.input_tokens.p90, s.input_tokens.p99,
            s.output_tokens.p50, s.output_tokens.p90, s.output_tokens.p99,
        );
        for (label, sizing) in [("p50", &plan.at_p50), ("p90", &plan.at_p90)] {
            let ceilings: Vec<String> =
                sizing.ceilings.iter().map(|(c, slots)| format!("{} {:.1}", c.words(), slots)).collect();
            let binding = sizing.binding.map_or("nothing binds (no limits)".to_string(), |(c, slots)| {
                format!("bound by {} at {:.1} slots", c.words(), slots)
            });
            let _ = writeln!(out, "  at {label} sizing: {binding}; {}", ceilings.join(", "));
        }
        if let Some(gate) = plan.recommended_gate {
            let _ = writeln!(
                out,
                "  recommended gate {gate} (a quarter of the p90 ceiling); now {}",
                status.configured_gate
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::sizing::{AttemptStats, Percentiles, ProviderLimits};

    #[test]
    fn the_capacity_report_names_the_binding_limit_and_the_recommended_gate() {
        let p = |p50, p90, p99| Percentiles { p50, p90, p99 };
        let (duration, input, output) = (p(316.0, 400.0, 500.0), p(4e4, 129e3, 492e3), p(4e3, 16e3, 32e3));
        let stats = vec![AttemptStats {
            preset: "all".into(),
            attempts: 12,
            duration_secs: duration,
            input_tokens: input,
            output_tokens: output,
        }];
        let limits = ProviderLimits {
            requests_per_min: Some(4_000),
            input_tokens_per_min: Some(2_000_000),
            ..Default::default()
        };
        let status = queue::capacity::CapacityStatus {
            configured_gate: 24,
            effective_gate: 12,
            reduced: Some(("the provider answered 429".into(), chrono::Utc::now())),
            limits,
            requests_left: None,
            input_tokens_left: None,
            output_tokens_left: None,
            burst_secs: 60.0,
            recover_secs: 10.0,
        };
        let report = capacity_report(&stats, &limits, &status, 7);
        assert!(report.contains("gate: 24 configured, 12 in force now"), "{report}");
        assert!(report.contains("at p90 sizing: bound by input tokens per minute at 81.7 slots"), "{report}");
        assert!(report.contains("recommended gate 20 (a quarter of the p90 ceiling); now 24"), "{report}");
        let empty = capacity_report(&[], &limits, &status, 7);
        assert!(empty.contains("nothing to size from"), "{empty}");
    }
}
