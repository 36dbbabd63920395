//! The sandboxed document reader on its own, for the engine's tests and for deployments that
//! prefer a separate binary: `sluice-extract <pdf|text|markdown> < document`.

fn main() -> std::process::ExitCode {
    engine::documents::sandbox::child_main(std::env::args().nth(1).as_deref())
}
