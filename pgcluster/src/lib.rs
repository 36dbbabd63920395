//! A private Postgres cluster started from the machine's server binaries.
//!
//! The cluster listens on a Unix socket inside its data folder only (no TCP port). When the
//! current process is root, `initdb` and `postgres` refuse to run, so they run as an
//! unprivileged system user (`postgres` by default) who owns the data folder.
//!
//! This crate has no dependencies beyond `libc`, so both the server and `xtask` can use it.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The superuser created by `initdb` and used in the connection URL.
pub const SUPERUSER: &str = "postgres";
const PORT: u16 = 5432;

#[derive(Debug)]
pub enum ClusterError {
    BinariesNotFound,
    NoUnprivilegedUser(String),
    FolderNotReachable(PathBuf, String),
    InUse(PathBuf),
    /// The data folder is a link, but not to the place this code relocates it to.
    UnexpectedLink {
        link: PathBuf,
        target: PathBuf,
        expected: PathBuf,
    },
    Command {
        what: String,
        detail: String,
    },
    Io(io::Error),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::BinariesNotFound => write!(
                f,
                "no Postgres server binaries found (initdb, pg_ctl, postgres) on PATH or under \
                 /usr/lib/postgresql/*/bin. Install them (Debian: `apt-get install -y postgresql`) \
                 or set DATABASE_URL to an existing server"
            ),
            ClusterError::NoUnprivilegedUser(user) => write!(
                f,
                "running as root, and Postgres refuses to run as root; the system user `{user}` \
                 to run it as does not exist (create it, e.g. `useradd --system {user}`, or set \
                 DATABASE_URL)"
            ),
            ClusterError::FolderNotReachable(path, user) => write!(
                f,
                "the data folder {} cannot be reached by the user `{user}` that runs Postgres \
                 (a parent folder is not searchable), and it could not be moved under {RELOCATION_BASE} \
                 (it is not empty, or that folder cannot be made); choose another data folder",
                path.display()
            ),
            ClusterError::InUse(path) => write!(
                f,
                "another Sluice server is running with the Postgres data folder {}; stop it first, or give \
                 this one another --data-dir",
                path.display()
            ),
            ClusterError::UnexpectedLink { link, target, expected } => write!(
                f,
                "the data folder {} is a link to {}, not to {} where Sluice keeps this checkout's \
                 cluster; remove the link (or choose another data folder)",
                link.display(),
                target.display(),
                expected.display()
            ),
            ClusterError::Command { what, detail } => write!(f, "{what} failed: {detail}"),
            ClusterError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClusterError {}

impl From<io::Error> for ClusterError {
    fn from(e: io::Error) -> Self {
        ClusterError::Io(e)
    }
}

/// Who runs the Postgres processes.
#[derive(Clone, Copy, Debug)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A running cluster this process started (or adopted). Call [`Cluster::stop`] to stop it;
/// dropping it also stops it, so a panic or an early return does not leave Postgres behind.
#[derive(Debug)]
pub struct Cluster {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    run_as: Option<RunAs>,
    /// Whether this process stops the server when done (false when it attached to a server
    /// another live process runs).
    owned: bool,
    /// Held while this process owns the cluster, so a second owner is refused.
    _lock: Option<fs::File>,
    stopped: bool,
}

impl Cluster {
    /// Initialise the cluster in `data_dir` if it is new, then start it. A cluster left running
    /// by a killed earlier run is adopted: this process uses it and stops it when done. A stale
    /// `postmaster.pid` without a live server is handled by Postgres itself.
    pub fn start(data_dir: &Path) -> Result<Cluster, ClusterError> {
        Self::open(data_dir, true)
    }

    /// Like [`Cluster::start`], but a server that is already running is only used, never
    /// stopped (operator commands next to a live server).
    pub fn attach_or_start(data_dir: &Path) -> Result<Cluster, ClusterError> {
        Self::open(data_dir, false)
    }

