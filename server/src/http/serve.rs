//! Serving connections with bounds a stranger cannot stretch: a request's headers must arrive
//! within `header_read_timeout` (also the longest a kept-alive connection may sit idle), and
//! at most `max_connections` are open at once, `max_connections_per_address` of them from one
//! client site (an IPv4 address; an IPv6 /48, of which one /64 may hold a quarter: see
//! [`super::shares`]). A trusted proxy's connections are not bound by it; its requests are,
//! by the client address it forwarded for. Past either cap, a new connection goes to the
//! health lane ([`HEALTH_LANE`] connections at most, 4 from one network, 16 of them kept for
//! networks that hold no connection; one request each): `/healthz` is answered there,
//! anything else 503 with `Retry-After`; past that lane too, 503 at once and closed.
//! hyper's own settings, not a hand-written loop over the bytes.
//!
//! Answers are bounded the other way too: while an answer waits to be written, the client must
//! take at least [`MIN_PROGRESS`] bytes every `stalled_write_timeout` (nginx's `send_timeout`,
//! with a floor on progress), or the connection is closed. A reader that stops, or trickles a
//! 50 MiB download at a few bytes a second, holds a connection and a blob stream for seconds,
//! not for ever.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::shares::{connection_shares, holder_of, lane_share, LANE_KEPT_FOR_NEWCOMERS};
use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// How connections are bounded.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// The most time a request's head may take to arrive, and a kept-alive connection may sit
    /// idle between requests.
    pub header_read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv4, IPv6 /64).
    pub max_connections_per_address: usize,
    /// Peers that are proxies: the clients behind them are many, so no per-address share.
    pub trusted_proxies: Arc<[IpAddr]>,
    /// While an answer waits to be written, the client must take [`MIN_PROGRESS`] bytes within
    /// this, or the connection is closed.
    pub stalled_write_timeout: Duration,
    /// How long shutdown waits for open connections to finish their requests.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 4096,
            max_connections_per_address: 256,
            trusted_proxies: Arc::from([]),
            stalled_write_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: application/json\r\n\
Connection: close\r\nContent-Length: 82\r\n\r\n\
{\"error\":\"overloaded\",\"message\":\"too many connections are open; try again in 5 s\"}";

/// Connections over a cap that may still ask for `/healthz` at once: one request each, with a
/// head due within [`HEALTH_LANE_HEAD`].
pub const HEALTH_LANE: usize = 64;
const HEALTH_LANE_HEAD: Duration = Duration::from_secs(2);

/// Connections open per client address; a share dropped gives its place back.
#[derive(Default)]
struct AddressShares {
    open: std::sync::Mutex<HashMap<String, usize>>,
}

/// One connection's place in its address's share.
struct AddressShare {
    shares: Arc<AddressShares>,
    subject: String,
}

impl AddressShares {
    /// A place in each of `shares` (subject, cap), or none if any is full.
    fn take_all(self: &Arc<Self>, shares: Vec<(String, usize)>) -> Option<Vec<AddressShare>> {
        let mut taken = Vec::with_capacity(shares.len());
        for (subject, cap) in shares {
            // Dropping what was taken gives it back.
            taken.push(self.take(subject, cap)?);
        }
        Some(taken)
    }

    /// How many places `subject` holds.
    fn held(&self, subject: &str) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).get(subject).copied().unwrap_or(0)
    }

    /// A place for a connection from `subject`, unless it already holds `limit`.
    fn take(self: &Arc<Self>, subject: String, limit: usize) -> Option<AddressShare> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.entry(subject.clone()).or_default();
        if *held >= limit {
            return None;
        }
        *held += 1;
        Some(AddressShare { shares: self.clone(), subject })
    }
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        let mut open = self.shares.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = open.get_mut(&self.subject) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.subject);
            }
        }
    }
}

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting and give open
/// connections `shutdown_grace` to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    // HTTP/1.1 only: browsers speak HTTP/2 only over TLS, which a proxy in front terminates,
    // and cleartext HTTP/2 would let a client stall answers by flow control, past the bounds.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let mut lane = Builder::new(TokioExecutor::new()).http1_only();
    lane.http1().timer(TokioTimer::new()).header_read_timeout(HEALTH_LANE_HEAD).keep_alive(false);
    let lane = Arc::new(lane);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let lane = Lane {
        builder: lane,
        open: Arc::new(Semaphore::new(HEALTH_LANE)),
        for_holders: Arc::new(Semaphore::new(HEALTH_LANE - LANE_KEPT_FOR_NEWCOMERS)),
        shares: Arc::new(AddressShares::default()),
    };
    let shares = Arc::new(AddressShares::default());
    let per_address = limits.max_connections_per_address.max(1);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let proxy = limits.trusted_proxies.contains(&peer.ip().to_canonical());
        let holds_any = shares.held(&holder_of(peer.ip(), per_address)) > 0;
        let share = if proxy {
            None
        } else {
            match shares.take_all(connection_shares(peer.ip(), per_address)) {
                Some(share) => Some(share),
                None => {
                    health_lane(stream, peer, &router, &lane, holds_any);
                    continue;
                }
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            health_lane(stream, peer, &router, &lane, holds_any);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Behind a trusted proxy, each request holds its forwarded client's shares instead.
        let forwarded = proxy.then(|| (shares.clone(), limits.trusted_proxies.clone()));
        let router = router.clone();
        let service = tower::service_fn(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            let held = match &forwarded {
                None => Ok(None),
                Some((shares, trusted)) => {
                    let client = app::server::session::client_ip_of(peer, request.headers(), trusted);
                    shares.take_all(connection_shares(client, per_address)).map(Some).ok_or(())
                }
            };
            async move {
                let Ok(held) = held else { return Ok(overloaded()) };
                let answer = router.oneshot(request.map(axum::body::Body::new)).await;
                Ok::<_, std::convert::Infallible>(match (answer, held) {
                    (Ok(response), Some(held)) => response.map(|body| holding_while_sent(body, held)),
                    (Ok(response), None) => response,
                    (Err(never), _) => match never {},
                })
            }
        });
        let service = TowerToHyperService::new(service);
        let stream = ProgressBound::new(stream, limits.stalled_write_timeout);
        let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop((permit, share));
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections were still open at the end of the shutdown grace");
    }
    Ok(())
}

