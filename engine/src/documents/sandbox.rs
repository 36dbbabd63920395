//! Untrusted documents are parsed in a child process with hard limits, so whatever a file does
//! to the parser (a stack overflow from self-drawing XObjects, a decompression bomb, a parser
//! bug that loops) costs one child, never the server: address space, CPU seconds, a wall clock
//! and the size of the answer are all bounded, the child gets no environment (no database URL,
//! no provider key) and, where the kernel allows it, no network.
//!
//! The child is a wall, not a fence: before it reads a byte of the document it drops to an
//! unprivileged user (when started by root), gives up every file and TCP access with landlock
//! (where the kernel has it), and may hold only a few files and processes. A parser bug then
//! reaches neither the database's trust-auth socket nor the data folder nor the network.
//! At most a few readers run at once, bounded by the cores and a total memory budget.
//!
//! The child is this same program started with an `extract` command (the server binary, or
//! `sluice-extract` in the engine's tests); it runs [`child_main`].

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::extract::{extract_text, Extracted};
use super::office::Flavour;
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
    /// The user the child becomes before it reads the document (`None`: it keeps ours, which
    /// is all a non-root server can do).
    pub run_as: Option<RunAs>,
    /// Readers running at once, shared by every clone of this config.
    readers: Arc<Semaphore>,
    max_readers: usize,
    /// How scans are read (none: OCR is not installed, and a scan fails in words).
    pub ocr: Option<Arc<super::ocr_config::OcrConfig>>,
    /// How long a run waits for a reader's turn (none: as long as it takes); past it, the run
    /// fails with [`READERS_BUSY`].
    pub turn_wait: Option<Duration>,
}

/// A run that found no reader free within its config's `turn_wait`.
pub const READERS_BUSY: &str = "every document reader is busy";

/// The default total address space of all readers running at once.
pub const DEFAULT_MEMORY_BUDGET: u64 = 4 << 30;

impl SandboxConfig {
    /// The default limits for `program args...`: 1 GiB, 30 CPU seconds, 60 s, 64 MiB of answer;
    /// as many readers at once as there are cores, within 4 GiB in all; `nobody` when run by root.
    pub fn new(program: PathBuf, args: Vec<String>) -> SandboxConfig {
        let mut config = SandboxConfig {
            program,
            args,
            memory_bytes: Limits::DEFAULT.memory_bytes,
            cpu_secs: Limits::DEFAULT.cpu_secs,
            wall_clock: Duration::from_secs(60),
            max_output_bytes: 64 << 20,
            run_as: RunAs::default_for_root(),
            readers: Arc::new(Semaphore::new(1)),
            max_readers: 1,
            ocr: None,
            turn_wait: None,
        };
        config.limit_readers(cores(), DEFAULT_MEMORY_BUDGET);
        config
    }

    /// At most `max_readers` readers at once, and no more than `memory_budget` of address space
    /// among them (call after setting `memory_bytes`).
    pub fn limit_readers(&mut self, max_readers: usize, memory_budget: u64) {
        self.max_readers = readers_within(max_readers, memory_budget, self.memory_bytes);
        self.readers = Arc::new(Semaphore::new(self.max_readers));
    }

    /// The same reader with slots of its own: at most `readers` at once, apart from (never
    /// waiting for, never holding) this one's (translated files rebuilt for download).
    pub fn with_own_readers(&self, readers: usize) -> SandboxConfig {
        let mut own = self.clone();
        own.limit_readers(readers, self.memory_bytes.saturating_mul(readers as u64));
        own
    }

    /// How many readers may run at once.
    pub fn max_readers(&self) -> usize {
        self.max_readers
    }
}