    fn open(data_dir: &Path, adopt_running: bool) -> Result<Cluster, ClusterError> {
        let bin_dir = find_bin_dir().ok_or(ClusterError::BinariesNotFound)?;
        // Owners hold an exclusive lock beside the folder. The kernel drops it when a process
        // dies, so a killed server's cluster can be adopted, but a live server's cannot.
        let lock = if adopt_running { Some(lock_beside(data_dir)?) } else { None };
        let run_as = unprivileged_user()?;
        let data_dir = place_data_dir(data_dir, run_as)?;
        if let Some(user) = run_as {
            chown(&data_dir, Some(user.uid), Some(user.gid))?;
        }
        fs::set_permissions(&data_dir, fs::Permissions::from_mode(0o700))?;
        let mut cluster = Cluster { bin_dir, data_dir, run_as, owned: true, _lock: lock, stopped: false };

        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.initdb()?;
        }
        if cluster.is_running() {
            // Left by a killed run (adopt it), or run by a live server (only use it).
            cluster.owned = adopt_running;
            return Ok(cluster);
        }
        cluster.pg_start()?;
        Ok(cluster)
    }

    /// Where the cluster's files are (after following a relocation link).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The folder holding the Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A libpq-style URL for database `db` over the Unix socket.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{SUPERUSER}@localhost:{PORT}/{db}?host={}", self.socket_dir().display())
    }

    /// Create a database if it does not exist yet.
    pub fn create_database(&self, name: &str) -> Result<(), ClusterError> {
        let out = self.run(Command::new(self.bin_dir.join("createdb")).args(["-h"]).arg(self.socket_dir()).args([
            "-p",
            &PORT.to_string(),
            "-U",
            SUPERUSER,
            name,
        ]))?;
        if out.status.success() || String::from_utf8_lossy(&out.stderr).contains("already exists") {
            Ok(())
        } else {
            Err(command_error("createdb", &out))
        }
    }

    pub fn is_running(&self) -> bool {
        self.pg_ctl(&["status"]).map(|o| o.status.success()).unwrap_or(false)
    }

    /// Stop the server (fast shutdown: open sessions are ended, data is safe).
    pub fn stop(&mut self) -> Result<(), ClusterError> {
        if self.stopped || !self.owned {
            return Ok(());
        }
        self.stopped = true;
        let out = self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])?;
        if out.status.success() || !self.is_running() {
            Ok(())
        } else {
            Err(command_error("pg_ctl stop", &out))
        }
    }

    /// Stop the server the way a crash would: `immediate` mode ends every process at once
    /// without a checkpoint, so the next start runs crash recovery. For crash tests.
    pub fn crash(&mut self) -> Result<(), ClusterError> {
        let out = self.pg_ctl(&["stop", "-m", "immediate", "-w"])?;
        self.stopped = true;
        if out.status.success() {
            Ok(())
        } else {
            Err(command_error("pg_ctl stop -m immediate", &out))
        }
    }

    /// Start again after [`Cluster::stop`] or [`Cluster::crash`].
    pub fn restart(&mut self) -> Result<(), ClusterError> {
        if self.is_running() {
            let _ = self.pg_ctl(&["stop", "-m", "fast", "-w"]);
        }
        self.pg_start()?;
        self.stopped = false;
        self.owned = true;
        Ok(())
    }

    fn initdb(&self) -> Result<(), ClusterError> {
        let out = self.run(Command::new(self.bin_dir.join("initdb")).arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]))?;
        if !out.status.success() {
            return Err(command_error("initdb", &out));
        }
        Ok(())
    }

    /// The server options this cluster runs with (`pg_ctl start -o ...`).
    pub fn server_options(&self) -> String {
        format!(
            "-c listen_addresses='' -c unix_socket_directories='{}' -p {PORT} -c max_connections=300 \
             -c shared_buffers=128MB -c fsync=on",
            self.socket_dir().display()
        )
    }

    /// The folder with `pg_ctl` and the other server binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    fn pg_start(&self) -> Result<(), ClusterError> {
        let opts = self.server_options();
        let log = self.data_dir.join("server.log");
        let out = self.pg_ctl(&["start", "-w", "-t", "60", "-o", &opts, "-l", &log.to_string_lossy()])?;
        if !out.status.success() {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(10).collect();
            let mut err = command_error("pg_ctl start", &out);
            if let ClusterError::Command { detail, .. } = &mut err {
                detail.push_str("\nserver.log (last lines, newest first):\n");
                detail.push_str(&tail.join("\n"));
            }
            return Err(err);
        }
        Ok(())
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output, ClusterError> {
        let mut cmd = Command::new(self.bin_dir.join("pg_ctl"));
        cmd.arg("-D").arg(&self.data_dir).args(args);
        self.run(&mut cmd)
    }

    /// Run a Postgres tool as the unprivileged user when needed, in its own process group so a
    /// Ctrl-C in the terminal reaches our process (which then stops the cluster in order) and
    /// not the postmaster directly.
    fn run(&self, cmd: &mut Command) -> Result<Output, ClusterError> {
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
            // A root HOME or cwd may be unreadable for that user.
            cmd.current_dir(&self.data_dir).env("HOME", &self.data_dir);
        }
        cmd.process_group(0).stdin(Stdio::null());
        Ok(cmd.output()?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn lock_beside(data_dir: &Path) -> Result<fs::File, ClusterError> {
    use std::os::unix::io::AsRawFd;
    let name = data_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "postgres".into());
    let parent = data_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let file =
        fs::OpenOptions::new().create(true).truncate(false).write(true).open(parent.join(format!("{name}.lock")))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(ClusterError::InUse(data_dir.to_path_buf()));
    }
    Ok(file)
}

