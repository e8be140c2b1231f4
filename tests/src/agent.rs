//! Starting real `agent` processes for end-to-end tests.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nostr::prelude::Keys;

use crate::{workspace_bin, Relay};

/// A running agent process.
pub struct AgentProc {
    child: Option<Child>,
    log_path: PathBuf,
    config_path: PathBuf,
    env: Vec<(String, String)>,
}

impl AgentProc {
    /// Starts `agent run` for `keys` (owned by `owner`) against `relay`, with
    /// `handler` (a TOML `[handler]` table body) and extra top-level TOML.
    pub fn start(relay: &Relay, keys: &Keys, owner: &Keys, handler: &str, extra: &str) -> AgentProc {
        Self::start_env(relay, keys, owner, handler, extra, &[])
    }

    /// Like [`AgentProc::start`], with extra environment (e.g. `AGENT_FAULTS`).
    pub fn start_env(
        relay: &Relay,
        keys: &Keys,
        owner: &Keys,
        handler: &str,
        extra: &str,
        env: &[(String, String)],
    ) -> AgentProc {
        let config_path = Self::configure(relay, keys, owner, handler, extra);
        Self::spawn(&config_path, relay.store.dir.path(), env, true)
    }

    /// Like [`AgentProc::start`], without waiting for the agent to say it
    /// runs (it says so once it has read the relay's NIP-11 document: a
    /// relay that is down keeps it from saying it).
    pub fn start_unready(relay: &Relay, keys: &Keys, owner: &Keys, handler: &str) -> AgentProc {
        let config_path = Self::configure(relay, keys, owner, handler, "");
        Self::spawn(&config_path, relay.store.dir.path(), &[], false)
    }

    /// Writes the agent's key file (once) and configuration; returns the
    /// configuration's path.
    fn configure(relay: &Relay, keys: &Keys, owner: &Keys, handler: &str, extra: &str) -> PathBuf {
        let dir = relay.store.dir.path();
        let tag = &keys.public_key().to_hex()[..12];
        let key_path = dir.join(format!("agent-{tag}.key"));
        if !key_path.exists() {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&key_path)
                .expect("key file");
            std::io::Write::write_all(&mut f, keys.secret_key().to_secret_hex().as_bytes())
                .expect("write key");
        }
        let config_path = dir.join(format!("agent-{tag}.toml"));
        let mut config = format!(
            "relay_url = \"{}\"\nkey_file = \"{}\"\nowner = \"{}\"\n{extra}\n",
            relay.ws_url(),
            key_path.display(),
            owner.public_key().to_hex()
        );
        // Test defaults, unless `extra` sets them.
        for (key, value) in [
            ("poll_interval_secs", "1"),
            ("lease_secs", "15"),
            ("debounce_ms", "100"),
        ] {
            if !extra.lines().any(|l| l.trim_start().starts_with(key)) {
                config.push_str(&format!("{key} = {value}\n"));
            }
        }
        config.push_str(&format!("[handler]\n{handler}\n"));

        std::fs::write(&config_path, config).expect("agent config");
        config_path
    }

    /// Starts `agent run`; with `wait_ready`, waits (30 s) for its first
    /// line on stdout (`agent running …`).
    fn spawn(config_path: &Path, dir: &Path, env: &[(String, String)], wait_ready: bool) -> AgentProc {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let log_path = dir.join(format!("agent-{n}.log"));
        let log = std::fs::File::create(&log_path).expect("agent log");
        let mut child = Command::new(workspace_bin("agent"))
            .args(["run", "--config"])
            .arg(config_path)
            .env("AGENT_LOG", "info,agent=debug")
            .env_remove("AGENT_SECRET_KEY")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn agent");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        if wait_ready && rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            panic!("agent did not start; log:\n{}", read(&log_path));
        }
        AgentProc {
            child: Some(child),
            log_path,
            config_path: config_path.to_path_buf(),
            env: env.to_vec(),
        }
    }

    /// Waits until the agent has subscribed to its wakes (10 s).
    pub async fn wait_subscribed(&self) {
        for _ in 0..100 {
            if self.log().contains("subscribed to wake hints") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("agent never subscribed; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        read(&self.log_path)
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process has exited (e.g. killed by an armed fault).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    /// The extra environment it was last started with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Starts the same agent again (after `kill`), with `env` this time.
    pub fn restart_env(&mut self, env: &[(String, String)]) {
        self.env = env.to_vec();
        self.restart();
    }

    /// Starts the same agent again (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        let dir = self.config_path.parent().expect("dir").to_path_buf();
        let again = Self::spawn(&self.config_path, &dir, &self.env.clone(), true);
        let mut again = std::mem::ManuallyDrop::new(again);
        self.child = again.child.take();
        self.log_path = std::mem::take(&mut again.log_path);
    }
}

fn read(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- agent log ({}) ---\n{}", self.log_path.display(), self.log());
        }
    }
}
