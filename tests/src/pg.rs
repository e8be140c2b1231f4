//! Throwaway PostgreSQL servers for tests, started from the local PostgreSQL
//! binaries (initdb + postgres on a temporary directory and a free port).
//!
//! The server runs as the `postgres` user when the tests run as root (the
//! server refuses root), and is told to die with the thread that started it
//! (PR_SET_PDEATHSIG), so no server outlives the test process.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A PostgreSQL server owned by the tests.
pub struct PgServer {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    _dir: tempfile::TempDir,
    child: Mutex<Option<Child>>,
    owner: Option<(u32, u32)>,
    /// Extra `name=value` server settings (each passed as `-c name=value`).
    settings: Vec<String>,
}

/// The directory holding `initdb` and `postgres`, if PostgreSQL is installed.
pub fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

fn postgres_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let out = Command::new("id").args(["-u", "postgres"]).output().ok()?;
    let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    let out = Command::new("id").args(["-g", "postgres"]).output().ok()?;
    let gid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some((uid, gid))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
}

impl PgServer {
    /// Initialises and starts a new server. `Err` when PostgreSQL is not installed.
    /// Extra server settings may be given, space-separated `name=value`, in
    /// `TESTS_PG_SETTINGS` (for profiling: auto_explain, logging).
    pub fn start() -> Result<PgServer, String> {
        Self::start_with(Vec::new())
    }

    /// [`PgServer::start`] with extra `name=value` server settings (the bench
    /// loads pg_stat_statements this way).
    pub fn start_with(mut settings: Vec<String>) -> Result<PgServer, String> {
        if let Ok(more) = std::env::var("TESTS_PG_SETTINGS") {
            settings.extend(more.split_whitespace().map(str::to_string));
        }
        let bin = bin_dir().ok_or("no PostgreSQL binaries found (set PG_BIN or install postgresql)")?;
        let owner = postgres_owner();
        let (dir, data) = data_dir(owner)?;
        let mut init = Command::new(bin.join("initdb"));
        init.args(["-D"]).arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        init.stdout(Stdio::null()).stderr(Stdio::piped());
        as_owner(&mut init, owner);
        let out = init.output().map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let server = PgServer {
            port: free_port(),
            bin,
            data,
            _dir: dir,
            child: Mutex::new(None),
            owner,
            settings,
        };
        server.run()?;
        Ok(server)
    }

    /// A hot standby of this server, streaming from it (a base backup
    /// taken now, `standby.signal` written by `pg_basebackup -R`), started
    /// on a port of its own: its databases are this server's. With
    /// `synchronous`, this server then waits for the standby's flush of
    /// every commit (`synchronous_standby_names = '*'`).
    pub fn standby(&self, synchronous: bool) -> Result<PgServer, String> {
        let (dir, data) = data_dir(self.owner)?;
        self.base_backup(&data)?;
        let standby = PgServer {
            port: free_port(),
            bin: self.bin.clone(),
            data,
            _dir: dir,
            child: Mutex::new(None),
            owner: self.owner,
            settings: self.settings.clone(),
        };
        standby.run()?;
        if synchronous {
            self.set_synchronous(true)?;
        }
        Ok(standby)
    }