/// Readers at once: no more than asked, no more than the budget holds, and at least one.
pub fn readers_within(max_readers: usize, memory_budget: u64, memory_per_reader: u64) -> usize {
    let fit = memory_budget / memory_per_reader.max(1);
    (max_readers as u64).min(fit).max(1) as usize
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Whether this process runs as root (then the reader must become someone else).
pub fn running_as_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

/// An unprivileged user and group for the reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// The named user's ids, if it exists.
    pub fn lookup(name: &str) -> Option<RunAs> {
        let name = std::ffi::CString::new(name).ok()?;
        // SAFETY: getpwnam returns a pointer into static storage or null; read at once, at startup.
        let entry = unsafe { libc::getpwnam(name.as_ptr()) };
        // SAFETY: checked for null.
        (!entry.is_null()).then(|| unsafe { RunAs { uid: (*entry).pw_uid, gid: (*entry).pw_gid } })
    }

    /// `nobody` when this process is root (uid 0 must never parse a document); nothing otherwise.
    pub fn default_for_root() -> Option<RunAs> {
        running_as_root().then(|| RunAs::lookup("nobody")).flatten()
    }

    fn to_arg(self) -> String {
        format!("--run-as={}:{}", self.uid, self.gid)
    }

    /// The child's `--run-as` value: none given is none, one given must parse (`Err`: not).
    pub fn from_arg(arg: Option<&str>) -> Result<Option<RunAs>, ()> {
        arg.map(|text| RunAs::parse(text).ok_or(())).transpose()
    }

    /// `uid:gid`, as the child is given it.
    pub fn parse(text: &str) -> Option<RunAs> {
        let (uid, gid) = text.split_once(':')?;
        Some(RunAs { uid: uid.parse().ok()?, gid: gid.parse().ok()? })
    }
}

/// What the child writes to its stdout: one JSON document.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Text {
        text: String,
        pages: Option<u32>,
    },
    /// A PDF's (or an image's) text page by page: an empty page has no text layer.
    Pages {
        pages: Vec<String>,
        scanned: Vec<u32>,
    },
    Refused {
        reason: String,
    },
}

/// The user-facing reason when the child did not finish on its own terms.
pub const TOO_COMPLEX: &str = "the document is too complex or too large to read safely";

fn invalid(message: impl Into<String>) -> JobError {
    JobError::new(ErrorClass::InvalidInput, message).unreadable()
}

/// Extract a document's text in a sandboxed child. A child that is killed, crashes, overruns
/// a limit or answers nonsense fails the job as `invalid_input` (never retried: the same file
/// would do the same again).
pub async fn extract_in_child(config: &SandboxConfig, doc_type: DocType, bytes: Bytes) -> Result<Extracted, JobError> {
    let run = ReaderRun::of(config, doc_type_arg(doc_type), config.max_output_bytes);
    let output = run_reader(config, run, bytes).await?;
    match serde_json::from_slice::<Answer>(&output) {
        Ok(Answer::Text { text, pages }) => Ok(Extracted { pages, ..Extracted::whole(text) }),
        Ok(Answer::Pages { pages, scanned }) => Ok(Extracted::of_pages(pages, scanned)),
        Ok(Answer::Refused { reason }) => Err(invalid(reason)),
        Err(_) => Err(invalid(TOO_COMPLEX)),
    }
}

/// The child's argument for rebuilding a file of this type with new paragraphs.
fn rebuild_arg(doc_type: DocType) -> Option<&'static str> {
    match doc_type {
        DocType::Docx => Some("rebuild-docx"),
        DocType::Odt => Some("rebuild-odt"),
        DocType::Html => Some("rebuild-html"),
        _ => None,
    }
}

/// A Word or OpenDocument file rebuilt in a sandboxed child with its paragraphs' text
/// replaced by `paragraphs` (see [`super::office::rebuild`]); its parsing is as hostile as
/// reading it. The child is given the paragraphs as JSON after their length, then the file.
pub async fn rebuild_in_child(
    config: &SandboxConfig,
    doc_type: DocType,
    original: Bytes,
    paragraphs: &[String],
) -> Result<Vec<u8>, JobError> {
    let arg = rebuild_arg(doc_type)
        .ok_or_else(|| invalid("only a Word or OpenDocument file or a web page can be rebuilt"))?;
    let json = serde_json::to_vec(paragraphs).expect("strings serialise");
    let mut input = Vec::with_capacity(4 + json.len() + original.len());
    input.extend_from_slice(&(json.len() as u32).to_le_bytes());
    input.extend_from_slice(&json);
    input.extend_from_slice(&original);
    // The new file is about as large as the old one and its new text.
    let limit = config.max_output_bytes.max(2 * input.len() + (1 << 20));
    let mut output = run_reader(config, ReaderRun::of(config, arg, limit), input.into()).await?;
    match output.first() {
        Some(b'F') => {
            output.remove(0);
            Ok(output)
        }
        Some(b'R') => Err(invalid(String::from_utf8_lossy(&output[1..]).into_owned())),
        _ => Err(invalid(TOO_COMPLEX)),
    }
}

