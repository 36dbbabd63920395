//! Run the fake provider as its own process: `fakeprovider [ADDR]` (default 127.0.0.1:0);
//! prints `listening on http://ADDR` once ready.

#[tokio::main]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    let fake = fakeprovider::FakeProvider::start_on(addr.parse().expect("an address like 127.0.0.1:4010")).await;
    // How long its batches take (`FAKE_BATCH_DELAY_MS`), for flows that watch one wait.
    if let Some(ms) = std::env::var("FAKE_BATCH_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
        let delay = std::time::Duration::from_millis(ms);
        fake.batch_timing(fakeprovider::BatchTiming { delay, window: delay * 10 });
    }
    println!("listening on {}", fake.base_url());
    tokio::signal::ctrl_c().await.ok();
}