    /// A base backup of this server written to `data` as a standby's
    /// (`pg_basebackup -R`: `standby.signal` and the connection to here).
    fn base_backup(&self, data: &Path) -> Result<(), String> {
        let mut backup = self.client("pg_basebackup");
        backup
            .arg("-D")
            .arg(data)
            .args(["-R", "-X", "stream", "--no-sync", "--checkpoint=fast"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_owner(&mut backup, self.owner);
        let out = backup.output().map_err(|e| format!("pg_basebackup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_basebackup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// Makes this server, killed or stopped, a standby of `primary` on its
    /// own port (an old primary rejoining after a failover): its data is
    /// replaced by a base backup of `primary`'s.
    pub fn follow(&self, primary: &PgServer) -> Result<(), String> {
        self.kill();
        std::fs::remove_dir_all(&self.data).map_err(|e| format!("removing the old data: {e}"))?;
        primary.base_backup(&self.data)?;
        self.run()
    }

    /// Whether commits wait for a standby's flush
    /// (`synchronous_standby_names = '*'`, or empty).
    pub fn set_synchronous(&self, on: bool) -> Result<(), String> {
        let names = if on { "*" } else { "" };
        self.psql(
            "postgres",
            &format!("ALTER SYSTEM SET synchronous_standby_names = '{names}'"),
        )?;
        self.psql("postgres", "SELECT pg_reload_conf()")?;
        Ok(())
    }

    /// Whether a synchronous standby streams from this server now.
    pub fn has_synchronous_standby(&self) -> bool {
        let q = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'";
        self.psql("postgres", q).is_ok_and(|n| n != "0")
    }

    /// Runs one SQL statement with psql on the database `url` names (a
    /// libpq URL: several hosts, `target_session_attrs`).
    pub fn psql_url(&self, url: &str, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["-X", "-q", "-t", "-A", "-d", url, "-c", sql]);
        answer(cmd)
    }

    /// Promotes a standby to a primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), String> {
        self.psql("postgres", "SELECT pg_promote(true, 60)")?;
        match self.psql("postgres", "SHOW transaction_read_only")?.as_str() {
            "off" => Ok(()),
            other => Err(format!("still read-only after promotion: {other}")),
        }
    }

    /// Kills the server (SIGKILL, as a machine that dies) and reaps it.
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn run(&self) -> Result<(), String> {
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data)
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-k",
            ])
            .arg(self.data.parent().unwrap_or(Path::new("/tmp")))
            .args([
                "-c",
                "fsync=off",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=64MB",
            ])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_owner(&mut cmd, self.owner);
        // SAFETY: prctl in the child between fork and exec only sets its own
        // parent-death signal; no allocation or locking happens there.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("postgres: {e}"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.psql("postgres", "SELECT 1").is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("postgres did not become ready within 60 s".into())
    }

    /// A client program of PostgreSQL's (`psql`, `pg_basebackup`) aimed
    /// at this server as `postgres`.
    fn client(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        let port = self.port.to_string();
        cmd.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]);
        cmd
    }

    /// Runs one SQL statement with psql.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.client("psql");
        cmd.args(["-X", "-q", "-t", "-A", "-d", db, "-c", sql]);
        answer(cmd)
    }

    /// Creates a fresh database and returns its URL.
    pub fn create_database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("t{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        self.psql("postgres", &format!("CREATE DATABASE {name}"))
            .expect("create database");
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The server's (postmaster's) process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.id())
    }

    /// Stops the server (fast shutdown) and waits for it to exit.
    pub fn stop(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // SAFETY: signalling our own child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGINT);
            }
            let _ = c.wait();
        }
    }

    /// Starts the server again after [`PgServer::stop`], on the same port and data.
    pub fn start_again(&self) {
        self.run().expect("restart postgres");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a psql command printed (trimmed), or its error output.
fn answer(mut psql: Command) -> Result<String, String> {
    let out = psql.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A new temporary directory for a server's data, owned by the server's
/// user: the directory and the data directory's path in it.
fn data_dir(owner: Option<(u32, u32)>) -> Result<(tempfile::TempDir, PathBuf), String> {
    let dir = tempfile::Builder::new()
        .prefix("relay-pg-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let data = dir.path().join("data");
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| e.to_string())?;
    }
    Ok((dir, data))
}

/// A server of the calling test's own (for tests that stop and restart
/// it). Tests that need one are ignored where PostgreSQL is not installed
/// (`tests/build.rs`); here a server that does not start fails the test.
pub fn own_server() -> PgServer {
    PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL did not start: {e}"))
}

/// The server shared by all tests of this process, started on first use
/// from a thread that lives as long as the process.
pub fn shared() -> Arc<PgServer> {
    remove_stale_servers();
    static SHARED: OnceLock<Result<Arc<PgServer>, String>> = OnceLock::new();
    let r = SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("pg-owner".into())
            .spawn(move || {
                let _ = tx.send(PgServer::start().map(Arc::new));
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn pg owner thread");
        rx.recv().unwrap_or_else(|_| Err("pg owner thread died".into()))
    });
    match r {
        Ok(s) => s.clone(),
        Err(e) => panic!("PostgreSQL did not start: {e}"),
    }
}

/// Removes data directories of earlier test runs whose server is gone (the
/// shared server of a test process is never dropped, so its directory stays).
fn remove_stale_servers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("relay-pg-") {
            continue;
        }
        let pid_file = entry.path().join("data").join("postmaster.pid");
        let alive = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
            // SAFETY: signal 0 only checks that the process exists.
            .is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0);
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(600));
        if !alive && old {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
