//! Relay configuration: defaults, then a TOML file, then `RELAY_*`
//! environment variables, then command-line flags (each layer overrides the
//! previous one). Every limit the relay enforces lives here, with its unit in
//! its name, and is advertised in NIP-11.

use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// The whole relay configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Addresses the HTTP/WebSocket server listens on (`host:port`, IPv6
    /// as `[::1]:7777`): one, or a list.
    pub listen: Listen,
    /// `sqlite://path` (embedded, default) or `postgres://…`.
    pub database_url: String,
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
    /// How often the gauges read from the database (deliveries and runs by
    /// status, the oldest pending delivery) are refreshed.
    pub metrics_interval_secs: u64,
    /// Embedded SQLite settings.
    pub sqlite: SqliteConfig,
    /// PostgreSQL settings.
    pub postgres: PostgresConfig,
    /// Group commit: queues and batch sizes of the store's writers.
    pub writer: WriterConfig,
    /// How long a graceful shutdown waits for connections to close.
    pub shutdown_grace_ms: u64,
    /// How often expired (NIP-40) events are purged.
    pub expiry_sweep_interval_secs: u64,
    /// How long `serve` waits at start for an unreachable database.
    pub startup_db_wait_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: Listen::default(),
            database_url: "sqlite://relay.db".into(),
            log: None,
            log_format: LogFormat::Text,
            name: "nostr relay with durable agent delivery".into(),
            description: "Multi-community Nostr relay with workflows and managed-agent delivery.".into(),
            admins: Vec::new(),
            access: Access::default(),
            p_gated_kinds: vec![
                protocol::kinds::ENCRYPTED_DM,
                protocol::kinds::WAKE_HINT,
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
            metrics_interval_secs: 15,
            sqlite: SqliteConfig::default(),
            postgres: PostgresConfig::default(),
            writer: WriterConfig::default(),
            shutdown_grace_ms: 5_000,
            expiry_sweep_interval_secs: 60,
            startup_db_wait_secs: 30,
        }
    }
}

/// The community served with no setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultCommunity {
    /// Create it on start when missing.
    pub enabled: bool,
    /// Its id.
    pub id: String,
    /// Hosts bound to it (a host without a port matches any port).
    pub hosts: Vec<String>,
    /// Its public relay URL (its scheme is the one NIP-42 and NIP-98 expect).
    pub relay_url: String,
}

impl Default for DefaultCommunity {
    fn default() -> Self {
        Self {
            enabled: true,
            id: "default".into(),
            hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            relay_url: "ws://127.0.0.1:7777".into(),
        }
    }
}

/// Who may create channels and which kinds need membership.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelPolicy {
    /// `"authenticated"`: any author authenticated (NIP-42) on the connection;
    /// `"allowlist"`: only the `creators`, also authenticated.
    pub create: String,
    /// Hex pubkeys allowed to create channels when `create = "allowlist"`.
    pub creators: Vec<String>,
    /// Kinds that need membership when they carry an `h` tag; empty means
    /// every kind (join requests and channel creation never do).
    pub membership_kinds: Vec<u16>,
}

impl Default for ChannelPolicy {
    fn default() -> Self {
        Self {
            create: "authenticated".into(),
            creators: Vec::new(),
            membership_kinds: Vec::new(),
        }
    }
}

impl ChannelPolicy {
    /// Whether an `h`-tagged event of `kind` needs its author to be a member.
    pub fn requires_membership(&self, kind: u16) -> bool {
        use protocol::nip29::{CREATE_GROUP, JOIN_REQUEST};
        if kind == CREATE_GROUP || kind == JOIN_REQUEST {
            false
        } else {
            self.membership_kinds.is_empty() || self.membership_kinds.contains(&kind)
        }
    }

    /// Whether `pubkey` (hex) may create channels.
    pub fn may_create(&self, pubkey_hex: &str) -> bool {
        self.create == "authenticated" || self.creators.iter().any(|c| c.eq_ignore_ascii_case(pubkey_hex))
    }
}

