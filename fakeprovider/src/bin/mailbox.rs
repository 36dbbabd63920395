//! A loopback SMTP server whose mail can be read over HTTP, for the browser suite:
//! `mailbox SMTP_ADDR HTTP_ADDR`; prints `smtp on ADDR, http on ADDR` once ready.

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let smtp = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let http = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let server = fakeprovider::mailbox::MailServer::start_on(smtp.parse().expect("an address like 127.0.0.1:2525"));
    let bound = server.serve_http(http.parse().expect("an address like 127.0.0.1:2580")).await;
    println!("{}, http on {bound}", server.smtp_url());
    tokio::signal::ctrl_c().await.ok();
}