/// One run of the reader: what it is asked to do and its bounds.
pub(crate) struct ReaderRun<'a> {
    pub arg: &'a str,
    pub output_limit: usize,
    pub limits: Limits,
    pub wall_clock: Duration,
    /// A variable the run reads its request from, besides its limits.
    pub request: Option<(&'static str, String)>,
}

impl<'a> ReaderRun<'a> {
    /// A run with the reader's own limits.
    pub fn of(config: &SandboxConfig, arg: &'a str, output_limit: usize) -> ReaderRun<'a> {
        ReaderRun {
            arg,
            output_limit,
            limits: Limits { memory_bytes: config.memory_bytes, cpu_secs: config.cpu_secs },
            wall_clock: config.wall_clock,
            request: None,
        }
    }
}

/// Kills the reader's whole process group (the tools a reader runs for OCR too) when dropped:
/// its wall clock ran out, or its job stopped waiting for it.
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0.filter(|pid| *pid > 1) {
            // SAFETY: plain syscall; the group is the reader's own (it leads it), so this
            // reaches nothing else; an ended group answers ESRCH, which is fine.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        }
    }
}

/// Run the reader child as `run` says, give it `input`, and return what it wrote (at most
/// `run.output_limit` bytes) once it exited on its own.
pub(crate) async fn run_reader(config: &SandboxConfig, run: ReaderRun<'_>, bytes: Bytes) -> Result<Vec<u8>, JobError> {
    // Waiting for a turn is not the document's time: the wall clock starts with the child.
    let turn = config.readers.acquire();
    let _turn = match config.turn_wait {
        None => turn.await,
        Some(wait) => {
            tokio::time::timeout(wait, turn).await.map_err(|_| JobError::new(ErrorClass::ServerError, READERS_BUSY))?
        }
    }
    .expect("the readers' semaphore is never closed");
    let limits = run.limits;
    let mut command = tokio::process::Command::new(&config.program);
    command
        .args(&config.args)
        .args(config.run_as.map(RunAs::to_arg))
        .arg(run.arg)
        .env_clear()
        .env(LIMITS_VAR, limits.to_value())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // A group of its own, so the tools it starts end with it (posix_spawn keeps this).
        .process_group(0)
        .kill_on_drop(true);
    if let Some((name, value)) = &run.request {
        command.env(name, value);
    }
    // No `pre_exec`, so the standard library starts the child with `posix_spawn` (a vfork): a
    // fork of this large, many-threaded process copied its page tables and stalled every thread
    // of the web. The child sets its own limits first of all ([`confine`]), and they are set
    // from here too before it is given the document, so a reader that is not ours has them.
    let mut child = command.spawn().map_err(|e| {
        tracing::error!(error = %e, program = %config.program.display(), "cannot start the document reader");
        JobError::new(ErrorClass::ServerError, "the document reader could not start")
    })?;
    let _group = GroupKiller(child.id());
    if let Err(e) = limit_child(child.id(), limits) {
        tracing::error!(error = %e, "cannot limit the document reader");
        return Err(JobError::new(ErrorClass::ServerError, "the document reader could not start"));
    }
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let feed = async move {
        // A child that stops reading (it crashed) makes this fail; its exit status says why.
        let _ = stdin.write_all(&bytes).await;
        drop(stdin);
    };
    let limit = run.output_limit;
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
    let run_wall_clock = run.wall_clock;
    let waited = async {
        let ((), output) = tokio::join!(feed, collect);
        let status = child.wait().await;
        (output, status)
    };
    let (output, status) = match tokio::time::timeout(run_wall_clock, waited).await {
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
    Ok(output)
}

/// How much lower a reader's scheduling priority is than the server's.
pub const READER_NICENESS: libc::c_int = 10;

/// The variable a reader finds its limits in (its environment is otherwise empty).
pub const LIMITS_VAR: &str = "SLUICE_READER_LIMITS";

/// A reader's address space and CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpu_secs: u64,
}

