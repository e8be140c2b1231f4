//! Published JavaScript Nostr libraries (nostr-tools) as clients of the
//! relay: the scripts in `tests/js/` run under Node.js, with their
//! packages installed once per test process from `tests/js/package-lock.json`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// The folder of the scripts and their `package.json`.
pub fn js_dir() -> PathBuf {
    crate::workspace_root().join("tests").join("js")
}

/// Whether Node.js and npm are here; under `CI=true` they must be.
pub fn available() -> bool {
    let present = ["node", "npm"].iter().all(|bin| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !present && std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true: the JavaScript client tests need node and npm (Debian nodejs, npm)");
    }
    present
}

/// Installs the locked packages (`npm ci`), once per test process.
fn install() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let done = DONE.get_or_init(|| {
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(js_dir())
            .output()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "npm ci in tests/js failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = done {
        panic!("{e}");
    }
}

/// Runs `node <script> <args>` in `tests/js` (packages installed first),
/// killed after `limit`; its output.
pub async fn run(script: &str, args: &[&str], limit: Duration) -> Output {
    install();
    let child = tokio::process::Command::new("node")
        .arg(script)
        .args(args)
        .current_dir(js_dir())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, child).await {
        Ok(out) => out.expect("node runs"),
        Err(_) => panic!("node {script} did not finish within {limit:?}"),
    }
}

/// axe-core's script (the accessibility rules engine, from npm, locked in
/// `tests/js`), for a page under test to run (`Browser::accessibility`).
pub fn axe_source() -> String {
    install();
    let path = js_dir().join("node_modules/axe-core/axe.min.js");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