fn command_error(what: &str, out: &Output) -> ClusterError {
    ClusterError::Command {
        what: what.to_string(),
        detail: format!(
            "{}{}{}",
            out.status,
            if out.stderr.is_empty() { "" } else { ": " },
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// The folder with `initdb`, `pg_ctl` and `postgres`: PATH first, then the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Option<PathBuf> {
    let has_all = |dir: &Path| ["initdb", "pg_ctl", "postgres"].iter().all(|b| dir.join(b).is_file());
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_all(&dir) {
                // Debian's wrappers on PATH are symlinks; resolve so createdb sits beside them.
                let real = dir.join("initdb").canonicalize().ok()?;
                let real_dir = real.parent()?.to_path_buf();
                return Some(if has_all(&real_dir) { real_dir } else { dir });
            }
        }
    }
    let mut candidates: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_all(&bin).then_some((version, bin))
        })
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, bin)| bin)
}

fn unprivileged_user() -> Result<Option<RunAs>, ClusterError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = std::env::var("SLUICE_PG_USER").unwrap_or_else(|_| "postgres".to_string());
    let passwd = fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0] == name)
        .and_then(|f| Some(RunAs { uid: f[2].parse().ok()?, gid: f[3].parse().ok()? }))
        .map(Some)
        .ok_or(ClusterError::NoUnprivilegedUser(name))
}

/// Where clusters live whose requested folder the Postgres user cannot reach.
pub const RELOCATION_BASE: &str = "/var/lib/sluice";

/// The folder a cluster requested at `requested` (canonical path) lives in when the user that
/// runs Postgres cannot reach it: under [`RELOCATION_BASE`], keyed by the requested path so each
/// checkout keeps its own cluster and finds it again on the next run.
pub fn relocated_dir(requested: &Path) -> PathBuf {
    // FNV-1a: stable across Rust versions and machines, unlike std's hasher.
    let hash = requested
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    let slug: String = requested
        .iter()
        .rev()
        .take(3)
        .map(|c| c.to_string_lossy().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect::<String>())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("_");
    Path::new(RELOCATION_BASE).join(format!("{slug}-{hash:016x}"))
}