/// Settings of one community.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommunitySettings {
    /// Overrides the top-level `[channels]` policy.
    pub channels: Option<ChannelPolicy>,
    /// Hosts (names or literal addresses, as written in step URLs) that
    /// this community's `call_webhook` steps may reach over plain `http`
    /// and at loopback, private, link-local or other non-public addresses.
    pub webhook_allow_hosts: Vec<String>,
    /// This community's admins (hex pubkeys), besides the relay-wide `admins`.
    pub admins: Vec<String>,
    /// Overrides the top-level `[access]` rules.
    pub access: Option<Access>,
}

/// Who may read and write a community over WebSocket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Access {
    /// REQ and COUNT need NIP-42 authentication first (`CLOSED auth-required:`).
    pub auth_required_for_reads: bool,
    /// EVENT needs NIP-42 authentication first (`OK false auth-required:`).
    pub auth_required_for_writes: bool,
    /// Only authors on the community's allow list (NIP-86 `allowpubkey`)
    /// and its admins may publish (`OK false restricted:`).
    pub writers_allowlist: bool,
}

/// Protocol limits. All are per connection unless the name says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest WebSocket message answered with an error rather than a close.
    /// Messages up to twice this size get a NOTICE; larger ones close the
    /// connection with status 1009.
    pub max_message_bytes: usize,
    /// Largest serialised event.
    pub max_event_bytes: usize,
    /// Most tags in one event.
    pub max_tags_per_event: usize,
    /// Longest value (any element) of one tag.
    pub max_tag_value_bytes: usize,
    /// Most open subscriptions on one connection.
    pub max_subscriptions: usize,
    /// Most filters in one REQ or COUNT.
    pub max_filters: usize,
    /// Most values in one filter field (`ids`, `authors`, `kinds`, each `#x`).
    pub max_filter_values: usize,
    /// Largest `limit` honoured; larger ones (and a missing `limit`) are clamped.
    pub max_limit: usize,
    /// Sustained EVENT messages per second.
    pub events_per_second: u32,
    /// Burst of EVENT messages allowed above the sustained rate.
    pub events_burst: u32,
    /// EVENTs of one connection being verified or stored at once; beyond,
    /// the connection is not read until some are answered. A client that
    /// pipelines more waits (TCP backpressure). Bounds a connection's
    /// pending events to this × `max_event_bytes`.
    pub max_inflight_events: usize,
    /// Bytes queued for a connection before it is disconnected as a slow reader.
    pub max_outbound_bytes: usize,
    /// How far in the future `created_at` may be: 900 (the default, as
    /// strfry's and nostr-rs-relay's) refuses what is more than 15 minutes
    /// ahead, so that no event sorts first in every newest-first feed for
    /// years. NIP-01 sets no bound; a larger value lifts it.
    pub max_future_secs: u64,
    /// How old a NIP-42 AUTH event may be.
    pub auth_max_age_secs: u64,
    /// Largest HTTP request body (NIP-98 API calls).
    pub max_http_body_bytes: usize,
    /// Read buffer of each WebSocket, allocated when it opens (most of an
    /// idle connection's memory; larger messages still arrive, in more reads).
    pub ws_read_buffer_bytes: usize,
    /// Sustained HTTP API calls per second per (community, pubkey); beyond: 429.
    pub api_requests_per_second: u32,
    /// Burst of HTTP API calls above the sustained rate.
    pub api_burst: u32,
    /// Events buffered per community for live fan-out; a connection that
    /// falls this far behind is disconnected (it could not be served in order).
    pub fanout_buffer_events: usize,
    /// Bytes of stored events one REQ sends at most, over all its filters;
    /// past it the REQ ends with EOSE, as if its `limit` had been reached.
    pub max_req_bytes: usize,
    /// Most events one NIP-77 sync may reconcile (40 bytes of memory each
    /// while it is open); a filter matching more is refused with NEG-ERR.
    pub max_sync_events: usize,
    /// Most NIP-77 syncs open at once on one connection.
    pub max_sync_sessions: usize,
    /// Bytes queued for all connections together (relay-wide). Past it,
    /// stored results wait for room, and a connection that is behind
    /// (more than `outbound::KEEPING_UP_BYTES` queued) is disconnected rather than
    /// given more. A live event queued for many connections counts once.
    pub max_outbound_bytes_total: usize,
    /// Open TCP connections (HTTP and WebSocket) from one IP address; past
    /// it a connection is answered 429 and closed.
    pub max_connections_per_ip: u32,
    /// Addresses the per-IP cap does not apply to (by default loopback:
    /// a reverse proxy on the same machine brings every client from there).
    pub connection_cap_exempt: Vec<std::net::IpAddr>,
    /// Live subscription filters with a NIP-50 `search` one connection
    /// may hold, and the words of their searches together.
    pub max_live_search_filters_per_connection: usize,
    /// Words of those searches, together, on one connection.
    pub max_live_search_words_per_connection: usize,
    /// Live search filters of every connection of the relay process.
    pub max_live_search_filters: usize,
    /// Words of those searches, together, relay-wide.
    pub max_live_search_words: usize,
    /// Reverse proxies whose `X-Forwarded-For` names the caller (by
    /// default none: the connection's own address is the caller's).
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// How long a connection may take to send a complete request head,
    /// the first one or the next one on a kept-alive connection (so also
    /// the idle time before a WebSocket upgrade).
    pub header_read_timeout_ms: u64,
    /// How long an HTTP request body may take to arrive.
    pub body_read_timeout_ms: u64,
    /// Failed webhook calls (wrong or missing secret) per second to one
    /// hook from one caller address, sustained; beyond, that caller gets
    /// 429 for that hook before its secret is looked at. Other hooks, and
    /// other callers where their address is known, are not affected.
    pub webhook_failures_per_second: u32,
    /// Burst of failed webhook calls to one hook from one caller above the
    /// rate.
    pub webhook_failures_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 256 * 1024,
            max_event_bytes: 128 * 1024,
            max_tags_per_event: 2_000,
            max_tag_value_bytes: 1_024,
            max_subscriptions: 64,
            max_filters: 16,
            max_filter_values: 1_000,
            max_limit: 1_000,
            events_per_second: 100,
            events_burst: 200,
            max_inflight_events: 256,
            max_outbound_bytes: 8 * 1024 * 1024,
            max_future_secs: 900,
            auth_max_age_secs: 600,
            fanout_buffer_events: 16_384,
            max_http_body_bytes: 1024 * 1024,
            ws_read_buffer_bytes: 16 * 1024,
            api_requests_per_second: 50,
            api_burst: 200,
            max_req_bytes: 16 * 1024 * 1024,
            max_sync_events: 1_000_000,
            max_sync_sessions: 2,
            max_outbound_bytes_total: 256 * 1024 * 1024,
            max_connections_per_ip: 256,
            connection_cap_exempt: vec![
                std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::Ipv6Addr::LOCALHOST.into(),
            ],
            trusted_proxies: Vec::new(),
            max_live_search_filters_per_connection: 8,
            max_live_search_words_per_connection: 64,
            max_live_search_filters: 1_024,
            max_live_search_words: 8_192,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            webhook_failures_per_second: 1,
            webhook_failures_burst: 20,
        }
    }
}

