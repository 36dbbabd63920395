//! A webhook receiver for tests: a real HTTP server on loopback that records every POST (its
//! headers and body) and answers with scripted statuses (200 once the script is empty).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

#[derive(Default)]
struct Inbox {
    received: Vec<Received>,
    statuses: VecDeque<u16>,
}

/// A running receiver.
#[derive(Clone)]
pub struct WebhookReceiver {
    pub addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
}

impl WebhookReceiver {
    /// Start on a random loopback port.
    pub async fn start() -> WebhookReceiver {
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/{*path}", post(receive)).with_state(inbox.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        WebhookReceiver { addr, inbox }
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answer the next requests with these statuses, in order.
    pub fn answer_with(&self, statuses: impl IntoIterator<Item = u16>) {
        self.inbox.lock().unwrap().statuses.extend(statuses);
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.inbox.lock().unwrap().received.clone()
    }

    /// Wait until at least `n` requests arrived (or `timeout` passed); returns them.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let until = tokio::time::Instant::now() + timeout;
        while self.received().len() < n && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.received()
    }
}

async fn receive(
    State(inbox): State<Arc<Mutex<Inbox>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let mut inbox = inbox.lock().unwrap();
    inbox.received.push(Received { path: uri.path().to_string(), headers, body });
    inbox.statuses.pop_front().and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK)
}