/// The canonical folder the cluster's files go in. Root's home folder is `0700` on most
/// machines, so a checkout there cannot be reached by the user that runs Postgres: the cluster
/// then lives in [`relocated_dir`] and `requested` becomes a symlink to it, so the data folder
/// still shows where the data is and the next run finds it.
fn place_data_dir(requested: &Path, run_as: Option<RunAs>) -> Result<PathBuf, ClusterError> {
    let is_link = fs::symlink_metadata(requested).map(|m| m.file_type().is_symlink()).unwrap_or(false);
    if is_link {
        // Relocated by an earlier run; the target may have been removed since. Only the link
        // this code makes is followed: root must not create, chown and chmod whatever a link
        // someone else placed points at (or share a cluster with a copied checkout).
        let name = requested.file_name().ok_or_else(|| io::Error::other("the data folder has no name"))?;
        let parent = requested.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let expected = relocated_dir(&parent.canonicalize()?.join(name));
        let target = fs::read_link(requested)?;
        if target != expected {
            return Err(ClusterError::UnexpectedLink { link: requested.to_path_buf(), target, expected });
        }
        fs::create_dir_all(&target)?;
    } else {
        fs::create_dir_all(requested)?;
    }
    let canonical = requested.canonicalize()?;
    let Some(user) = run_as else { return Ok(canonical) };
    if check_reachable(&canonical, user).is_ok() {
        return Ok(canonical);
    }
    let not_reachable = || ClusterError::FolderNotReachable(canonical.clone(), format!("uid {}", user.uid));
    // Only an empty folder (what an earlier failed run left) is replaced by the link.
    if is_link || fs::read_dir(&canonical)?.next().is_some() {
        return Err(not_reachable());
    }
    let target = relocated_dir(&canonical);
    if !Path::new(RELOCATION_BASE).exists() {
        // Made here: searchable by the Postgres user. An existing one keeps its owner's mode.
        fs::create_dir_all(RELOCATION_BASE)?;
        fs::set_permissions(Path::new(RELOCATION_BASE), fs::Permissions::from_mode(0o755))?;
    }
    fs::create_dir_all(&target)?;
    check_reachable(&target, user).map_err(|_| not_reachable())?;
    fs::remove_dir(&canonical)?;
    std::os::unix::fs::symlink(&target, &canonical)?;
    Ok(target)
}

/// Every ancestor of `dir` must be searchable by `user` (others' x bit, or owned by them).
fn check_reachable(dir: &Path, user: RunAs) -> Result<(), ClusterError> {
    use std::os::unix::fs::MetadataExt;
    for ancestor in dir.ancestors().skip(1) {
        let meta = fs::metadata(ancestor)?;
        let mode = meta.mode();
        let ok = mode & 0o001 != 0
            || (meta.uid() == user.uid && mode & 0o100 != 0)
            || (meta.gid() == user.gid && mode & 0o010 != 0);
        if !ok {
            return Err(ClusterError::FolderNotReachable(dir.to_path_buf(), format!("uid {}", user.uid)));
        }
    }
    Ok(())
}

/// A cluster in a fresh temporary folder, removed again when dropped (tests, `cargo xtask test`).
pub struct TempCluster {
    pub cluster: Cluster,
    root: PathBuf,
}

impl TempCluster {
    pub fn start(prefix: &str) -> Result<TempCluster, ClusterError> {
        let root = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
        ));
        fs::create_dir_all(&root)?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
        match Cluster::start(&root.join("pg")) {
            Ok(cluster) => Ok(TempCluster { cluster, root }),
            Err(e) => {
                let _ = fs::remove_dir_all(&root);
                Err(e)
            }
        }
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        let _ = self.cluster.stop();
        let _ = fs::remove_dir_all(&self.root);
    }
}
