// `sqlx::migrate!` embeds the migrations at compile time; without this, editing or adding one
// would not rebuild the crate (stable Rust has no tracked paths for proc macros).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
