//! Which host of a database URL the pools use (`persistence::hosts`), and
//! following it: with several hosts, a watcher checks the host in use
//! every [`WATCH_EVERY`]; when it stops answering, or turns read-only
//! while only a writable host will do (the primary was demoted), the
//! hosts are probed again in order and the pools (main, query, and the
//! writers' pinned ones) move to the one found.
//! Connections opened before the move are dropped when next taken from
//! a pool ([`Epoch`]), so no write goes to the old host after it; the
//! LISTEN connection reconnects through the pool. Until a host is found,
//! statements fail (writes answer `error:`) and the readiness probe says
//! not ready.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::Connection;

use super::hosts::{redacted, Hosts};
use super::pinned::Pinned;
use super::StoreError;

/// How long choosing a host waits for one host's answer.
const HOST_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the watcher checks the host in use.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long the watcher's check of the host in use may take.
const WATCH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of `hosts` the relay uses: the first that accepts a connection,
/// or, when only a writable one will do, the first whose
/// `transaction_read_only` is `off` (a primary, not a standby). A single
/// host that need not be writable is taken without a probe: the pools
/// say why it cannot be reached. `Unreachable` names each host's reason.
pub async fn choose_host(hosts: &Hosts) -> Result<usize, StoreError> {
    if hosts.urls.len() == 1 && !hosts.writable_only {
        return Ok(0);
    }
    let mut why = Vec::with_capacity(hosts.urls.len());
    for (i, url) in hosts.urls.iter().enumerate() {
        let reason = match probe(url, hosts.writable_only).await {
            Ok(()) => return Ok(i),
            Err(reason) => reason,
        };
        why.push(format!("{}: {reason}", redacted(url)));
    }
    let wanted = if hosts.writable_only {
        "a writable host"
    } else {
        "a host"
    };
    Err(StoreError::Unreachable(format!(
        "{wanted} among {}",
        why.join("; ")
    )))
}

/// Whether the server at `url` answers (and accepts writes, when
/// `writable` asks it): `Err` says why not.
async fn probe(url: &str, writable: bool) -> Result<(), String> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| e.to_string())?;
    let check = async {
        let mut conn = PgConnection::connect_with(&opts).await?;
        let read_only = read_only(&mut conn).await;
        let _ = conn.close().await;
        read_only
    };
    match tokio::time::timeout(HOST_PROBE_TIMEOUT, check).await {
        Err(_) => Err(format!("no answer within {HOST_PROBE_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(true)) if writable => Err("read-only (a standby)".into()),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Whether the session is read-only (libpq's test for `read-write`).
async fn read_only<'c, E>(conn: E) -> Result<bool, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let v: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(conn)
        .await?;
    Ok(v != "off")
}

/// When the pools last moved to another host, so that a connection
/// opened before is not used again.
#[derive(Debug)]
pub struct Epoch {
    base: Instant,
    /// Nanoseconds from `base` to the last move; 0: never moved.
    moved_ns: AtomicU64,
}

impl Epoch {
    pub fn new() -> Arc<Epoch> {
        Arc::new(Epoch {
            base: Instant::now(),
            moved_ns: AtomicU64::new(0),
        })
    }

    /// Whether a connection `age` old was opened before the last move.
    pub fn predates_move(&self, age: Duration) -> bool {
        let moved = self.moved_ns.load(Ordering::Acquire);
        if moved == 0 {
            return false;
        }
        let since = self.base.elapsed().saturating_sub(Duration::from_nanos(moved));
        age > since
    }

    fn moved(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.moved_ns.store(ns.max(1), Ordering::Release);
    }
}

/// The pools of a URL with several hosts, and the host they use.
pub struct Following {
    pub hosts: Hosts,
    /// Each host's options for the main pool and the query pool.
    pub options: Vec<(PgConnectOptions, PgConnectOptions)>,
    pub current: AtomicUsize,
    pub epoch: Arc<Epoch>,
}

/// The pools that move together.
pub struct Pools {
    pub main: PgPool,
    pub queries: PgPool,
    pub pinned: Arc<Pinned>,
}

/// Checks the host in use every [`WATCH_EVERY`] and moves the pools to
/// another when it fails (see the module's doc). Ends when the main pool
/// is closed.
pub async fn watch(f: Arc<Following>, pools: Pools) {
    let Pools {
        main,
        queries,
        pinned,
    } = pools;
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if main.is_closed() {
            return;
        }
        let check = tokio::time::timeout(WATCH_CHECK_TIMEOUT, read_only(&main)).await;
        let healthy = matches!(check, Ok(Ok(ro)) if !(ro && f.hosts.writable_only));
        if healthy {
            continue;
        }
        let now = f.current.load(Ordering::Acquire);
        match choose_host(&f.hosts).await {
            Ok(i) if i == now => {}
            Ok(i) => {
                let (m, q) = &f.options[i];
                main.set_connect_options(m.clone());
                pinned.moved(m);
                queries.set_connect_options(q.clone());
                f.current.store(i, Ordering::Release);
                f.epoch.moved();
                tracing::warn!(
                    from = %redacted(&f.hosts.urls[now]),
                    to = %redacted(&f.hosts.urls[i]),
                    "the database host in use failed; moved to another"
                );
            }
            Err(e) => tracing::warn!(error = %e, "no database host to move to yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_opened_before_a_move_are_not_used() {
        let e = Epoch::new();
        assert!(!e.predates_move(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(20));
        e.moved();
        // Opened 1 hour ago: before the move; opened just now: after it.
        assert!(e.predates_move(Duration::from_secs(3600)));
        assert!(!e.predates_move(Duration::ZERO));
    }
}
