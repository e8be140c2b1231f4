//! Relay configuration: defaults, then a TOML file, then `RELAY_*`
//! environment variables, then command-line flags (each layer overrides the
//! previous one). Every limit the relay enforces lives here, with its unit in
//! its name, and is advertised in NIP-11.

use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

mod community;
mod limits;
mod listen;
mod sections;

pub use community::{Access, ChannelPolicy, CommunitySettings, DefaultCommunity};
pub use limits::Limits;
pub use listen::{parse_listen, parse_listen_list, Listen};
pub use sections::{
    default_secrets_key_path, DeliveryConfig, PostgresConfig, SqliteConfig, WebhookConfig, WorkflowConfig,
    WriterConfig,
};

/// The whole relay configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Addresses the HTTP/WebSocket server listens on (`host:port`, IPv6
    /// as `[::1]:7777`): one, or a list.
    pub listen: Listen,
    /// `sqlite://path` (embedded, default) or `postgres://…`.
    pub database_url: String,
    /// PostgreSQL hot standbys (one host each) that serve REQ, COUNT,
    /// search and NIP-77 reads while within `postgres.standby_max_lag_ms`
    /// of the primary (`persistence::standbys`); empty: every read on
    /// `database_url`.
    pub read_database_urls: Vec<String>,
    /// Log filter in `RUST_LOG` syntax (`--log`, `RELAY_LOG`, the file);
    /// unset: the `RUST_LOG` environment variable, else `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// `text` (human lines) or `json` (one object per line).
    pub log_format: LogFormat,
    /// Name published in NIP-11.
    pub name: String,
    /// Description published in NIP-11.
    pub description: String,
    /// Kinds delivered only to connections authenticated as a `p` of the
    /// event or as its author (NIP-04 DMs, NIP-59 gift wraps, wake hints).
    pub p_gated_kinds: Vec<u16>,
    /// Admins of every community (hex pubkeys): they may call every
    /// management (NIP-86) method. Each community adds its own.
    pub admins: Vec<String>,
    /// Who may read and write, for every community without its own.
    pub access: Access,
    /// Directory of community signing keys kept outside the database
    /// (`<keys_dir>/<community id>.key`); see `relay::keys`. Unset: keys
    /// are stored in the database.
    pub keys_dir: Option<std::path::PathBuf>,
    /// The community created on first start when it does not exist yet.
    pub default_community: DefaultCommunity,
    /// Protocol limits.
    pub limits: Limits,
    /// Channel (NIP-29) policy for every community without its own.
    pub channels: ChannelPolicy,
    /// Per-community settings, by community id.
    pub communities: std::collections::BTreeMap<String, CommunitySettings>,
    /// Managed-agent delivery: attempts, backoff, leases, lifetimes.
    pub deliveries: DeliveryConfig,
    /// Workflow engine timing.
    pub workflows: WorkflowConfig,
    /// Outbound webhook calls (`call_webhook` steps) and the secrets key.
    pub webhooks: WebhookConfig,
    /// Where Prometheus scrapes `/metrics` (a separate address, never the
    /// public one); unset: no metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// Where runs' traces are exported (OTLP over HTTP, JSON: the
    /// collector's traces URL, e.g. `http://127.0.0.1:4318/v1/traces`);
    /// unset: not exported.
    pub otlp_endpoint: Option<String>,
    /// How often the gauges read from the database (deliveries and runs by
    /// status, the oldest pending delivery) are refreshed.
    pub metrics_interval_secs: u64,
    /// Embedded SQLite settings.
    pub sqlite: SqliteConfig,
    /// PostgreSQL settings.
    pub postgres: PostgresConfig,
    /// Group commit: queues and batch sizes of the store's writers.
    pub writer: WriterConfig,
    /// How long a graceful shutdown waits for connections to drain.
    pub shutdown_grace_ms: u64,
    /// The same in seconds; when set, it replaces `shutdown_grace_ms`.
    pub shutdown_grace_secs: Option<u64>,
    /// How often expired (NIP-40) events are purged.
    pub expiry_sweep_interval_secs: u64,
    /// How long `serve` waits at start for an unreachable database.
    pub startup_db_wait_secs: u64,
}

