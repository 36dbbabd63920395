//! The HTTP layer every response goes through: security headers with a per-page script nonce,
//! caching rules, compression, request ids, and a timeout for slow clients that spares uploads.

use std::io::Write;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use sqlx::PgPool;

use crate::helpers::*;
use server::testing::{file_part, multipart_type, open_upload, status_within, BOUNDARY};

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn pages_carry_a_nonce_csp_and_the_security_headers(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let page = reqwest::get(app.url("/")).await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = header(&page, "content-security-policy").to_string();
    let nonce = csp.split("'nonce-").nth(1).and_then(|s| s.split('\'').next()).expect("a nonce in the page's CSP");
    assert!(nonce.len() >= 16, "a real nonce: {nonce}");
    assert!(csp.contains("script-src 'self' 'nonce-") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).unwrap();
    assert!(!script_src.contains("unsafe-inline"), "no inline scripts but the nonce's: {csp}");
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
    assert_eq!(header(&page, "referrer-policy"), "same-origin");
    assert_eq!(header(&page, "x-frame-options"), "DENY");
    assert_eq!(header(&page, "cache-control"), "no-store", "pages are never cached");
    assert!(uuid::Uuid::parse_str(header(&page, "x-request-id")).is_ok(), "each request gets an id");
    let nonce = nonce.to_string();
    let body = page.text().await.unwrap();
    assert!(body.contains(&format!("nonce=\"{nonce}\"")), "the hydration script carries the header's nonce");

    // A second page gets another nonce; a request id sent by a proxy is kept.
    let again = reqwest::Client::new().get(app.url("/")).header("x-request-id", "from-the-proxy").send().await.unwrap();
    assert!(!header(&again, "content-security-policy").contains(&nonce), "nonces are not reused");
    assert_eq!(header(&again, "x-request-id"), "from-the-proxy");
    let forged = reqwest::Client::new().get(app.url("/")).header("x-request-id", "x".repeat(500)).send().await.unwrap();
    assert!(uuid::Uuid::parse_str(header(&forged, "x-request-id")).is_ok(), "an unusable id is replaced");

    // API answers get the strict policy and are not stored either.
    let api = reqwest::get(app.url("/api/v1/jobs/00000000-0000-0000-0000-000000000000")).await.unwrap();
    assert!(header(&api, "content-security-policy").starts_with("default-src 'none'"));
    assert_eq!(header(&api, "x-content-type-options"), "nosniff");
    assert_eq!(header(&api, "cache-control"), "no-store");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn answers_are_compressed_for_clients_that_accept_it(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let client = reqwest::Client::new();
    for encoding in ["br", "gzip"] {
        let page = client.get(app.url("/")).header("accept-encoding", encoding).send().await.unwrap();
        assert_eq!(header(&page, "content-encoding"), encoding);
    }
    let plain = client.get(app.url("/")).send().await.unwrap();
    assert_eq!(header(&plain, "content-encoding"), "", "no encoding the client did not ask for");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_slow_client_times_out_but_a_slow_upload_does_not(pool: PgPool) {
    let settings = WebSettings { request_timeout: Duration::from_secs(1), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("slow@example.com", 5, 5).await;
    let addr = app.addr;
    tokio::task::spawn_blocking(move || {
        // A log-in whose body never comes: 408 after the timeout, not a held connection.
        let started = Instant::now();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "POST /api/log_in HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nemail="
        )
        .unwrap();
        assert_eq!(status_within(&mut stream, Duration::from_secs(20)), 408);
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

        // An upload that takes longer than the timeout is still accepted.
        let opening =
            format!("--{BOUNDARY}\r\n{}\r\n\r\n", file_part("slow.txt").replace("application/pdf", "text/plain"));
        let content = b"a document that arrives slowly\n";
        let closing = format!("\r\n--{BOUNDARY}--\r\n");
        let length = opening.len() + content.len() + closing.len();
        let mut upload = open_upload(addr, &token, &multipart_type(), length, opening.as_bytes());
        std::thread::sleep(Duration::from_millis(1500));
        upload.write_all(content).unwrap();
        upload.write_all(closing.as_bytes()).unwrap();
        assert_eq!(
            status_within(&mut upload, Duration::from_secs(20)),
            202,
            "uploads are bounded by their own idle timeout instead"
        );
    })
    .await
    .unwrap();
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn every_body_is_bounded_before_credentials_are_read(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let addr = app.addr;
    // A 1 GB JSON body with no token: refused from its declared length, unread.
    let declared = tokio::task::spawn_blocking(move || {
        let head = format!(
            "PUT /api/v1/webhook HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
        );
        server::testing::send_body(std::net::TcpStream::connect(addr).unwrap(), Instant::now(), head.as_bytes(), b' ', 1 << 30, b"")
    })
    .await
    .unwrap();
    assert_eq!(declared.status, 413);
    assert!(declared.sent < 8 << 20, "answered before the body was read ({} bytes sent)", declared.sent);
    // The same without a length (chunked): refused once 64 KiB have come, not after the gigabyte.
    let chunked = tokio::task::spawn_blocking(move || {
        let head = format!(
            "PUT /api/v1/webhook HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n"
        );
        server::testing::send_body(std::net::TcpStream::connect(addr).unwrap(), Instant::now(), head.as_bytes(), b' ', 1 << 30, b"\r\n0\r\n\r\n")
    })
    .await
    .unwrap();
    assert_eq!(chunked.status, 413);
    assert!(chunked.sent < 8 << 20, "{} bytes sent", chunked.sent);

    // A server function given more than a form takes: 413 in our words, not 500.
    let client = reqwest::Client::new();
    let big = client
        .post(app.url("/api/log_in"))
        .header("Origin", format!("http://{addr}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("email=a%40example.com&password={}", "x".repeat(100_000)))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let body: serde_json::Value = big.json().await.unwrap();
    assert_eq!(body["error"], "body_too_large");
    assert!(body["message"].as_str().unwrap().contains("65536 bytes"), "{body}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_server_functions_bad_arguments_are_the_clients_fault_not_ours(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let client = reqwest::Client::new();
    let overflow = call(&client, &app, "list_jobs", &[("page", "99999999999999999999")]).await;
    assert_eq!(overflow.status(), 400, "{:?}", overflow.text().await);
    let missing = call(&client, &app, "cancel_job", &[]).await;
    assert_eq!(missing.status(), 400);
    let text = missing.text().await.unwrap();
    assert!(text.contains("server_fn") && text.contains("`id`"), "the error says what is wrong: {text}");
    // A password longer than any account's is wrong at once (no hashing of a huge input).
    let long = call(&client, &app, "log_in", &[("email", "a@example.com"), ("password", &"p".repeat(5_000))]).await;
    assert_eq!(long.status(), 401);
}

/// Whether the server has closed `stream` (EOF or reset), reading whatever it sent first.
fn closed_by_server(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn half_open_and_idle_connections_are_dropped_while_honest_requests_are_served(pool: PgPool) {
    let settings = WebSettings {
        header_read_timeout: Duration::from_secs(2),
        max_connections: 1_200,
        max_connections_per_address: 1_200,
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let addr = app.addr;
    // 1,000 connections that send half a request head and then nothing.
    let mut held: Vec<std::net::TcpStream> = tokio::task::spawn_blocking(move || {
        (0..1_000)
            .map(|_| {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.write_all(b"GET / HTTP/1.1\r\nHost: sluice\r\nX-Slow: ").unwrap();
                stream
            })
            .collect()
    })
    .await
    .unwrap();
    // And one that finishes a request, then sits idle on its kept-alive connection (blocking
    // reads off the runtime's thread, which serves the app too).
    let (mut idle, status) = tokio::task::spawn_blocking(move || {
        let mut idle = std::net::TcpStream::connect(addr).unwrap();
        idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).unwrap();
        let status = status_within(&mut idle, Duration::from_secs(5));
        (idle, status)
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    // Honest requests are served throughout.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let answer = reqwest::get(app.url("/healthz")).await.unwrap();
        assert_eq!(answer.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (closed, idle_closed) = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(1));
        (held.iter_mut().map(closed_by_server).filter(|closed| *closed).count(), closed_by_server(&mut idle))
    })
    .await
    .unwrap();
    assert_eq!(closed, 1_000, "every half-open connection is dropped after the header-read timeout");
    assert!(idle_closed, "an idle kept-alive connection is dropped too");
    assert_eq!(reqwest::get(app.url("/healthz")).await.unwrap().status(), 200);
}

/// A request on a new connection (from `from`, when given): the whole answer.
async fn ask_on_new_connection(addr: std::net::SocketAddr, from: Option<std::net::IpAddr>, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(ip) = from {
        socket.bind(std::net::SocketAddr::new(ip, 0)).unwrap();
    }
    let mut stream = socket.connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    read.expect("answered and closed within 5 s").expect("the answer reads");
    String::from_utf8_lossy(&answer).into_owned()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn past_the_connection_cap_a_new_connection_is_refused_clearly_and_health_is_still_served(pool: PgPool) {
    let settings = WebSettings { max_connections: 20, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let held: Vec<_> = (0..20).map(|_| std::net::TcpStream::connect(app.addr).unwrap()).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = ask_on_new_connection(app.addr, None, "/api/v1/jobs").await;
    assert!(answer.starts_with("HTTP/1.1 503 ") && answer.to_lowercase().contains("retry-after: 5"), "{answer}");
    assert!(answer.contains("too many connections"), "{answer}");
    let health = ask_on_new_connection(app.addr, None, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200 "), "a health check is answered past the cap: {health}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(reqwest::get(app.url("/healthz")).await.unwrap().status(), 200, "served again once they close");
}

/// One host cannot hold every connection: past its address's share its new connections get
/// 503 (health checks still answered), while another address is served as usual.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn one_address_holds_at_most_its_share_of_connections(pool: PgPool) {
    let settings = WebSettings { max_connections: 1_000, max_connections_per_address: 10, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let held: Vec<_> = (0..10).map(|_| std::net::TcpStream::connect(app.addr).unwrap()).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = "/api/v1/jobs/00000000-0000-0000-0000-000000000000";
    let refused = ask_on_new_connection(app.addr, None, job).await;
    assert!(refused.starts_with("HTTP/1.1 503 ") && refused.to_lowercase().contains("retry-after: 5"), "{refused}");
    let health = ask_on_new_connection(app.addr, None, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
    // Another address (loopback has them all) is not bound by this one's share.
    let other = ask_on_new_connection(app.addr, Some("127.0.0.2".parse().unwrap()), job).await;
    assert!(other.starts_with("HTTP/1.1 401 "), "served (and asked to log in): {other}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = ask_on_new_connection(app.addr, None, job).await;
    assert!(again.starts_with("HTTP/1.1 401 "), "its share is back once they close: {again}");
}

/// A download's minimum rate: a reader that stops, or trickles, has its connection closed
/// mid-answer once it takes less than 16 KiB in the stalled-write timeout; an honest one gets
/// every byte.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_reader_that_stalls_or_trickles_a_download_is_cut_off_and_an_honest_one_is_not(pool: PgPool) {
    let settings = WebSettings { stalled_write_timeout: Duration::from_secs(1), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("reader@example.com", 50, 5).await;
    const SIZE: usize = 24 << 20;
    let text = "A line of an honest document.\n".repeat(SIZE / 30 + 1).into_bytes();
    let uploaded: serde_json::Value = app.upload(&token, text, None).await.json().await.unwrap();
    let path = format!("/api/v1/jobs/{}/original", uploaded["id"].as_str().unwrap());

    let honest = reqwest::Client::new().get(app.url(&path)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(honest.status(), 200);
    let whole = honest.bytes().await.unwrap().len();
    assert!(whole >= SIZE, "the honest reader gets it all ({whole} bytes)");

    // Each reader reads `pace` (bytes, every 200 ms) for 4 s, then drains as fast as it can.
    let addr = app.addr;
    for pace in [0usize, 2048] {
        let (token, path) = (token.clone(), path.clone());
        let (got, took) = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n").unwrap();
            let started = Instant::now();
            let mut got = 0;
            let mut buf = vec![0u8; 64 * 1024];
            while started.elapsed() < Duration::from_secs(4) {
                if pace > 0 {
                    got += stream.read(&mut buf[..pace]).unwrap_or(0);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            (got, started.elapsed())
        })
        .await
        .unwrap();
        assert!(got < SIZE, "pace {pace}: cut off mid-answer ({got} of {SIZE} bytes)");
        assert!(took < Duration::from_secs(30), "pace {pace}: {took:?}");
    }
    assert_eq!(reqwest::get(app.url("/healthz")).await.unwrap().status(), 200);
}

/// Cleartext HTTP/2 is not spoken (its flow control would let a client stall answers past the
/// bounds): a prior-knowledge HTTP/2 preface gets an HTTP/1.1 refusal, not a SETTINGS frame.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn cleartext_http2_is_not_spoken(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let addr = app.addr;
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).unwrap_or(0);
        buf[..n].to_vec()
    })
    .await
    .unwrap();
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 4") || answer.starts_with(b"HTTP/1.1 5"), "{answer:?}");
    assert_eq!(reqwest::get(app.url("/healthz")).await.unwrap().status(), 200);
}

/// A connection from `from` that sends nothing (it holds its place until the server gives up on it).
async fn idle_connection(addr: std::net::SocketAddr, from: std::net::IpAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Issue 55, item 4: the health lane is shared by network (an IPv4 /24), and a part of it is
/// kept for networks that hold no connection: sites already holding connections cannot fill
/// it, so a newcomer's health check is answered however the rest is used. (IPv6 /48 and /64
/// shares are the same code over other subjects: `shares.rs` tests them.)
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_health_lane_is_shared_by_network_and_keeps_room_for_newcomers(pool: PgPool) {
    let settings = WebSettings { max_connections: 13, max_connections_per_address: 1, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let ip = |net: u8, host: u8| std::net::IpAddr::from([127, 0, net, host]);
    // Thirteen sites hold a connection each: every connection is taken.
    let mut held = Vec::new();
    for net in 1..=13 {
        held.push(idle_connection(app.addr, ip(net, 1)).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Twelve of them fill what the lane lets holders take (4 a network, 48 in all).
    for net in 1..=12 {
        for _ in 0..4 {
            held.push(idle_connection(app.addr, ip(net, 1)).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let from_full_network = ask_on_new_connection(app.addr, Some(ip(1, 2)), "/healthz").await;
    assert!(from_full_network.starts_with("HTTP/1.1 503 "), "a /24's share of the lane is 4: {from_full_network}");
    let holder = ask_on_new_connection(app.addr, Some(ip(13, 1)), "/healthz").await;
    assert!(holder.starts_with("HTTP/1.1 503 "), "holders cannot take the newcomers' room: {holder}");
    let newcomer = ask_on_new_connection(app.addr, Some(ip(14, 1)), "/healthz").await;
    assert!(newcomer.starts_with("HTTP/1.1 200 "), "a newcomer's health check is answered: {newcomer}");
    drop(held);
}

/// Issue 55, item 4: behind a trusted proxy, each request counts against the share of the
/// client it was forwarded for: one client cannot take every request slot through the proxy,
/// and another client is served meanwhile.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn behind_a_trusted_proxy_the_shares_hold_for_the_forwarded_client(pool: PgPool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let settings = WebSettings {
        max_connections_per_address: 1,
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let addr = app.addr;
    // A request from 203.0.113.5 whose body is slow to come: it holds its client's share.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/sign_up HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nX-Forwarded-For: 203.0.113.5\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nemail="
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ask = |client: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET /api/v1/jobs/00000000-0000-4000-8000-000000000000 HTTP/1.1\r\nHost: {addr}\r\n\
             X-Forwarded-For: {client}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await.unwrap().unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    };
    let same = ask("203.0.113.5").await;
    assert!(same.starts_with("HTTP/1.1 503 ") && same.contains("too many connections"), "{same}");
    let other = ask("203.0.113.6").await;
    assert!(other.starts_with("HTTP/1.1 401 "), "another client is served: {other}");
    drop(slow);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = ask("203.0.113.5").await;
    assert!(again.starts_with("HTTP/1.1 401 "), "its share is back once its request ended: {again}");
}
