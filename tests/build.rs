//! Whether this machine runs the PostgreSQL tests: under `CI=true` always
//! (a missing PostgreSQL then fails them), elsewhere when PostgreSQL's
//! binaries are found (`PG_BIN`, or `/usr/lib/postgresql/<version>/bin`).
//! Without them, each PostgreSQL test is compiled `#[ignore]` with the
//! reason, so `cargo test` reports it ignored instead of passed.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(postgres_tests)");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-env-changed=PG_BIN");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if ci || installed() {
        println!("cargo::rustc-cfg=postgres_tests");
    }
}

fn installed() -> bool {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Path::new(&dir).join("initdb").exists();
    }
    let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") else {
        return false;
    };
    versions
        .filter_map(Result::ok)
        .any(|v| v.path().join("bin/initdb").exists())
}