/// Longest graceful shutdown (an orchestrator kills a process that takes
/// longer anyway: Kubernetes after 30 s unless told otherwise).
pub const MAX_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(600);
/// The largest `communities.<id>.weight`.
pub const MAX_WEIGHT: u32 = 100;

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: Listen::default(),
            database_url: "sqlite://relay.db".into(),
            read_database_urls: Vec::new(),
            log: None,
            log_format: LogFormat::Text,
            name: "nostr relay with durable agent delivery".into(),
            description: "Multi-community Nostr relay with workflows and managed-agent delivery.".into(),
            admins: Vec::new(),
            access: Access::default(),
            p_gated_kinds: vec![
                protocol::kinds::ENCRYPTED_DM,
                protocol::kinds::WAKE_HINT,
                protocol::kinds::MENTION_STATUS,
                protocol::kinds::GIFT_WRAP,
            ],
            keys_dir: None,
            default_community: DefaultCommunity::default(),
            limits: Limits::default(),
            channels: ChannelPolicy::default(),
            communities: std::collections::BTreeMap::new(),
            deliveries: DeliveryConfig::default(),
            workflows: WorkflowConfig::default(),
            webhooks: WebhookConfig::default(),
            metrics_listen: None,
            otlp_endpoint: None,
            metrics_interval_secs: 15,
            sqlite: SqliteConfig::default(),
            postgres: PostgresConfig::default(),
            writer: WriterConfig::default(),
            shutdown_grace_ms: 5_000,
            shutdown_grace_secs: None,
            expiry_sweep_interval_secs: 60,
            startup_db_wait_secs: 30,
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Config {
    /// The log filter in force: `log` (flag, `RELAY_LOG`, file), else
    /// `RUST_LOG`, else `info`.
    pub fn log_filter(&self) -> String {
        self.log
            .clone()
            .or_else(|| std::env::var("RUST_LOG").ok().filter(|s| !s.trim().is_empty()))
            .unwrap_or_else(|| "info".into())
    }
}

/// Values given on the command line; `None` means "not given".
#[derive(Debug, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<Listen>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

