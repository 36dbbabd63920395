//! Helpers for tests and benchmarks of the HTTP layer (feature `testing`): an upload client
//! that speaks plain HTTP/1.1 over a socket, so a test can be a slow or hostile client and see
//! the answer while it is still sending.

pub mod contract;

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

/// Start a `POST /api/v1/jobs` of `length` body bytes and send the request head and
/// `opening`; the caller decides how much more to send (nothing, to hold the upload open).
pub fn open_upload(addr: SocketAddr, token: &str, content_type: &str, length: usize, opening: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    )
    .unwrap();
    stream.write_all(opening).unwrap();
    stream
}

/// The status of whatever the server answers on `stream` within `wait` (0 if nothing came).
pub fn status_within(stream: &mut TcpStream, wait: Duration) -> u16 {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&answer).split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The multipart content type [`raw_upload`] sends.
pub fn multipart_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// Upload `size` bytes of `filler` (after `head`) over a plain socket, as a slow or hostile
/// client would: see [`send_body`].
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
    let started = Instant::now();
    let stream = open_upload(addr, token, &multipart_type(), length, opening.as_bytes());
    send_body(stream, started, head, filler, size, closing.as_bytes())
}

/// Send `head`, then `filler` up to `size` bytes in 64 KiB pieces, then `closing`, reading the
/// answer as soon as the server gives one, even mid-body. Memory on this side is one piece.
pub fn send_body(
    mut stream: TcpStream,
    started: Instant,
    head: &[u8],
    filler: u8,
    size: usize,
    closing: &[u8],
) -> RawAnswer {
    stream.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
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
        let _ = stream.write_all(closing);
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
