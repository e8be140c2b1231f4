//! Agent configuration: defaults < TOML file < `AGENT_*` environment.
//! The secret key is never a command-line argument (`ps` would show it):
//! it comes from `key_file` or the `AGENT_SECRET_KEY` environment variable.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use protocol::api::Effect;
use serde::{Deserialize, Serialize};

/// `agent run` settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The relay's WebSocket URL (`ws://…` or `wss://…`); the HTTP API is at
    /// the same host (`http`/`https`).
    pub relay_url: String,
    /// Hex secret key file of the agent (or set `AGENT_SECRET_KEY`).
    pub key_file: Option<PathBuf>,
    /// The owner whose definitions this agent acts on (hex). Required.
    pub owner: String,
    /// Further pubkeys whose definitions are accepted (hex).
    pub allowed_authors: Vec<String>,
    /// Poll for due deliveries this often (and once at start).
    pub poll_interval_secs: u64,
    /// Lease asked for on each claim; renewed every third of it.
    pub lease_secs: u64,
    /// Most channels whose turns run at the same time.
    pub max_concurrent_channels: usize,
    /// Deliveries for one channel arriving within this window form one turn.
    pub debounce_ms: u64,
    /// Most deliveries in one turn.
    pub max_turn_deliveries: usize,
    /// Reconnect backoff bounds.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    /// Take deliveries made by mentions (docs/protocol.md, "Mentions":
    /// the relay makes them only where the owner turned them on); false:
    /// each is finished `failed` with `mentions_off`.
    pub mentions: bool,
    /// The handler that does the work.
    pub handler: HandlerConfig,
    /// Where Prometheus scrapes `/metrics`; unset: no metrics.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            relay_url: "ws://127.0.0.1:7777".into(),
            key_file: None,
            owner: String::new(),
            allowed_authors: Vec::new(),
            poll_interval_secs: 10,
            lease_secs: 60,
            max_concurrent_channels: 4,
            debounce_ms: 200,
            max_turn_deliveries: 16,
            reconnect_min_ms: 200,
            reconnect_max_ms: 10_000,
            mentions: true,
            handler: HandlerConfig::default(),
            metrics_listen: None,
        }
    }
}

/// Which handler runs a turn.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum HandlerConfig {
    /// Replies with the message text (demos and tests).
    #[default]
    Echo,
    /// Runs a command per turn: JSON on stdin, reply text on stdout. Exit 0:
    /// delivered; exit 75 (EX_TEMPFAIL) or a timeout: retry; else failed.
    Exec {
        command: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_secs: u64,
        /// What running the command does, recorded before it runs:
        /// `write` (default: a lapsed lease is then never redelivered) or `read`.
        #[serde(default = "default_effect")]
        effect: Effect,
    },
    /// Drives an Agent Client Protocol agent over stdio.
    Acp {
        command: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_secs: u64,
    },
}

fn default_timeout() -> u64 {
    300
}

fn default_effect() -> Effect {
    Effect::Write
}

impl AgentConfig {
    /// Loads defaults < file < `AGENT_*` env (nested keys with `__`).
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let mut fig = Figment::from(Serialized::defaults(AgentConfig::default()));
        if let Some(f) = file {
            fig = fig.merge(Toml::file_exact(f));
        }
        fig =
            fig.merge(
                Env::prefixed("AGENT_")
                    .split("__")
                    .ignore(&["secret_key", "config", "log", "faults"]),
            );
        let cfg: AgentConfig = fig.extract().map_err(Box::new)?;
        cfg.validate().map_err(|m| Box::new(figment::Error::from(m)))?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        if nostr::prelude::PublicKey::from_hex(&self.owner).is_err() {
            return Err("owner must be the owner's hex public key".into());
        }
        if self.lease_secs < 3 || self.poll_interval_secs == 0 || self.max_concurrent_channels == 0 {
            return Err("lease_secs >= 3, poll_interval_secs > 0, max_concurrent_channels > 0".into());
        }
        if self.max_turn_deliveries == 0
            || self.reconnect_min_ms == 0
            || self.reconnect_max_ms < self.reconnect_min_ms
        {
            return Err("max_turn_deliveries > 0 and 0 < reconnect_min_ms <= reconnect_max_ms".into());
        }
        match &self.handler {
            HandlerConfig::Exec { command, .. } if command.is_empty() => {
                return Err("handler.command must not be empty".into());
            }
            HandlerConfig::Acp { command, .. } if command.is_empty() => {
                return Err("handler.command must not be empty".into())
            }
            _ => {}
        }
        Ok(())
    }

    /// The HTTP base URL of the relay (same host, `http`/`https`).
    pub fn http_base(&self) -> Result<String, String> {
        http_base(&self.relay_url)
    }
}

/// `ws://h:p/…` -> `http://h:p`, `wss://` -> `https://`.
pub fn http_base(relay_url: &str) -> Result<String, String> {
    let u = url::Url::parse(relay_url).map_err(|e| format!("relay_url: {e}"))?;
    let scheme = match u.scheme() {
        "ws" | "http" => "http",
        "wss" | "https" => "https",
        s => return Err(format!("relay_url scheme {s} is not ws or wss")),
    };
    let host = u.host_str().ok_or("relay_url has no host")?;
    Ok(match u.port() {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

/// Reads a hex (or nsec) secret key from `AGENT_SECRET_KEY` or a file.
pub fn load_keys(file: Option<&Path>) -> anyhow::Result<nostr::prelude::Keys> {
    Ok(client::keyfile::load("AGENT_SECRET_KEY", file)?)
}