impl Config {
    /// Loads defaults < file < `RELAY_*` env (nested keys with `__`, e.g.
    /// `RELAY_LIMITS__MAX_LIMIT=50`) < flags.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, Box<figment::Error>> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig
            .merge(
                Env::prefixed("RELAY_")
                    .filter(|key| !injected_by_orchestrator(key.as_str()))
                    .split("__")
                    .ignore(&["config", "faults"]),
            )
            .merge(Serialized::defaults(overrides));
        let cfg: Config = fig.extract().map_err(Box::new)?;
        cfg.validate().map_err(|m| Box::new(figment::Error::from(m)))?;
        Ok(cfg)
    }

    /// The channel policy of a community.
    pub fn channel_policy(&self, community: &str) -> &ChannelPolicy {
        self.communities
            .get(community)
            .and_then(|c| c.channels.as_ref())
            .unwrap_or(&self.channels)
    }

    /// The access rules of a community.
    pub fn access(&self, community: &str) -> &Access {
        self.communities
            .get(community)
            .and_then(|c| c.access.as_ref())
            .unwrap_or(&self.access)
    }

    /// The hosts a community's webhook calls may reach at non-public
    /// addresses or over `http`.
    pub fn webhook_allow_hosts(&self, community: &str) -> &[String] {
        self.communities
            .get(community)
            .map_or(&[], |c| c.webhook_allow_hosts.as_slice())
    }

    /// A community's share of the workflow engine (`weight`, default 1).
    pub fn weight(&self, community: &str) -> u32 {
        self.communities
            .get(community)
            .and_then(|c| c.weight)
            .unwrap_or(1)
    }

    /// Whether `pubkey` (hex) is an admin of `community`.
    pub fn is_admin(&self, community: &str, pubkey_hex: &str) -> bool {
        let own = self
            .communities
            .get(community)
            .map_or(&[][..], |c| c.admins.as_slice());
        self.admins
            .iter()
            .chain(own)
            .any(|a| a.eq_ignore_ascii_case(pubkey_hex))
    }

    /// Where the secrets key file is.
    pub fn secrets_key_path(&self) -> std::path::PathBuf {
        self.webhooks
            .secrets_key_file
            .clone()
            .unwrap_or_else(|| default_secrets_key_path(&self.database_url))
    }

    /// How long a graceful shutdown waits for connections to drain.
    pub fn shutdown_grace(&self) -> std::time::Duration {
        match self.shutdown_grace_secs {
            Some(secs) => std::time::Duration::from_secs(secs),
            None => std::time::Duration::from_millis(self.shutdown_grace_ms),
        }
    }

    fn validate(&self) -> Result<(), String> {
        if self.shutdown_grace() > MAX_SHUTDOWN_GRACE {
            return Err(format!(
                "shutdown_grace_ms / shutdown_grace_secs: at most {} s",
                MAX_SHUTDOWN_GRACE.as_secs()
            ));
        }
        let admins = self
            .admins
            .iter()
            .chain(self.communities.values().flat_map(|c| &c.admins));
        for a in admins {
            if a.len() != 64 || !a.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "admins: {a:?} is not a hex public key (64 hex characters)"
                ));
            }
        }
        for (id, c) in &self.communities {
            if c.weight.is_some_and(|w| !(1..=MAX_WEIGHT).contains(&w)) {
                return Err(format!("communities.{id}.weight must be from 1 to {MAX_WEIGHT}"));
            }
        }
        for p in std::iter::once(&self.channels)
            .chain(self.communities.values().filter_map(|c| c.channels.as_ref()))
        {
            if !matches!(p.create.as_str(), "authenticated" | "allowlist") {
                return Err("channels.create must be \"authenticated\" or \"allowlist\"".into());
            }
        }
        let l = &self.limits;
        for (name, v) in [
            ("max_message_bytes", l.max_message_bytes),
            ("max_event_bytes", l.max_event_bytes),
            ("max_tag_value_bytes", l.max_tag_value_bytes),
            ("max_subscriptions", l.max_subscriptions),
            ("max_filters", l.max_filters),
            ("max_filter_values", l.max_filter_values),
            ("max_limit", l.max_limit),
            ("max_outbound_bytes", l.max_outbound_bytes),
            ("max_inflight_events", l.max_inflight_events),
            ("fanout_buffer_events", l.fanout_buffer_events),
            ("max_http_body_bytes", l.max_http_body_bytes),
            ("ws_read_buffer_bytes", l.ws_read_buffer_bytes),
            ("max_req_bytes", l.max_req_bytes),
            ("max_sync_events", l.max_sync_events),
            ("max_sync_sessions", l.max_sync_sessions),
            ("max_outbound_bytes_total", l.max_outbound_bytes_total),
            ("max_connections_per_ip", l.max_connections_per_ip as usize),
            ("header_read_timeout_ms", l.header_read_timeout_ms as usize),
            ("body_read_timeout_ms", l.body_read_timeout_ms as usize),
            (
                "webhook_failures_per_second",
                l.webhook_failures_per_second as usize,
            ),
            ("webhook_failures_burst", l.webhook_failures_burst as usize),
        ] {
            if v == 0 {
                return Err(format!("limits.{name} must be greater than 0"));
            }
        }
        if l.events_per_second == 0
            || l.events_burst == 0
            || l.api_requests_per_second == 0
            || l.api_burst == 0
        {
            return Err("limits.events_per_second and limits.events_burst must be > 0".into());
        }
        if self.writer.event_queue == 0 || self.writer.call_queue == 0 {
            return Err("writer.event_queue and writer.call_queue must be at least 1".into());
        }
        if !(1..=10_000).contains(&self.writer.event_batch) || !(1..=64).contains(&self.writer.call_batch) {
            return Err("writer.event_batch must be 1 to 10000 and writer.call_batch 1 to 64".into());
        }
        if self.writer.call_writers == 0
            || self.writer.call_writers as u64 + 2 > u64::from(self.postgres.pool_size)
        {
            return Err("writer.call_writers must be at least 1 and leave 2 of postgres.pool_size".into());
        }
        if !matches!(self.sqlite.synchronous.as_str(), "normal" | "full") {
            return Err("sqlite.synchronous must be \"normal\" or \"full\"".into());
        }
        if self.sqlite.checkpoint_interval_ms == 0 || self.sqlite.wal_autocheckpoint_pages == 0 {
            return Err(
                "sqlite.checkpoint_interval_ms and sqlite.wal_autocheckpoint_pages must be > 0".into(),
            );
        }
        let d = &self.deliveries;
        if d.max_attempts == 0 || d.default_lease_secs == 0 || d.max_lease_secs < d.default_lease_secs {
            return Err("deliveries: max_attempts and default_lease_secs must be > 0, max_lease_secs >= default_lease_secs".into());
        }
        if d.lifetime_secs <= d.max_lease_secs
            || d.retry_base_secs == 0
            || d.sweep_batch == 0
            || d.max_page == 0
        {
            return Err("deliveries: lifetime_secs must exceed max_lease_secs; retry_base_secs, sweep_batch, max_page > 0".into());
        }
        if d.mentions_per_hour == 0 || d.mentions_per_day < d.mentions_per_hour {
            return Err(
                "deliveries: mentions_per_hour must be > 0, mentions_per_day >= mentions_per_hour".into(),
            );
        }
        if d.mention_debounce_secs > 60
            || !(d.mention_debounce_secs..=3600).contains(&d.mention_max_wait_secs)
        {
            return Err(
                "deliveries: mention_debounce_secs at most 60, mention_max_wait_secs from it to 3600".into(),
            );
        }
        if !(1..=64).contains(&self.workflows.concurrent_runs) {
            return Err("workflows.concurrent_runs must be between 1 and 64".into());
        }
        if self.workflows.run_batch == 0 || self.workflows.max_webhook_body_bytes == 0 {
            return Err("workflows.run_batch and workflows.max_webhook_body_bytes must be > 0".into());
        }
        if self.postgres.pool_size < 2 {
            return Err("postgres.pool_size must be at least 2".into());
        }
        if self.postgres.query_pool_size == 0 {
            return Err("postgres.query_pool_size must be at least 1".into());
        }
        self.check_read_urls()?;
        if self.sqlite.pool_size < 2 {
            return Err("sqlite.pool_size must be at least 2".into());
        }
        Ok(())
    }
}