impl Limits {
    /// 1 GiB of address space and 30 CPU seconds.
    pub const DEFAULT: Limits = Limits { memory_bytes: 1 << 30, cpu_secs: 30 };

    /// `bytes:secs`, as the reader is given them.
    fn to_value(self) -> String {
        format!("{}:{}", self.memory_bytes, self.cpu_secs)
    }

    pub fn parse(text: &str) -> Option<Limits> {
        let (memory, cpu) = text.split_once(':')?;
        Some(Limits { memory_bytes: memory.parse().ok()?, cpu_secs: cpu.parse().ok()? })
    }

    /// The limits to set: (resource, soft, hard). SIGXCPU at the CPU time, SIGKILL a second later.
    fn settings(self) -> [(libc::__rlimit_resource_t, u64, u64); 4] {
        [
            (libc::RLIMIT_AS, self.memory_bytes, self.memory_bytes),
            (libc::RLIMIT_CPU, self.cpu_secs, self.cpu_secs.saturating_add(1)),
            (libc::RLIMIT_CORE, 0, 0),
            (libc::RLIMIT_FSIZE, 0, 0),
        ]
    }
}

/// Pure: a limit to set, never above the hard limit the process holds already (raising one
/// needs a privilege a container may not give, and a stricter limit its operator set stays).
pub fn within(soft: u64, hard: u64, held_hard: u64) -> (u64, u64) {
    (soft.min(held_hard), hard.min(held_hard))
}

/// In the child, first of all (still root, before the document): its limits (a process may
/// always lower its own, so this needs no privilege and cannot race the parent), a lower
/// priority, and a network namespace of its own where the kernel lets us (as root; elsewhere
/// the empty environment must do). False when a limit could not be set.
pub fn confine(limits: Limits) -> bool {
    let limited = limits.settings().into_iter().all(|(resource, soft, hard)| limit_of(0, resource, soft, hard).is_ok());
    // SAFETY: affects only this (child) process. A reader yields the CPU to the web and the
    // workers' own threads (nice 10): reading a document can wait a little, an answer cannot.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, READER_NICENESS);
        libc::unshare(libc::CLONE_NEWNET);
    }
    limited
}

