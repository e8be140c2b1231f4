//! Test harness: starts real relay processes and talks to them over real
//! sockets. Every integration test in `tests/tests/` is built on this.

pub mod client;
pub mod pg;
pub mod relay;

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
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "--bins", "-p", "relay"]);
        if profile_dir().ends_with("release") {
            cmd.arg("--release");
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
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>")
        .to_path_buf()
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
                async fn $name() {
                    let Some(backend) = $crate::Backend::postgres() else { return };
                    super::$name(backend).await
                }
            )*
        }
    };
}
