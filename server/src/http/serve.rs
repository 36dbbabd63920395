//! Serving connections with bounds a stranger cannot stretch: a request's headers must arrive
//! within `header_read_timeout` (also the longest a kept-alive connection may sit idle), and
//! at most `max_connections` are open at once; past that a new one is answered 503 at once and
//! closed. hyper's own settings, not a hand-written loop over the bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// How connections are bounded.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// The most time a request's head may take to arrive, and a kept-alive connection may sit
    /// idle between requests.
    pub header_read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// How long shutdown waits for open connections to finish their requests.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 4096,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: application/json\r\n\
Connection: close\r\nContent-Length: 82\r\n\r\n\
{\"error\":\"overloaded\",\"message\":\"too many connections are open; try again in 5 s\"}";

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting and give open
/// connections `shutdown_grace` to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = router.clone().map_request(move |mut request: axum::extract::Request<_>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        });
        let service = TowerToHyperService::new(service);
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections were still open at the end of the shutdown grace");
    }
    Ok(())
}

/// A clear refusal for a connection over the cap: 503 with `Retry-After`, then close.
async fn refuse(mut stream: tokio::net::TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(REFUSAL)).await;
    let _ = stream.shutdown().await;
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
