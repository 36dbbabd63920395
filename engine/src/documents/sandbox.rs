//! Untrusted documents are parsed in a child process with hard limits, so whatever a file does
//! to the parser (a stack overflow from self-drawing XObjects, a decompression bomb, a parser
//! bug that loops) costs one child, never the server: address space, CPU seconds, a wall clock
//! and the size of the answer are all bounded, the child gets no environment (no database URL,
//! no provider key) and, where the kernel allows it, no network.
//!
//! The child is this same program started with an `extract` command (the server binary, or
//! `sluice-extract` in the engine's tests); it runs [`child_main`].

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::extract::{extract_text, Extracted};
use super::sniff::DocType;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// How to start the child and what it may use.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// The program that runs [`child_main`].
    pub program: PathBuf,
    /// Arguments before the document type (e.g. `["extract"]` for the server binary).
    pub args: Vec<String>,
    /// Address space (RLIMIT_AS).
    pub memory_bytes: u64,
    /// CPU time (RLIMIT_CPU); the kernel stops the child past it.
    pub cpu_secs: u64,
    /// Wall-clock time, for a child that sleeps or blocks rather than computes.
    pub wall_clock: Duration,
    /// The most the child may answer (the text and its envelope).
    pub max_output_bytes: usize,
}

impl SandboxConfig {
    /// The default limits for `program args...`: 1 GiB, 30 CPU seconds, 60 s, 64 MiB of answer.
    pub fn new(program: PathBuf, args: Vec<String>) -> SandboxConfig {
        SandboxConfig {
            program,
            args,
            memory_bytes: 1 << 30,
            cpu_secs: 30,
            wall_clock: Duration::from_secs(60),
            max_output_bytes: 64 << 20,
        }
    }
}

/// What the child writes to its stdout: one JSON document.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Text { text: String, pages: Option<u32> },
    Refused { reason: String },
}

/// The user-facing reason when the child did not finish on its own terms.
pub const TOO_COMPLEX: &str = "the document is too complex or too large to read safely";

fn invalid(message: impl Into<String>) -> JobError {
    JobError::new(ErrorClass::InvalidInput, message)
}

/// Extract a document's text in a sandboxed child. A child that is killed, crashes, overruns
/// a limit or answers nonsense fails the job as `invalid_input` (never retried: the same file
/// would do the same again).
pub async fn extract_in_child(config: &SandboxConfig, doc_type: DocType, bytes: Bytes) -> Result<Extracted, JobError> {
    let mut command = tokio::process::Command::new(&config.program);
    command
        .args(&config.args)
        .arg(doc_type_arg(doc_type))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let limits = (config.memory_bytes, config.cpu_secs);
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, unshare).
    unsafe {
        command.pre_exec(move || {
            confine(limits.0, limits.1);
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| {
        tracing::error!(error = %e, program = %config.program.display(), "cannot start the document reader");
        JobError::new(ErrorClass::ServerError, "the document reader could not start")
    })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let feed = async move {
        // A child that stops reading (it crashed) makes this fail; its exit status says why.
        let _ = stdin.write_all(&bytes).await;
        drop(stdin);
    };
    let limit = config.max_output_bytes;
    let collect = async move {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = stdout.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(Some(out));
            }
            if out.len() + n > limit {
                return Ok(None);
            }
            out.extend_from_slice(&buf[..n]);
        }
    };
    let run = async {
        let ((), output) = tokio::join!(feed, collect);
        let status = child.wait().await;
        (output, status)
    };
    let (output, status) = match tokio::time::timeout(config.wall_clock, run).await {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!("document reader killed at its wall-clock limit");
            return Err(invalid(TOO_COMPLEX));
        }
    };
    let output = match output {
        Ok(Some(output)) => output,
        Ok(None) => return Err(invalid("the document's text is too large")),
        Err(_) => return Err(invalid(TOO_COMPLEX)),
    };
    match status {
        Ok(status) if status.success() => {}
        // Killed by a signal: a limit (SIGKILL, SIGXCPU), a stack overflow (SIGSEGV) or an
        // allocation past the address space (SIGABRT). The document did that.
        Ok(status) if status.signal().is_some() => {
            tracing::warn!(?status, "document reader stopped by a signal");
            return Err(invalid(TOO_COMPLEX));
        }
        // An exit code is the reader's own failure (no thread, no stdin): ours, so retried.
        Ok(status) => {
            tracing::error!(?status, "document reader failed");
            return Err(JobError::new(ErrorClass::ServerError, "the document reader failed"));
        }
        Err(_) => return Err(JobError::new(ErrorClass::ServerError, "the document reader failed")),
    }
    match serde_json::from_slice::<Answer>(&output) {
        Ok(Answer::Text { text, pages }) => Ok(Extracted { text, pages }),
        Ok(Answer::Refused { reason }) => Err(invalid(reason)),
        Err(_) => Err(invalid(TOO_COMPLEX)),
    }
}

/// In the child, before exec: hard limits, no core dumps, and a network namespace of its own
/// where the kernel lets us (as root; elsewhere the empty environment must do).
fn confine(memory_bytes: u64, cpu_secs: u64) {
    fn limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) {
        let value = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: plain syscall with a valid pointer.
        unsafe { libc::setrlimit(resource, &value) };
    }
    limit(libc::RLIMIT_AS, memory_bytes, memory_bytes);
    // SIGXCPU at the soft limit, SIGKILL one second later.
    limit(libc::RLIMIT_CPU, cpu_secs, cpu_secs + 1);
    limit(libc::RLIMIT_CORE, 0, 0);
    limit(libc::RLIMIT_FSIZE, 0, 0);
    // SAFETY: affects only this (child) process.
    unsafe { libc::unshare(libc::CLONE_NEWNET) };
}

fn doc_type_arg(doc_type: DocType) -> &'static str {
    match doc_type {
        DocType::Pdf => "pdf",
        DocType::PlainText => "text",
        DocType::Markdown => "markdown",
    }
}

/// The child's side: read the document from stdin, extract its text, answer on stdout.
/// The parsing runs on a thread with a large stack, so honest deep documents fit; hostile
/// ones hit the address-space limit or the parser's own nesting limit instead.
pub fn child_main(doc_type: Option<&str>) -> ExitCode {
    let doc_type = match doc_type {
        Some("pdf") => DocType::Pdf,
        Some("text") => DocType::PlainText,
        Some("markdown") => DocType::Markdown,
        _ => return ExitCode::from(2),
    };
    let mut bytes = Vec::new();
    if std::io::stdin().read_to_end(&mut bytes).is_err() {
        return ExitCode::from(3);
    }
    let worker = std::thread::Builder::new().stack_size(64 << 20).spawn(move || extract_text(doc_type, &bytes));
    let answer = match worker.map(|w| w.join()) {
        Ok(Ok(Ok(extracted))) => Answer::Text { text: extracted.text, pages: extracted.pages },
        Ok(Ok(Err(error))) => Answer::Refused { reason: error.message },
        // A panic is the file's fault: a refusal in plain words.
        Ok(Err(_)) => Answer::Refused { reason: "the document's text could not be read".into() },
        Err(_) => return ExitCode::from(4),
    };
    let mut stdout = std::io::stdout().lock();
    if serde_json::to_writer(&mut stdout, &answer).is_err() || stdout.flush().is_err() {
        return ExitCode::from(5);
    }
    ExitCode::SUCCESS
}
