//! `sqlx::migrate!` embeds the SQL files at compile time, and cargo does not
//! know they are inputs: without this, a new or changed migration is left out
//! of the binary until some Rust file of the crate changes.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
