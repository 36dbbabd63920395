//! A real SMTP server on loopback for the mail tests (mailin-embedded): what arrives is kept in
//! memory, read by the test in-process or, for the browser suite, over HTTP (`GET /messages`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mailin_embedded::{response, Handler, Response, Server};
use serde::Serialize;

/// One mail as it arrived.
#[derive(Clone, Debug, Serialize)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    /// The message as sent (headers and body).
    pub raw: String,
}

impl Mail {
    /// A header's value (the first with that name, unfolded), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.raw.split("\r\n\r\n").next().unwrap_or("");
        let mut found: Option<String> = None;
        for line in head.split("\r\n") {
            if line.starts_with([' ', '\t']) {
                if let Some(value) = found.as_mut() {
                    value.push_str(line.trim_start());
                    continue;
                }
            } else if found.is_some() {
                break;
            }
            if let Some((key, value)) = line.split_once(':') {
                if key.eq_ignore_ascii_case(name) {
                    found = Some(value.trim().to_string());
                }
            }
        }
        found
    }

    pub fn subject(&self) -> String {
        self.header("Subject").unwrap_or_default()
    }

    /// The body as text (quoted-printable decoded when so encoded).
    pub fn text(&self) -> String {
        let body = self.raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let quoted =
            self.header("Content-Transfer-Encoding").is_some_and(|e| e.eq_ignore_ascii_case("quoted-printable"));
        if quoted {
            decode_quoted_printable(body)
        } else {
            body.to_string()
        }
    }

    /// The first link in the body that starts with `prefix`.
    pub fn link(&self, prefix: &str) -> Option<String> {
        let text = self.text();
        let start = text.find(prefix)?;
        Some(text[start..].split_whitespace().next().unwrap_or("").to_string())
    }
}

/// Pure: quoted-printable (RFC 2045) to text: soft line breaks joined, `=XX` decoded.
pub fn decode_quoted_printable(body: &str) -> String {
    let joined = body.replace("=\r\n", "").replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(&joined[i + 1..i + 3], 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Clone)]
struct Collector {
    arrived: Arc<Mutex<Vec<Mail>>>,
    from: String,
    to: Vec<String>,
    data: Vec<u8>,
}

impl Handler for Collector {
    fn data_start(&mut self, _domain: &str, from: &str, _is8bit: bool, to: &[String]) -> Response {
        self.from = from.to_string();
        self.to = to.to_vec();
        self.data.clear();
        response::OK
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.data.extend_from_slice(buf);
        Ok(())
    }

    fn data_end(&mut self) -> Response {
        let raw = String::from_utf8_lossy(&self.data).into_owned();
        let mail = Mail { from: std::mem::take(&mut self.from), to: std::mem::take(&mut self.to), raw };
        self.arrived.lock().unwrap().push(mail);
        response::OK
    }

    fn helo(&mut self, _ip: IpAddr, _domain: &str) -> Response {
        response::OK
    }
}

/// The SMTP server, running on its own threads until the process ends.
#[derive(Clone)]
pub struct MailServer {
    addr: SocketAddr,
    arrived: Arc<Mutex<Vec<Mail>>>,
}

impl MailServer {
    /// Listen on a free loopback port.
    pub fn start() -> MailServer {
        MailServer::start_on("127.0.0.1:0".parse().unwrap())
    }

    pub fn start_on(addr: SocketAddr) -> MailServer {
        let listener = TcpListener::bind(addr).expect("binding the SMTP port");
        let addr = listener.local_addr().unwrap();
        let arrived = Arc::new(Mutex::new(Vec::new()));
        let collector = Collector { arrived: arrived.clone(), from: String::new(), to: Vec::new(), data: Vec::new() };
        let mut server = Server::new(collector);
        server.with_name("mailbox.test").with_num_threads(4).with_tcp_listener(listener);
        std::thread::spawn(move || {
            if let Err(e) = server.serve() {
                eprintln!("the SMTP server stopped: {e}");
            }
        });
        MailServer { addr, arrived }
    }

    /// `smtp://127.0.0.1:PORT` (no TLS: loopback only).
    pub fn smtp_url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// Everything that arrived, oldest first.
    pub fn mails(&self) -> Vec<Mail> {
        self.arrived.lock().unwrap().clone()
    }

    /// Mails to `address`, oldest first.
    pub fn mails_to(&self, address: &str) -> Vec<Mail> {
        self.mails().into_iter().filter(|m| m.to.iter().any(|t| t.eq_ignore_ascii_case(address))).collect()
    }

    /// Wait (up to `timeout`) until `n` mails to `address` have arrived; returns them.
    pub async fn wait_for(&self, address: &str, n: usize, timeout: Duration) -> Vec<Mail> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mails = self.mails_to(address);
            if mails.len() >= n || tokio::time::Instant::now() >= deadline {
                return mails;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Serve what arrived over HTTP on `addr`: `GET /messages[?to=ADDRESS]`, each with its
    /// subject, decoded text and headers of interest.
    pub async fn serve_http(&self, addr: SocketAddr) -> SocketAddr {
        use axum::extract::{Query, State};
        let listener = tokio::net::TcpListener::bind(addr).await.expect("binding the mailbox's HTTP port");
        let bound = listener.local_addr().unwrap();
        async fn messages(
            State(server): State<MailServer>,
            Query(query): Query<HashMap<String, String>>,
        ) -> axum::Json<Vec<serde_json::Value>> {
            let mails = match query.get("to") {
                Some(to) => server.mails_to(to),
                None => server.mails(),
            };
            axum::Json(
                mails
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "from": m.from, "to": m.to, "subject": m.subject(), "text": m.text(),
                            "list_unsubscribe": m.header("List-Unsubscribe"),
                        })
                    })
                    .collect(),
            )
        }
        let app = axum::Router::new().route("/messages", axum::routing::get(messages)).with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::decode_quoted_printable;

    #[test]
    fn quoted_printable_reads_back() {
        assert_eq!(decode_quoted_printable("https://x/reset?token=3Dab=\r\ncd"), "https://x/reset?token=abcd");
        assert_eq!(decode_quoted_printable("caf=C3=A9 ="), "café =");
    }
}