/// From the parent, once the child runs and before it is given the document: the same limits.
/// A reader of ours may have become another user by now (having set them itself); then the
/// kernel refuses without `CAP_SYS_RESOURCE`, which is no error.
fn limit_child(pid: Option<u32>, limits: Limits) -> std::io::Result<()> {
    let pid = pid.ok_or_else(|| std::io::Error::other("the reader has no process id"))?;
    for (resource, soft, hard) in limits.settings() {
        match limit_of(pid as libc::pid_t, resource, soft, hard) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Lower one of this process's limits (best effort: a limit already lower stays).
fn limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) {
    let _ = limit_of(0, resource, soft, hard);
}

/// Set a limit of process `pid` (0: this one), within the hard limit this process holds.
fn limit_of(pid: libc::pid_t, resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> std::io::Result<()> {
    let mut held = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls with valid pointers; `pid` is this process or our unreaped child.
    unsafe {
        if libc::getrlimit(resource, &mut held) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (soft, hard) = within(soft, hard, held.rlim_max);
        let value = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        if libc::prlimit(pid, resource, &value, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What [`lock_down`] achieved.
#[derive(Clone, Copy, Debug)]
pub struct Walls {
    /// The landlock ABI that now denies every file and TCP access (0: the kernel has none).
    pub landlock_abi: i64,
    /// A seccomp filter now refuses to make sockets (so no Unix socket can be reached by its
    /// path, which landlock does not cover).
    pub seccomp: bool,
}

/// In the child, after exec and before the document: few files, the unprivileged user (for
/// good: no way back to root), and landlock denying every file and TCP access. Fails if the
/// user could not be changed; landlock is best effort (older kernels lack it).
pub fn lock_down(run_as: Option<RunAs>) -> Result<Walls, &'static str> {
    lock_down_with(run_as, 16, &[])
}

/// [`lock_down`] with `open_files` files at most, and the folders in `readable` left to read
/// and run programs from (the OCR tools, their libraries and data); nothing else.
pub fn lock_down_with(
    run_as: Option<RunAs>,
    open_files: u64,
    readable: &[std::path::PathBuf],
) -> Result<Walls, &'static str> {
    // stdin, stdout, stderr and a few for the runtime; the reader opens nothing.
    limit(libc::RLIMIT_NOFILE, open_files, open_files);
    if let Some(RunAs { uid, gid }) = run_as {
        // Counted per user: one reader needs two threads; 64 leaves room for the others at once.
        limit(libc::RLIMIT_NPROC, 64, 64);
        // SAFETY: plain syscalls; the order matters (groups and group while still root).
        let dropped =
            unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0 };
        // SAFETY: plain syscalls.
        let stays = unsafe { libc::getuid() == uid && libc::geteuid() == uid && libc::getegid() == gid };
        // SAFETY: plain syscall; must fail now that root is gone (unless uid 0 was asked for).
        let no_way_back = uid == 0 || unsafe { libc::setuid(0) } != 0;
        if !(dropped && stays && no_way_back) {
            return Err("could not become the unprivileged user");
        }
    }
    let landlock_abi = deny_files_and_network(readable);
    Ok(Walls { landlock_abi, seccomp: deny_sockets_io_uring_and_other_abis() })
}

/// A seccomp filter refusing (EACCES) `socket` and `socketpair` (the reader needs neither, and
/// without a socket no Unix socket is reachable, whatever its folder's permissions), io_uring
/// (its operations would bypass this filter's view of system calls), and every call through
/// another ABI (i386's `int 0x80`, x32's numbers), whose numbers this filter would misread.
/// Needs no_new_privs (set with landlock, or here). Returns whether the filter is in place.
fn deny_sockets_io_uring_and_other_abis() -> bool {
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return false;
    const LOAD_WORD: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JUMP_IF_EQUAL: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    const ALLOW: u32 = 0x7fff_0000; // SECCOMP_RET_ALLOW
    const REFUSE: u32 = 0x0005_0000 | libc::EACCES as u32; // SECCOMP_RET_ERRNO
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let refused = [
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    let mut filter = vec![
        op(LOAD_WORD, 0, 0, 4), // seccomp_data.arch
        op(JUMP_IF_EQUAL, 1, 0, ARCH),
        op(RETURN, 0, 0, REFUSE), // another ABI: refused
        op(LOAD_WORD, 0, 0, 0),   // seccomp_data.nr
    ];
    #[cfg(target_arch = "x86_64")]
    {
        const JUMP_IF_AT_LEAST: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        filter.extend([op(JUMP_IF_AT_LEAST, 0, 1, X32_SYSCALL_BIT), op(RETURN, 0, 0, REFUSE)]);
    }
    // Each refused number jumps past the ones after it and the ALLOW, to the REFUSE at the end.
    for (i, nr) in refused.iter().enumerate() {
        filter.push(op(JUMP_IF_EQUAL, (refused.len() - i) as u8, 0, *nr as u32));
    }
    filter.extend([op(RETURN, 0, 0, ALLOW), op(RETURN, 0, 0, REFUSE)]);
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: plain syscalls; the program outlives the call (the kernel copies it).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &program as *const libc::sock_fprog) == 0
    }
}

/// Landlock denying every file access (but reading and running programs beneath `readable`)
/// and every TCP bind or connect, and (from ABI 6) abstract Unix sockets and signals outside
/// the child. Returns the ABI used.
fn deny_files_and_network(readable: &[std::path::PathBuf]) -> i64 {
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }
    const CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: the version query takes no pointer.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        return 0;
    }
    let mut fs = (1u64 << 13) - 1; // ABI 1: execute, read, write, make, remove...
    if abi >= 2 {
        fs |= 1 << 13; // refer
    }
    if abi >= 3 {
        fs |= 1 << 14; // truncate
    }
    if abi >= 5 {
        fs |= 1 << 15; // ioctl on devices
    }
    let attr = RulesetAttr {
        handled_access_fs: fs,
        handled_access_net: if abi >= 4 { 0b11 } else { 0 },
        scoped: if abi >= 6 { 0b11 } else { 0 },
    };
    let size = match abi {
        1..=3 => 8,
        4 | 5 => 16,
        _ => std::mem::size_of::<RulesetAttr>(),
    };
    // SAFETY: a valid struct of the size given; the fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, &attr as *const RulesetAttr, size, 0) };
    if fd < 0 {
        return 0;
    }
    for folder in readable {
        allow_reading_beneath(fd as libc::c_int, folder);
    }
    // SAFETY: plain syscalls on our own fd; no_new_privs is required to restrict ourselves.
    let restricted = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::syscall(libc::SYS_landlock_restrict_self, fd as libc::c_int, 0) == 0
    };
    // SAFETY: our own fd.
    unsafe { libc::close(fd as libc::c_int) };
    if restricted {
        abi
    } else {
        0
    }
}

