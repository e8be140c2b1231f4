//! `sqlx::migrate!` embeds the SQL files at compile time, and cargo does not
//! know they are inputs: without this, a new or changed migration is left out
//! of the binary until some Rust file of the crate changes.
//!
//! The commit the binary is built from (`RELAY_COMMIT`: `git rev-parse`,
//! `-dirty` with uncommitted changes, `unknown` outside a git checkout),
//! named by `relay --version`, `/healthz` and `relay_build_info`.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    if let Ok(head) = std::fs::read_to_string("../.git/HEAD") {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=../.git/{reference}");
        }
    }
    println!("cargo:rerun-if-changed=../.git/index");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let dirty =
                git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{hash}-dirty")
            } else {
                hash
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=RELAY_COMMIT={commit}");
}
