//! Helpers for tests and benchmarks of the HTTP layer (feature `testing`): an upload client
//! that speaks plain HTTP/1.1 over a socket, so a test can be a slow or hostile client and see
//! the answer while it is still sending.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The multipart boundary [`raw_upload`] uses.
pub const BOUNDARY: &str = "sluice-test-boundary";

/// Part headers for a `file` field named `name`.
pub fn file_part(name: &str) -> String {
    format!("Content-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/pdf")
}

/// What a raw upload got back, and how much of its body had been sent by then.
pub struct RawAnswer {
    pub status: u16,
    /// Body bytes written before the answer came.
    pub sent: usize,
    /// From the first byte written to the end of writing.
    pub took: Duration,
}

/// Upload `size` bytes of `filler` (after `head`) over a plain socket, as a slow or hostile
/// client would: the body is written in 64 KiB pieces, and the answer is read as soon as the
/// server gives one, even mid-body. Memory on this side is one piece.
pub fn raw_upload(
    addr: SocketAddr,
    token: &str,
    part_headers: &str,
    head: &[u8],
    filler: u8,
    size: usize,
) -> RawAnswer {
    let opening = format!("--{BOUNDARY}\r\n{part_headers}\r\n\r\n");
    let closing = format!("\r\n--{BOUNDARY}--\r\n");
    let length = opening.len() + size + closing.len();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let started = Instant::now();
    write!(
        stream,
        "POST /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {length}\r\n\r\n{opening}"
    )
    .unwrap();
    let piece = vec![filler; 64 * 1024];
    let mut sent = 0;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut read_some = |stream: &mut TcpStream, answer: &mut Vec<u8>| match stream.read(&mut buf) {
        Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
        _ => {}
    };
    let first = &head[..head.len().min(size)];
    let mut writing = stream.write_all(first).is_ok();
    sent += first.len();
    while writing && sent < size && answer.is_empty() {
        let n = piece.len().min(size - sent);
        writing = stream.write_all(&piece[..n]).is_ok();
        sent += n;
        read_some(&mut stream, &mut answer);
    }
    if writing && sent == size {
        let _ = stream.write_all(closing.as_bytes());
    }
    let took = started.elapsed();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let before = answer.len();
        read_some(&mut stream, &mut answer);
        if answer.len() == before {
            break;
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    RawAnswer { status, sent, took }
}
