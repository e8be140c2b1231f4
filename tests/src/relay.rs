//! Starting and stopping real relay processes.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::pg::PgServer;
use crate::workspace_bin;

/// Which storage backend a relay runs on.
#[derive(Clone)]
pub enum Backend {
    /// An SQLite file in the test's temporary directory.
    Sqlite,
    /// A fresh database on a PostgreSQL server owned by the tests.
    Postgres(Arc<PgServer>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// PostgreSQL on the shared test server. A PostgreSQL test is compiled
    /// as ignored where PostgreSQL is not installed (`tests/build.rs`), so
    /// it never gets here without one; one that cannot start fails.
    pub fn postgres() -> Backend {
        Backend::Postgres(crate::pg::shared())
    }
}

/// How to start a relay.
#[derive(Clone, Debug, Default)]
pub struct RelayOptions {
    /// Extra TOML appended to the generated config file.
    pub config_toml: String,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

/// A data directory with a database, shared by the relay processes of one test.
pub struct Store {
    pub dir: tempfile::TempDir,
    pub database_url: String,
    pub backend: Backend,
}

impl Store {
    /// A store on a new database of `primary`, whose URL names the hosts
    /// of `ports` on loopback (libpq's form) and asks for the writable one
    /// (the primary and its standbys: docs/backends.md, "Several hosts").
    pub fn on_hosts(primary: &Arc<crate::pg::PgServer>, ports: &[u16]) -> Arc<Self> {
        let dir = tempfile::Builder::new()
            .prefix("relay-test-")
            .tempdir()
            .expect("tempdir");
        let created = primary.create_database();
        let db = created.rsplit('/').next().expect("a database");
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let database_url = format!(
            "postgres://postgres@{}/{db}?target_session_attrs=read-write",
            hosts.join(",")
        );
        Arc::new(Self {
            dir,
            database_url,
            backend: Backend::Postgres(primary.clone()),
        })
    }

    pub fn new(backend: &Backend) -> Arc<Self> {
        let dir = tempfile::Builder::new()
            .prefix("relay-test-")
            .tempdir()
            .expect("tempdir");
        let database_url = match backend {
            Backend::Sqlite => format!("sqlite://{}", dir.path().join("relay.db").display()),
            Backend::Postgres(server) => server.create_database(),
        };
        Arc::new(Self {
            dir,
            database_url,
            backend: backend.clone(),
        })
    }
}

/// A running relay process.
pub struct Relay {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// Every address it listens on (the first is `addr`).
    pub addrs: Vec<SocketAddr>,
    /// Where `/metrics` is served (with `metrics_listen` set).
    pub metrics_addr: Option<SocketAddr>,
    pub store: Arc<Store>,
    pub options: RelayOptions,
    log_path: PathBuf,
}

impl Relay {
    /// Starts a relay on a fresh store.
    pub fn start(backend: &Backend) -> Relay {
        Self::start_with(Store::new(backend), RelayOptions::default())
    }

    /// Starts a relay on a fresh store with options.
    pub fn start_opts(backend: &Backend, options: RelayOptions) -> Relay {
        Self::start_with(Store::new(backend), options)
    }

    /// Starts a relay on an existing store (a restart, or a second process).
    pub fn start_with(store: Arc<Store>, options: RelayOptions) -> Relay {
        Self::start_listening(store, options, "127.0.0.1:0")
    }

    /// Starts a relay listening on `listen` (the `--listen` value); `addr`
    /// is the first address it prints.
    pub fn start_listening(store: Arc<Store>, options: RelayOptions, listen: &str) -> Relay {
        let (child, (addrs, metrics_addr), log_path) = spawn_process(&store, &options, listen);
        Relay {
            child: Some(child),
            addr: addrs[0],
            addrs,
            metrics_addr,
            store,
            options,
            log_path,
        }
    }
    /// `ws://127.0.0.1:<port>`
    pub fn ws_url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// `http://127.0.0.1:<port>`
    /// The lines of its `/metrics` (with `metrics_listen` set) of the
    /// series `name`, as `name{labels} value`.
    pub async fn metric_lines(&self, name: &str) -> Vec<String> {
        let text = crate::metrics::text(self).await;
        let prefix = format!("{name}{{");
        text.lines()
            .filter(|l| l.starts_with(&prefix) || l.split(' ').next() == Some(name))
            .map(str::to_string)
            .collect()
    }

    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("relay running");
        // SAFETY: sending a signal to a child process id we own.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        for _ in 0..300 {
            if let Ok(Some(status)) = c.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        panic!("relay did not exit within 15 s of SIGTERM");
    }

    /// Restarts on the same store and port (after kill or terminate).
    pub fn restart(&mut self) {
        self.kill();
        let listen = self.addr.to_string();
        let (child, (addrs, metrics_addr), log_path) = spawn_process(&self.store, &self.options, &listen);
        self.metrics_addr = metrics_addr;
        self.child = Some(child);
        self.addr = addrs[0];
        self.addrs = addrs;
        self.log_path = log_path;
    }

    /// Restarts with other options (e.g. armed faults), same store and port.
    pub fn restart_with(&mut self, options: RelayOptions) {
        self.options = options;
        self.restart();
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process has exited (e.g. killed by an armed fault).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    /// Runs `relay <args>` against this relay's database and returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        run_cli(&self.store.database_url, args)
    }