/// Embedded SQLite settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SqliteConfig {
    /// How long a writer waits for the database lock.
    pub busy_timeout_ms: u64,
    /// `normal` (durable across process crashes, the default) or `full`
    /// (also across power loss, at a cost in write latency).
    pub synchronous: String,
    /// Reader connections in the pool, and as many REQ reader threads with
    /// a connection each (`persistence::readers`); one writer besides.
    pub pool_size: u32,
    /// Bytes of the database file read through a memory map (0: none).
    pub mmap_size_bytes: u64,
    /// Page cache per connection, in KiB.
    pub cache_size_kib: u32,
    /// How often the background task checkpoints the WAL into the database.
    pub checkpoint_interval_ms: u64,
    /// WAL pages after which a commit checkpoints by itself (the backstop
    /// when the background checkpoints cannot keep up).
    pub wal_autocheckpoint_pages: u32,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            busy_timeout_ms: 5_000,
            synchronous: "normal".into(),
            pool_size: 8,
            mmap_size_bytes: 1 << 30,
            cache_size_kib: 16 * 1024,
            checkpoint_interval_ms: 100,
            wal_autocheckpoint_pages: 100_000,
        }
    }
}

/// The store's two group-commit writers: one for plain events, one for the
/// small calls of the delivery API and channel events. Each takes what is
/// queued (up to its batch size) into one transaction; senders beyond the
/// queue's bound wait (backpressure).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WriterConfig {
    /// Plain events waiting for the event writer, at most.
    pub event_queue: usize,
    /// Plain events in one write transaction, at most.
    pub event_batch: usize,
    /// Bytes of plain events (their JSON) in one write transaction, at
    /// most (one event always goes, whatever its size): a bound on the
    /// full-text indexing one batch does while it holds the write lock.
    pub event_batch_bytes: usize,
    /// Calls (NIP-98 auth records, claims, renews, operations, finishes,
    /// channel events) waiting for the call writer, at most.
    pub call_queue: usize,
    /// Calls in one write transaction, at most (each in its own savepoint;
    /// PostgreSQL keeps up to 64 subtransactions per transaction cheap).
    pub call_batch: usize,
    /// PostgreSQL: call writers running side by side, each with its own
    /// connection (SQLite has one write connection: always one writer).
    /// A caller's calls all go to the same writer.
    pub call_writers: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            event_queue: 8_192,
            event_batch: 512,
            event_batch_bytes: 1024 * 1024,
            call_queue: 4_096,
            call_batch: 64,
            call_writers: 4,
        }
    }
}

