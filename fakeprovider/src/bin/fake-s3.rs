//! A local S3-compatible server to try Sluice's multi-process topology on one machine:
//! `cargo run -p fakeprovider --features s3 --bin fake-s3`. Prints the variables the `server`
//! processes need, then serves until Ctrl-C (its folder is removed then). For trying, not for
//! production: use S3 or MinIO there.

#[tokio::main]
async fn main() {
    let s3 = fakeprovider::s3::S3Server::start("sluice-documents").await;
    println!("An S3-compatible store is listening at http://{}. For every server process:\n", s3.addr);
    for (key, value) in s3.options() {
        println!("export {}={value}", key.to_uppercase());
    }
    println!("export SLUICE_BLOB_STORE={}", s3.url("sluice"));
    tokio::signal::ctrl_c().await.ok();
}