/// Most `read_database_urls`.
pub const MAX_READ_DATABASES: usize = 16;

impl Config {
    fn check_read_urls(&self) -> Result<(), String> {
        let postgres = |u: &str| u.starts_with("postgres:") || u.starts_with("postgresql:");
        if self.read_database_urls.is_empty() {
            return Ok(());
        }
        if !postgres(&self.database_url) {
            return Err("read_database_urls: standbys serve reads of a PostgreSQL database_url only".into());
        }
        if self.read_database_urls.len() > MAX_READ_DATABASES {
            return Err(format!("read_database_urls: at most {MAX_READ_DATABASES}"));
        }
        if let Some(i) = self.read_database_urls.iter().position(|u| !postgres(u)) {
            return Err(format!("read_database_urls: entry {i} is not a postgres:// URL"));
        }
        if !(10..=10_000).contains(&self.postgres.standby_max_lag_ms) {
            return Err("postgres.standby_max_lag_ms must be between 10 and 10000".into());
        }
        Ok(())
    }
}

/// Whether a `RELAY_…` variable (`key`: the name after `RELAY_`) is one
/// that container orchestrators inject for a service whose name starts
/// with `relay`, rather than configuration. Kubernetes service links (and
/// Docker links) put `<SERVICE>_PORT=tcp://…`, `<SERVICE>_PORT_<n>_<PROTO>`
/// (`_ADDR`, `_PORT`, `_PROTO`), `<SERVICE>_SERVICE_HOST` and
/// `<SERVICE>_SERVICE_PORT[_<NAME>]` into every pod; a Service named
/// `relay` or `relay-db` made the relay refuse to start (`unknown field:
/// found port`). No configuration key has a `port` or `service` part, so
/// these are told apart by name, and every other `RELAY_…` variable must
/// still be a real key (a typo is an error).
pub fn injected_by_orchestrator(key: &str) -> bool {
    if key.contains("__") {
        return false; // a nested key: always configuration
    }
    let parts: Vec<String> = key.split('_').map(|p| p.to_ascii_uppercase()).collect();
    let at = |i: usize| parts.get(i).map(String::as_str);
    let numeric = |i: usize| at(i).is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    parts.last().is_some_and(|p| p == "PORT")
        || (0..parts.len()).any(|i| {
            (at(i) == Some("SERVICE") && matches!(at(i + 1), Some("HOST" | "PORT")))
                || (at(i) == Some("PORT") && numeric(i + 1))
        })
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn orchestrator_variables_are_not_configuration() {
        use super::injected_by_orchestrator as injected;
        for k in [
            "PORT",
            "PORT_7777_TCP",
            "PORT_7777_TCP_ADDR",
            "PORT_7777_TCP_PROTO",
            "SERVICE_HOST",
            "SERVICE_PORT",
            "SERVICE_PORT_WS",
            "DB_SERVICE_HOST",
            "DB_PORT",
            "DB_PORT_5432_TCP_PORT",
        ] {
            assert!(injected(k), "{k}");
        }
        for k in [
            "LISTEN",
            "LOG",
            "DATABASE_URL",
            "LIMITS__MAX_LIMIT",
            "LISTN",
            "P_GATED_KINDS",
        ] {
            assert!(!injected(k), "{k}");
        }
    }

    #[test]
    fn listen_addresses_parse_with_useful_errors() {
        use super::{parse_listen, parse_listen_list};
        assert_eq!(parse_listen_list("127.0.0.1:1,[::1]:2").unwrap().len(), 2);
        assert!(parse_listen("7778").unwrap_err().contains("host:port"));
        assert!(parse_listen("localhost").unwrap_err().contains("host:port"));
        assert_eq!(parse_listen("[::]:7777").unwrap().port(), 7777);
    }

    #[test]
    fn defaults_validate() {
        assert_eq!(Config::default().validate(), Ok(()));
    }

    #[test]
    fn shutdown_grace_in_seconds_replaces_milliseconds() {
        use std::time::Duration;
        let mut c = Config::default();
        assert_eq!(c.shutdown_grace(), Duration::from_millis(5_000));
        c.shutdown_grace_secs = Some(20);
        assert_eq!(c.shutdown_grace(), Duration::from_secs(20));
        c.shutdown_grace_secs = Some(601);
        assert!(c.validate().unwrap_err().contains("at most 600 s"));
    }

    #[test]
    fn call_writers_leave_connections_for_the_rest() {
        let mut cfg = Config::default();
        cfg.writer.call_writers = 0;
        assert!(cfg.validate().is_err());
        cfg.writer.call_writers = cfg.postgres.pool_size as usize - 1;
        assert!(cfg.validate().is_err());
        cfg.writer.call_writers = cfg.postgres.pool_size as usize - 2;
        assert_eq!(cfg.validate(), Ok(()));
    }
}