/// Let the landlock ruleset `ruleset` read files and folders and run programs beneath `folder`,
/// or read `folder` if it is a file (one that cannot be opened is left out: it grants nothing).
fn allow_reading_beneath(ruleset: libc::c_int, folder: &std::path::Path) {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    const EXECUTE: u64 = 1 << 0;
    const READ_FILE: u64 = 1 << 2;
    const READ_DIR: u64 = 1 << 3;
    const RULE_PATH_BENEATH: libc::c_int = 1;
    let Ok(path) = std::ffi::CString::new(folder.as_os_str().as_encoded_bytes()) else { return };
    // SAFETY: a valid C string; the fd is closed below.
    let parent = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if parent < 0 {
        return;
    }
    // A file takes file rights only (a folder's make the rule invalid).
    let access = if folder.is_dir() { EXECUTE | READ_FILE | READ_DIR } else { READ_FILE };
    let rule = PathBeneath { allowed_access: access, parent_fd: parent };
    // SAFETY: a valid rule struct for this rule type; both fds are ours.
    unsafe {
        libc::syscall(libc::SYS_landlock_add_rule, ruleset, RULE_PATH_BENEATH, &rule as *const PathBeneath, 0);
        libc::close(parent);
    }
}

/// The child's argument for a type: its file extension (`pdf`, `txt`, `docx`, ...).
fn doc_type_arg(doc_type: DocType) -> &'static str {
    doc_type.extension()
}

/// The child's side: read the document from stdin, extract its text, answer on stdout.
/// The parsing runs on a thread with a large stack, so honest deep documents fit; hostile
/// ones hit the address-space limit or the parser's own nesting limit instead.
pub fn child_main(doc_type: Option<&str>, run_as: Option<&str>) -> ExitCode {
    // No limits, no reading: a reader never runs unconfined.
    let limits = std::env::var(LIMITS_VAR).ok().and_then(|v| Limits::parse(&v));
    if !limits.is_some_and(confine) {
        return ExitCode::from(2);
    }
    let rebuild = DocType::ALL.into_iter().find(|t| rebuild_arg(*t).is_some() && rebuild_arg(*t) == doc_type);
    let Some(doc_type) = rebuild.or_else(|| DocType::ALL.into_iter().find(|t| Some(doc_type_arg(*t)) == doc_type))
    else {
        return ExitCode::from(2);
    };
    let Ok(run_as) = RunAs::from_arg(run_as) else { return ExitCode::from(2) };
    if lock_down(run_as).is_err() {
        return ExitCode::from(6);
    }
    let mut bytes = Vec::new();
    if std::io::stdin().read_to_end(&mut bytes).is_err() {
        return ExitCode::from(3);
    }
    if rebuild.is_some() {
        return rebuild_child(doc_type, bytes);
    }
    let worker = std::thread::Builder::new().stack_size(64 << 20).spawn(move || extract_text(doc_type, &bytes));
    let answer = match worker.map(|w| w.join()) {
        Ok(Ok(Ok(extracted))) if !extracted.page_texts.is_empty() => {
            Answer::Pages { pages: extracted.page_texts, scanned: extracted.scanned }
        }
        Ok(Ok(Ok(extracted))) => Answer::Text { text: extracted.text, pages: extracted.pages },
        Ok(Ok(Err(error))) => Answer::Refused { reason: error.message },
        // A panic is the file's fault: a refusal in plain words.
        Ok(Err(_)) => Answer::Refused { reason: "the document's text could not be read".into() },
        Err(_) => return ExitCode::from(4),
    };
    write_answer(&answer)
}

/// A text answer, as [`child_main`] gives it (for probes in the tests).
pub fn answer_text(text: String) -> ExitCode {
    write_answer(&Answer::Text { text, pages: None })
}