/// Managed-agent delivery (docs/protocol.md, "Deliveries").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Claims allowed per delivery (the attempt cap).
    pub max_attempts: u32,
    /// Backoff after a retry: `min(retry_cap_secs, retry_base_secs * 2^(attempt-1))`.
    pub retry_base_secs: u64,
    pub retry_cap_secs: u64,
    /// A delivery not delivered within this long of its creation expires.
    pub lifetime_secs: u64,
    /// Lease when a claim names none.
    pub default_lease_secs: u64,
    /// Longest lease a claim or renew may ask for.
    pub max_lease_secs: u64,
    /// Operations one attempt may record.
    pub max_operations_per_attempt: u32,
    /// How often the sweeper looks for expired rows and lapsed leases.
    pub sweep_interval_ms: u64,
    /// Most rows one sweep pass changes per community (the rest wait for the next pass).
    pub sweep_batch: u32,
    /// Most deliveries one list call returns.
    pub max_page: u32,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            retry_base_secs: 5,
            retry_cap_secs: 300,
            lifetime_secs: 24 * 3600,
            default_lease_secs: 60,
            max_lease_secs: 900,
            max_operations_per_attempt: 1_000,
            sweep_interval_ms: 1_000,
            sweep_batch: 200,
            max_page: 100,
        }
    }
}

impl DeliveryConfig {
    /// Backoff before attempt `attempt + 1`, after attempt `attempt` (>= 1) asked to retry.
    pub fn backoff_secs(&self, attempt: u32) -> u64 {
        let exp = attempt.saturating_sub(1).min(62);
        self.retry_base_secs
            .saturating_mul(1u64 << exp)
            .min(self.retry_cap_secs)
    }
}

/// Workflow engine timing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkflowConfig {
    /// How often each process looks for runs to advance (runs started here
    /// are advanced at once; this catches the rest, e.g. after a crash).
    pub run_poll_interval_ms: u64,
    /// How often schedules are checked.
    pub schedule_poll_interval_ms: u64,
    /// Most runs advanced per poll.
    pub run_batch: u32,
    /// Most runs of one pass advanced at the same time (each in its own
    /// transactions; the steps of one run always one after another).
    pub concurrent_runs: usize,
    /// Largest webhook body.
    pub max_webhook_body_bytes: usize,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        Self {
            run_poll_interval_ms: 1_000,
            schedule_poll_interval_ms: 5_000,
            run_batch: 100,
            concurrent_runs: 4,
            max_webhook_body_bytes: 64 * 1024,
        }
    }
}

/// Outbound webhook calls and the key that seals workflow secrets.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// The secrets key file (created on first start); unset: beside an
    /// SQLite database, else `relay-secrets.key` in the working directory.
    pub secrets_key_file: Option<std::path::PathBuf>,
    /// Names pinned to addresses, used instead of DNS (like an
    /// `/etc/hosts` of the relay's own); the address checks apply to them
    /// as to any resolved address.
    pub resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Extra trusted root certificates (PEM) for `https` calls, besides the
    /// bundled web PKI roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Most calls in flight per relay process; more wait their turn.
    pub max_in_flight: usize,
    /// Most calls in flight for one community; its further calls wait,
    /// other communities' do not.
    pub max_in_flight_per_community: usize,
    /// Most calls in flight for one workflow owner within a community;
    /// its further calls wait, other owners' do not.
    pub max_in_flight_per_owner: usize,
    /// How long past a step's `timeout_secs` a call may stay unanswered
    /// before it counts as interrupted (its process died mid-call).
    pub call_grace_secs: u64,
    /// Longest wait to connect (within the step's timeout).
    pub connect_timeout_ms: u64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            secrets_key_file: None,
            resolve: std::collections::BTreeMap::new(),
            ca_file: None,
            max_in_flight: 64,
            max_in_flight_per_community: 32,
            max_in_flight_per_owner: 8,
            call_grace_secs: 15,
            connect_timeout_ms: 5_000,
        }
    }
}