/// A connection over a cap: `/healthz` is answered (a health check must not fail because
/// one host holds every connection), anything else 503 with `Retry-After`; one request, then
/// closed. With the lane full too, refused at once.
fn health_lane(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    router: &Router,
    lane: &Lane,
    holds_any: bool,
) {
    let (subject, cap) = lane_share(peer.ip());
    let share = lane.shares.take(subject, cap);
    // A network already holding connections takes the lane's room only from what is not kept
    // for newcomers.
    let holders_room = if holds_any { lane.for_holders.clone().try_acquire_owned().map(Some) } else { Ok(None) };
    let (Some(share), Ok(room), Ok(permit)) = (share, holders_room, lane.open.clone().try_acquire_owned()) else {
        tokio::spawn(refuse(stream));
        return;
    };
    let router = router.clone();
    let service = tower::service_fn(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
        let router = router.clone();
        async move {
            if request.uri().path() == "/healthz" {
                request.extensions_mut().insert(ConnectInfo(peer));
                router.oneshot(request.map(axum::body::Body::new)).await
            } else {
                Ok(overloaded())
            }
        }
    });
    let connection =
        lane.builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)).into_owned();
    tokio::spawn(async move {
        // One request: its head within the lane's limit, its answer soon after.
        let _ = tokio::time::timeout(HEALTH_LANE_HEAD * 3, connection).await;
        drop((permit, room, share));
    });
}

/// The health lane: its connections, the part of them networks already holding connections
/// may take, and what each network holds of it.
struct Lane {
    builder: Arc<Builder<TokioExecutor>>,
    open: Arc<Semaphore>,
    for_holders: Arc<Semaphore>,
    shares: Arc<AddressShares>,
}

/// `body`, keeping `held` (a forwarded client's shares) until it is sent or dropped: a slow
/// download holds its client's share as long as it runs, not only while its handler did.
fn holding_while_sent(body: axum::body::Body, held: Vec<AddressShare>) -> axum::body::Body {
    use futures::StreamExt;
    axum::body::Body::from_stream(body.into_data_stream().map(move |chunk| {
        let _still_held = &held;
        chunk
    }))
}

/// The answer to a request over a connection cap.
fn overloaded() -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = axum::Json(serde_json::json!({
        "error": "overloaded",
        "message": "too many connections are open from your address or in all; try again in 5 s",
    }));
    (axum::http::StatusCode::SERVICE_UNAVAILABLE, [(axum::http::header::RETRY_AFTER, "5")], body).into_response()
}

/// A clear refusal for a connection over the cap: 503 with `Retry-After`, then close.
async fn refuse(mut stream: tokio::net::TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(REFUSAL)).await;
    let _ = stream.shutdown().await;
}

/// What a client must take, per `stalled_write_timeout`, of an answer waiting for it.
pub const MIN_PROGRESS: usize = 16 * 1024;

/// A connection whose writes must make progress: once a write has to wait for the client, a
/// clock starts; [`MIN_PROGRESS`] bytes written stop it; if it runs out first, the write fails
/// (hyper then closes the connection). Time with nothing to write never counts.
struct ProgressBound<S> {
    inner: S,
    timeout: Duration,
    /// Armed at the first write that waited: the deadline, and the bytes written since.
    waiting: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

impl<S> ProgressBound<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        ProgressBound { inner, timeout, waiting: None }
    }

    fn on_write(&mut self, cx: &mut Context<'_>, result: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        match result {
            Poll::Ready(Ok(n)) => {
                if let Some((_, taken)) = &mut self.waiting {
                    *taken += n;
                    if *taken >= MIN_PROGRESS {
                        self.waiting = None;
                    }
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let (deadline, _) = self.waiting.get_or_insert_with(|| (Box::pin(tokio::time::sleep(timeout)), 0));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client takes the answer too slowly",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ProgressBound<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ProgressBound<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.on_write(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.on_write(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            // Everything is written: nothing waits for the client, so no clock runs.
            self.waiting = None;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::REFUSAL;

    #[test]
    fn the_refusal_is_a_whole_http_answer() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
        assert_eq!(body.len(), length);
        assert!(head.starts_with("HTTP/1.1 503 ") && head.contains("Retry-After: 5"));
    }
}
