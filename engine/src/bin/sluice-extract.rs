//! The sandboxed document reader on its own, for the engine's tests and for deployments that
//! prefer a separate binary: `SLUICE_READER_LIMITS=BYTES:SECS sluice-extract [--run-as=UID:GID]
//! <pdf|text|markdown> < document` (the limits are required: a reader never runs without them).
//!
//! `sluice-extract probe <socket> <file> <tcp address> [--run-as=UID:GID] <type>` is for the
//! tests: it locks itself down exactly as a reader does, then tries to reach the database's
//! socket, a file and the network, and answers with what it managed.

use std::process::ExitCode;

use engine::documents::sandbox::{answer_text, child_main, confine, lock_down, Limits, RunAs};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run_as = args.iter().find_map(|a| a.strip_prefix("--run-as="));
    let doc_type = args.last().filter(|a| !a.starts_with("--"));
    if args.first().map(String::as_str) == Some("probe") && args.len() >= 4 {
        return probe(&args[1], &args[2], &args[3], run_as);
    }
    child_main(doc_type.map(String::as_str), run_as)
}

fn probe(socket: &str, file: &str, tcp: &str, run_as: Option<&str>) -> ExitCode {
    if !confine(Limits::DEFAULT) {
        return ExitCode::from(6);
    }
    let Ok(walls) = lock_down(run_as.and_then(RunAs::parse)) else { return ExitCode::from(6) };
    let outcome = |result: std::io::Result<()>| match result {
        Ok(()) => "reached".to_string(),
        Err(e) => format!("denied: {e}"),
    };
    let report = serde_json::json!({
        // SAFETY: plain syscall.
        "uid": unsafe { libc::getuid() },
        "landlock_abi": walls.landlock_abi,
        "seccomp": walls.seccomp,
        "socket": outcome(std::os::unix::net::UnixStream::connect(socket).map(drop)),
        "file": outcome(std::fs::read(file).map(drop)),
        "tcp": outcome(std::net::TcpStream::connect(tcp).map(drop)),
        "world_readable_file": outcome(std::fs::read("/etc/passwd").map(drop)),
        "socket_pair": outcome(std::os::unix::net::UnixStream::pair().map(drop)),
    });
    answer_text(report.to_string())
}