    /// The relay's log so far.
    pub fn log(&self) -> String {
        read_log(&self.log_path)
    }
}

/// What a relay process that was expected to stop said.
#[derive(Debug)]
pub struct Exited {
    /// Its exit code (`None`: still running after the wait, then killed).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// From its start to its exit (or to the kill), the build of the
    /// binary not counted.
    pub ran: Duration,
}

/// Runs `relay <args>` in `cwd` with `env` (and no `RELAY_CONFIG`), waiting
/// up to `wait` for it to exit.
pub fn run_relay(args: &[&str], env: &[(&str, &str)], cwd: &Path, wait: Duration) -> Exited {
    let mut cmd = Command::new(workspace_bin("relay"));
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("RELAY_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn relay");
    let started = std::time::Instant::now();
    let deadline = started + wait;
    let code = loop {
        match child.try_wait().expect("wait") {
            Some(status) => break status.code(),
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Exited {
        code,
        stdout,
        stderr,
        ran: started.elapsed(),
    }
}

/// Runs the relay CLI against a database with extra environment.
pub fn run_cli_env(database_url: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(workspace_bin("relay"));
    cmd.args(["--database-url", database_url, "--log", "warn"])
        .args(args)
        .env_remove("RELAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run relay cli");
    assert!(
        out.status.success(),
        "relay {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the relay CLI against a database.
pub fn run_cli(database_url: &str, args: &[&str]) -> String {
    run_cli_env(database_url, args, &[])
}

/// The listen addresses and the metrics address a relay printed.
type Printed = (Vec<SocketAddr>, Option<SocketAddr>);

fn spawn_process(store: &Store, options: &RelayOptions, listen: &str) -> (Child, Printed, PathBuf) {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let config_path = store.dir.path().join(format!("relay-{n}.toml"));
    std::fs::write(&config_path, &options.config_toml).expect("write config");
    let log_path = store.dir.path().join(format!("relay-{n}.log"));
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut cmd = Command::new(workspace_bin("relay"));
    cmd.arg("--config")
        .arg(&config_path)
        .args(["--listen", listen, "--database-url", &store.database_url])
        .env_remove("RELAY_CONFIG");
    // The tests' own filter, unless the test sets RUST_LOG to see it honoured.
    if !options.env.iter().any(|(k, _)| k == "RUST_LOG") {
        cmd.env("RELAY_LOG", "info,relay=debug");
    }
    cmd
        // The processes of one store share its directory (and so its
        // secrets key file, created there on PostgreSQL).
        .current_dir(store.dir.path())
        .stdout(Stdio::piped())
        .stderr(log);
    for (k, v) in &options.env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn relay");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            panic!("relay did not start; log:\n{}", read_log(&log_path));
        }
    };
    // "relay listening on <addr> backend=<b> [also=<addr> ...]"
    let words: Vec<&str> = line.split_whitespace().collect();
    let first: SocketAddr = words
        .get(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let mut addrs = vec![first];
    addrs.extend(
        words
            .iter()
            .filter_map(|w| w.strip_prefix("also=")?.parse::<SocketAddr>().ok()),
    );
    let metrics = words
        .iter()
        .find_map(|w| w.strip_prefix("metrics=")?.parse::<SocketAddr>().ok());
    (child, (addrs, metrics), log_path)
}

fn read_log(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- relay log tail ({}) ---", self.log_path.display());
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

impl Store {
    /// Like [`Store::sql`], but retrying for up to 30 s while the database
    /// is unreachable (the crash campaign restarts it).
    pub fn sql_retrying(&self, sql: &str) -> String {
        let mut last = String::new();
        for _ in 0..150 {
            match self.try_sql(sql) {
                Ok(out) => return out,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("sql failed for 30 s: {last}");
    }

    /// Runs SQL against the store's database (tests craft rows with it):
    /// Python's sqlite3 module for SQLite, psql for PostgreSQL.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("sql failed: {e}"))
    }

    /// [`Store::sql`] without panicking.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        match &self.backend {
            Backend::Sqlite => {
                let path = self.database_url.trim_start_matches("sqlite://");
                let script = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1], timeout=10)\nr=c.execute(sys.argv[2]).fetchall()\nc.commit()\nprint('\\n'.join('|'.join(str(x) for x in row) for row in r))";
                let out = Command::new("python3")
                    .args(["-c", script, path, sql])
                    .output()
                    .map_err(|e| e.to_string())?;
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            }
            // Several hosts: the one that takes writes (after a failover,
            // not the server the store was made on).
            Backend::Postgres(server) if self.database_url.contains(',') => {
                server.psql_url(&self.database_url, sql)
            }
            Backend::Postgres(server) => {
                let db = self.database_url.rsplit('/').next().expect("db name");
                server.psql(db, sql)
            }
        }
    }

    /// A literal for 32 bytes given in hex, in this backend's SQL.
    pub fn blob(&self, hex: &str) -> String {
        match &self.backend {
            Backend::Sqlite => format!("X'{hex}'"),
            Backend::Postgres(_) => format!("'\\x{hex}'::bytea"),
        }
    }
}
