//! The sandboxed document reader on its own, for the engine's tests and for deployments that
//! prefer a separate binary: `SLUICE_READER_LIMITS=BYTES:SECS sluice-extract [--run-as=UID:GID]
//! <pdf|text|markdown> < document` (the limits are required: a reader never runs without them).
//!
//! `sluice-extract probe <socket> <file> <tcp address> [--run-as=UID:GID] <type>` is for the
//! tests: it locks itself down exactly as a reader does, then tries to reach the database's
//! socket, a file and the network, and answers with what it managed.

use std::process::ExitCode;

use engine::documents::ocr::reader_main;
use engine::documents::sandbox::{answer_text, confine, lock_down, Limits, RunAs};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run_as = args.iter().find_map(|a| a.strip_prefix("--run-as="));
    let doc_type = args.last().filter(|a| !a.starts_with("--"));
    if args.first().map(String::as_str) == Some("probe") && args.len() >= 4 {
        return probe(&args[1], &args[2], &args[3], run_as);
    }
    reader_main(doc_type.map(String::as_str), run_as)
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
        "io_uring": outcome(io_uring_setup()),
        "other_abi": outcome(x32_getpid()),
    });
    answer_text(report.to_string())
}

/// Ask for an io_uring (one entry); closed again if it was given.
fn io_uring_setup() -> std::io::Result<()> {
    let mut params = [0u8; 120]; // struct io_uring_params, zeroed
                                 // SAFETY: plain syscall with a buffer of the size the kernel reads.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just given to us.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// `getpid` through the x32 ABI (x86_64's other system call numbering).
fn x32_getpid() -> std::io::Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: plain syscall, no arguments.
        let pid = unsafe { libc::syscall(libc::SYS_getpid | 0x4000_0000) };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    Err(std::io::Error::from_raw_os_error(libc::EACCES))
}
