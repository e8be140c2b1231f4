//! The settings of each part of the relay: SQLite, PostgreSQL, the
//! writers, deliveries, workflows and webhooks.

use serde::{Deserialize, Serialize};

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
            checkpoint_interval_ms: 1_000,
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
    /// A caller's calls all go to the same writer. Default: the machine's
    /// cores, 2 to 4 ([`default_call_writers`]).
    pub call_writers: usize,
}

/// The call writers a machine gets by default: one a core, at least 2
/// and at most 4. Each writer is a thread that spends most of its time
/// waiting for PostgreSQL's answers, and wakes for each of them: on two
/// cores shared with PostgreSQL, 2 writers delivered 896-1,201
/// deliveries/s (median 1,086) where 4 delivered 818-1,008 (median 835)
/// and 1 786-794 (`bench --backend postgres --only delivery --rounds 1`,
/// alternated; docs/performance.md); more cores than 4 gain
/// little, since a caller's calls stay on one writer and the writers
/// share the advisory locks.
pub fn default_call_writers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 4)
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            event_queue: 8_192,
            event_batch: 512,
            event_batch_bytes: 1024 * 1024,
            call_queue: 4_096,
            call_batch: 64,
            call_writers: default_call_writers(),
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
    /// Most deliveries one agent may hold claimed at once in a community
    /// (0: no cap). A claim over it finds nothing to claim.
    pub agent_concurrency: u32,
    /// Mentions one agent takes in a community in the last hour, and in
    /// the last day; a mention over either is refused with a notice.
    pub mentions_per_hour: u32,
    pub mentions_per_day: u32,
    /// Mentions one agent takes from one sender in the last hour (0: no
    /// cap of its own).
    pub mentions_per_sender_per_hour: u32,
    /// How long a conversation must be quiet before an agent may claim
    /// its mentions as one turn (seconds, by the database clock; 0: at
    /// once). A mention's row is due this long after it is stored.
    pub mention_debounce_secs: u32,
    /// The longest a mention waits for its conversation to go quiet
    /// (seconds): one stored this long ago is claimable, with its turn,
    /// even while the conversation goes on.
    pub mention_max_wait_secs: u32,
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
            agent_concurrency: 0,
            mentions_per_hour: 120,
            mentions_per_day: 1_000,
            mentions_per_sender_per_hour: 0,
            mention_debounce_secs: 2,
            mention_max_wait_secs: 10,
        }
    }
}

impl DeliveryConfig {
    /// The claimed rows one agent may hold in one community
    /// (`agent_concurrency`; `None`: no cap).
    pub fn agent_cap(&self) -> Option<i64> {
        (self.agent_concurrency > 0).then_some(i64::from(self.agent_concurrency))
    }

    /// By the database clock `now`, when a mention stored then has waited
    /// `mention_max_wait_secs` for its conversation to go quiet.
    pub fn waited_since(&self, now: i64) -> i64 {
        now.saturating_sub(i64::from(self.mention_max_wait_secs))
    }

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
    /// How far behind the primary a standby of `read_database_urls` may
    /// be and still serve reads (10 to 10,000).
    pub standby_max_lag_ms: u64,
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
            standby_max_lag_ms: 1_000,
        }
    }
}
