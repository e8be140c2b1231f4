//! Test harness: starts real relay processes and talks to them over real
//! sockets. Every integration test in `tests/tests/` is built on this.

pub mod agent;
pub mod browser;
pub mod client;
pub mod hooks;
pub mod metrics;
pub mod node;
pub mod pg;
pub mod relay;
pub mod workflow;

pub use client::{event, event_at, Client, ReqResult};
pub use relay::{Backend, Relay, RelayOptions};

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Path of a workspace binary, built once per test process (same profile as
/// the tests) so that `cargo test` alone is enough.
pub fn workspace_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        // Long campaigns run from a copy of the binaries and must not rebuild them.
        if std::env::var_os("TESTS_PREBUILT_BINS").is_some() {
            return Ok(());
        }

        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        // The relay, the agent, and the tests' own helper binaries (the small
        // ACP agent, chaos, bench). Debug builds (tests, the crash campaign)
        // carry the test-only fault hooks; release builds (benchmarks) do not.
        cmd.args([
            "build", "--quiet", "--bins", "-p", "relay", "-p", "agent", "-p", "ctl", "-p", "tests",
        ]);
        if profile_dir().ends_with("release") {
            cmd.arg("--release");
        } else {
            cmd.args(["--features", "relay/faults,agent/faults"]);
        }
        cmd.current_dir(workspace_root());
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("cargo build of the binaries failed: {s}")),
            Err(e) => Err(format!("cannot run cargo: {e}")),
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    let path = profile_dir().join(name);
    assert!(path.exists(), "binary {} missing after build", path.display());
    path
}

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn profile_dir() -> PathBuf {
    // target/<profile>/deps/<test binary>, or target/<profile>/<binary>
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("target/<profile>").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Generates one test per backend for each listed `async fn name(backend: Backend)`.
///
/// ```ignore
/// backend_tests!(publishes_and_queries, deletes);
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
                async fn $name() {
                    super::$name($crate::Backend::postgres()).await
                }
            )*
        }
    };
}

/// `GET`/`POST` with a NIP-98 header made by `keys` for `url` (as the relay
/// sees it), sent to `relay_http` with `Host: host`.
pub async fn http_nip98(
    relay_http: &str,
    host: &str,
    keys: &nostr::prelude::Keys,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let url = format!("http://{host}{path}");
    let auth = protocol::nip98::header(keys, method, &url, body);
    http_raw(relay_http, host, method, path, Some(&auth), body).await
}

/// A raw HTTP call with an optional Authorization header.
pub async fn http_raw(
    relay_http: &str,
    host: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let client = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client
        .request(method, format!("{relay_http}{path}"))
        .header("Host", host)
        .body(body.to_vec());
    if !body.is_empty() {
        req = req.header("Content-Type", "application/json");
    }
    if let Some(a) = authorization {
        req = req.header("Authorization", a);
    }
    let resp = req.send().await.expect("http request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}