/// Where the secrets key file is when the configuration does not say:
/// beside an SQLite database file, else in the working directory.
pub fn default_secrets_key_path(database_url: &str) -> std::path::PathBuf {
    use std::path::{Path, PathBuf};
    let file = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .map(|p| p.split('?').next().unwrap_or(p))
        .filter(|p| !p.is_empty() && !p.starts_with(":memory:"));
    match file.map(Path::new).and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("relay-secrets.key"),
        _ => PathBuf::from("relay-secrets.key"),
    }
}

/// PostgreSQL settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// Connections per relay process, for everything but REQ and COUNT.
    pub pool_size: u32,
    /// Connections per relay process for REQ and COUNT (with cached plans;
    /// reads never wait for, nor hold, the connections writes need).
    pub query_pool_size: u32,
    /// How long a request waits for a connection before answering `error:`.
    pub acquire_timeout_ms: u64,
    /// Server-side limit on any one statement.
    pub statement_timeout_ms: u64,
    /// Monthly event partitions kept ready ahead of the current month.
    pub partition_months_ahead: u32,
    /// How often partition maintenance runs.
    pub maintenance_interval_secs: u64,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            pool_size: 16,
            query_pool_size: 8,
            acquire_timeout_ms: 3_000,
            statement_timeout_ms: 10_000,
            partition_months_ahead: 3,
            maintenance_interval_secs: 6 * 3600,
        }
    }
}

/// The listen addresses: at least one, each `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen(pub Vec<SocketAddr>);

impl Default for Listen {
    /// Loopback on IPv4 and IPv6 (`localhost` resolves to either).
    fn default() -> Self {
        Self(vec![
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 7777)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 7777)),
        ])
    }
}

impl Listen {
    /// Whether these are the built-in addresses (an address of them that
    /// this machine lacks, such as IPv6 loopback, is skipped with a warning;
    /// a configured one that cannot be bound is an error).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Parses one listen address, saying what is expected when it is not
/// `host:port` (clap's "invalid socket address syntax" named neither).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    s.parse::<SocketAddr>().map_err(|_| {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            format!("listen address {s:?} has no host: use host:port, e.g. 127.0.0.1:{s}, 0.0.0.0:{s} or [::]:{s}")
        } else {
            format!("listen address {s:?} is not host:port (a numeric address and a port, IPv6 in brackets: [::1]:7777)")
        }
    })
}

/// Comma-separated `host:port` addresses (the form of a flag or an
/// environment variable).
pub fn parse_listen_list(s: &str) -> Result<Vec<SocketAddr>, String> {
    s.split(',')
        .filter(|a| !a.trim().is_empty())
        .map(parse_listen)
        .collect()
}

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let all: Vec<String> = self.0.iter().map(SocketAddr::to_string).collect();
        all.serialize(ser)
    }
}

impl<'de> Deserialize<'de> for Listen {
    /// `"127.0.0.1:7777"`, `"127.0.0.1:7777,[::1]:7777"` or a list of them.
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        let texts = match Form::deserialize(de)? {
            Form::One(s) => vec![s],
            Form::Many(v) => v,
        };
        let mut out = Vec::new();
        for t in &texts {
            out.extend(parse_listen_list(t).map_err(serde::de::Error::custom)?);
        }
        if out.is_empty() {
            return Err(serde::de::Error::custom(
                "listen needs at least one host:port address",
            ));
        }
        Ok(Listen(out))
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

    fn validate(&self) -> Result<(), String> {
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
        if self.sqlite.pool_size < 2 {
            return Err("sqlite.pool_size must be at least 2".into());
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