/// The child's side of [`rebuild_in_child`]: `F` and the new file, or `R` and the reason.
fn rebuild_child(doc_type: DocType, input: Vec<u8>) -> ExitCode {
    let flavour = if doc_type == DocType::Odt { Flavour::OpenDocument } else { Flavour::Word };
    let work = move || -> Result<Vec<u8>, String> {
        let refused = || "the request to rebuild the document is malformed".to_string();
        let (length, rest) = input.split_at_checked(4).ok_or_else(refused)?;
        let length = u32::from_le_bytes(length.try_into().map_err(|_| refused())?) as usize;
        let (json, original) = rest.split_at_checked(length).ok_or_else(refused)?;
        let paragraphs: Vec<String> = serde_json::from_slice(json).map_err(|_| refused())?;
        match doc_type {
            DocType::Html => super::html::rebuild(&String::from_utf8_lossy(original), &paragraphs),
            _ => super::office::rebuild(flavour, original, &paragraphs),
        }
    };
    let answer = match std::thread::Builder::new().stack_size(64 << 20).spawn(work).map(|w| w.join()) {
        Ok(Ok(Ok(file))) => [&b"F"[..], &file].concat(),
        Ok(Ok(Err(reason))) => [&b"R"[..], reason.as_bytes()].concat(),
        Ok(Err(_)) => b"Rthe document could not be rebuilt".to_vec(),
        Err(_) => return ExitCode::from(4),
    };
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(&answer).is_err() || stdout.flush().is_err() {
        return ExitCode::from(5);
    }
    ExitCode::SUCCESS
}

fn write_answer(answer: &Answer) -> ExitCode {
    write_json(answer)
}

/// A reader's answer, as JSON on its stdout.
pub(crate) fn write_json(answer: &impl Serialize) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    if serde_json::to_writer(&mut stdout, answer).is_err() || stdout.flush().is_err() {
        return ExitCode::from(5);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_fit_the_count_and_the_memory_budget() {
        const GIB: u64 = 1 << 30;
        assert_eq!(readers_within(2, 4 * GIB, GIB), 2, "the cores bound");
        assert_eq!(readers_within(16, 4 * GIB, GIB), 4, "the budget bounds");
        assert_eq!(readers_within(16, 4 * GIB, 3 * GIB), 1);
        assert_eq!(readers_within(0, 0, GIB), 1, "one reader always runs, or nothing would");
        assert_eq!(readers_within(8, u64::MAX, 0), 8);
    }

    #[test]
    fn rebuilds_take_reader_slots_of_their_own() {
        let workers = SandboxConfig::new("/bin/true".into(), Vec::new());
        let rebuilds = workers.with_own_readers(2);
        assert_eq!(rebuilds.max_readers(), 2);
        let _held = rebuilds.readers.clone().try_acquire_many_owned(2).unwrap();
        assert!(workers.readers.try_acquire().is_ok(), "the workers' readers are not the downloads'");
    }

    #[test]
    fn run_as_round_trips_and_rejects_garbage() {
        let nobody = RunAs { uid: 65534, gid: 65534 };
        assert_eq!(RunAs::parse(nobody.to_arg().trim_start_matches("--run-as=")), Some(nobody));
        assert_eq!(RunAs::parse("65534"), None);
        assert_eq!(RunAs::parse("a:b"), None);
    }

    #[test]
    fn limits_round_trip_and_stay_within_what_is_held() {
        let limits = Limits { memory_bytes: 1 << 30, cpu_secs: 30 };
        assert_eq!(Limits::parse(&limits.to_value()), Some(limits));
        assert_eq!(Limits::parse("1073741824"), None);
        assert_eq!(Limits::parse("-1:30"), None);
        // No hard limit held: as asked. A stricter one held: it stays, soft and hard.
        assert_eq!(within(30, 31, u64::MAX), (30, 31));
        assert_eq!(within(30, 31, 10), (10, 10));
        assert_eq!(within(30, 31, 30), (30, 30));
        // The CPU limit's grace second cannot overflow.
        let most = Limits { memory_bytes: 0, cpu_secs: u64::MAX };
        assert!(most.settings().iter().all(|&(_, soft, hard)| soft <= hard));
    }
}
