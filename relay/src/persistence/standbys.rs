//! Hot standbys that serve reads (`read_database_urls`): which one may
//! serve a read now, and how far behind the primary it is.
//!
//! Every [`CHECK_EVERY`] a watcher reads the primary's write-ahead log
//! position (`pg_current_wal_lsn()`), remembering when it asked, then each
//! standby's replayed position (`pg_last_wal_replay_lsn()`). A standby has
//! then replayed everything committed before the last of those instants
//! whose position it has reached: its *replayed-through* instant, exact
//! (a commit acknowledged before the primary was asked lies at or below
//! the position it answered) and free of the timestamp's flaw
//! (`pg_last_xact_replay_timestamp()` grows old on an idle primary though
//! the standby has everything). A standby serves a read while that
//! instant is within `postgres.standby_max_lag_ms` of now; one that fails
//! a read, stops answering, is no longer in recovery (promoted), or falls
//! behind, serves none until a later check says otherwise, and its reads
//! go to the primary. Which reads may go to a standby at all, and what a
//! reader must add for the events committed after the instant, is the
//! caller's rule (`ws::read`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::StoreError;
use crate::config::PostgresConfig;

/// How often the standbys' positions are checked.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);
/// How long one check of one server may take.
const CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// The largest `postgres.standby_max_lag_ms`.
pub const MAX_LAG_LIMIT: Duration = Duration::from_secs(10);
/// Positions of the primary remembered: enough to name an instant up to
/// [`MAX_LAG_LIMIT`] back, checks taking at least [`CHECK_EVERY`].
const SAMPLES_MAX: usize = (MAX_LAG_LIMIT.as_millis() / CHECK_EVERY.as_millis()) as usize + 2;

/// A position in the write-ahead log.
pub type Lsn = u64;

/// A `pg_lsn` in its text form (`16/B374D848`).
pub fn parse_lsn(text: &str) -> Option<Lsn> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

/// Where a read goes: the standby `index`, which has replayed every
/// commit acknowledged before `replayed_through`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    pub index: usize,
    pub replayed_through: Instant,
}

/// The primary's positions, oldest first, each with the instant before
/// it was asked (pure: [`Samples::replayed_through`] is the rule).
#[derive(Debug, Default)]
struct Samples {
    ring: VecDeque<(Instant, Lsn)>,
}

impl Samples {
    fn push(&mut self, asked_at: Instant, lsn: Lsn) {
        // A position behind the last: another primary (a promoted standby
        // that had not replayed all): the old positions say nothing of it.
        if self.ring.back().is_some_and(|&(_, last)| lsn < last) {
            self.ring.clear();
        }
        if self.ring.len() == SAMPLES_MAX {
            self.ring.pop_front();
        }
        self.ring.push_back((asked_at, lsn));
        debug_assert!(self.ring.len() <= SAMPLES_MAX);
    }

    /// The last instant whose position a standby at `replayed` has
    /// reached; `None`: behind every position remembered.
    fn replayed_through(&self, replayed: Lsn) -> Option<Instant> {
        self.ring
            .iter()
            .rev()
            .find(|&&(_, lsn)| lsn <= replayed)
            .map(|&(at, _)| at)
    }
}

/// One standby: its pool and its replayed-through instant (`None`: not
/// usable until the next check).
struct Standby {
    name: String,
    pool: PgPool,
    through: Mutex<Option<Instant>>,
}

impl Standby {
    fn through(&self) -> Option<Instant> {
        *self.through.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_through(&self, at: Option<Instant>) {
        *self.through.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }
}

/// The standbys of `read_database_urls`.
pub struct Standbys {
    list: Vec<Standby>,
    samples: Mutex<Samples>,
    max_lag: Duration,
    /// Round robin among the usable standbys.
    next: AtomicUsize,
}

impl std::fmt::Debug for Standbys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("Standbys").field("list", &names).finish()
    }
}

impl Standbys {
    /// Pools (`pool`'s options) for `standbys` (each a name for messages
    /// and its options), connected when first used, so a standby that is
    /// down does not stop the relay: reads go to the primary until it
    /// answers.
    pub fn open(
        standbys: Vec<(String, PgConnectOptions)>,
        pool: impl Fn() -> PgPoolOptions,
        cfg: &PostgresConfig,
    ) -> Arc<Standbys> {
        let list = standbys
            .into_iter()
            .map(|(name, opts)| Standby {
                name,
                pool: pool().connect_lazy_with(opts.application_name("relay-reads")),
                through: Mutex::new(None),
            })
            .collect();
        Arc::new(Standbys {
            list,
            samples: Mutex::new(Samples::default()),
            max_lag: Duration::from_millis(cfg.standby_max_lag_ms),
            next: AtomicUsize::new(0),
        })
    }

    /// A standby within the lag bound to serve a read, if any (in turn).
    pub fn pick(&self) -> Option<Replica> {
        let n = self.list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|k| (start + k) % n).find_map(|index| {
            let through = self.list[index].through()?;
            (through.elapsed() <= self.max_lag).then_some(Replica {
                index,
                replayed_through: through,
            })
        })
    }

    pub fn pool(&self, index: usize) -> &PgPool {
        &self.list[index].pool
    }

    /// A read on standby `index` failed: it serves none until the next
    /// check finds it well.
    pub fn failed(&self, index: usize, error: &StoreError) {
        let s = &self.list[index];
        tracing::warn!(standby = %s.name, %error, "a read on a standby failed; reading from the primary");
        s.set_through(None);
    }

    /// How far behind each standby is (`None`: not usable), in the order
    /// of `read_database_urls`.
    pub fn lags(&self) -> Vec<Option<Duration>> {
        self.list
            .iter()
            .map(|s| s.through().map(|t| t.elapsed()))
            .collect()
    }

    /// Checks the standbys every [`CHECK_EVERY`] against `primary` (see
    /// the module's doc). Ends when `primary` is closed.
    pub async fn watch(self: Arc<Self>, primary: PgPool) {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if primary.is_closed() {
                for s in &self.list {
                    s.pool.close().await;
                }
                return;
            }
            let asked_at = Instant::now();
            if let Some(lsn) = position(&primary, "SELECT pg_current_wal_lsn()::text").await {
                self.samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(asked_at, lsn);
            }
            let checks = self.list.iter().map(|s| position(&s.pool, REPLAYED));
            let replayed = futures_util::future::join_all(checks).await;
            let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            for (s, lsn) in self.list.iter().zip(replayed) {
                s.set_through(lsn.and_then(|l| samples.replayed_through(l)));
            }
        }
    }
}

/// A standby's replayed position; NULL once it is no standby (promoted:
/// the position it replayed stays, but it is not following anymore).
const REPLAYED: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END";

/// A position `sql` reads on `pool`; `None` when it fails, takes longer
/// than [`CHECK_TIMEOUT`], or is NULL (a replay position asked of a
/// server that is not a standby).
async fn position(pool: &PgPool, sql: &'static str) -> Option<Lsn> {
    let read = sqlx::query_scalar::<_, Option<String>>(sql).fetch_one(pool);
    match tokio::time::timeout(CHECK_TIMEOUT, read).await {
        Ok(Ok(Some(text))) => parse_lsn(&text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse_as_postgresql_writes_them() {
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374_D848));
        assert_eq!(parse_lsn("16"), None);
        assert_eq!(parse_lsn("x/1"), None);
        assert!(parse_lsn("1/0") > parse_lsn("0/FFFFFFFF"));
    }

    #[test]
    fn a_standby_is_through_the_last_instant_whose_position_it_reached() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Samples::default();
        assert_eq!(s.replayed_through(100), None, "nothing known yet");
        s.push(at(0), 100);
        s.push(at(100), 200);
        s.push(at(200), 200); // idle: the same position
        s.push(at(300), 350);
        assert_eq!(s.replayed_through(99), None);
        assert_eq!(s.replayed_through(100), Some(at(0)));
        assert_eq!(s.replayed_through(250), Some(at(200)), "idle instants count");
        assert_eq!(s.replayed_through(350), Some(at(300)));
        assert_eq!(s.replayed_through(9_999), Some(at(300)));
        // Another primary, behind: the old positions are forgotten.
        s.push(at(400), 300);
        assert_eq!(s.replayed_through(350), Some(at(400)));
        assert_eq!(s.replayed_through(299), None);
    }

    #[test]
    fn the_positions_remembered_are_bounded() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        for i in 0..(SAMPLES_MAX as u64 * 3) {
            s.push(t0 + Duration::from_millis(i), i);
        }
        assert_eq!(s.ring.len(), SAMPLES_MAX);
        assert_eq!(s.replayed_through(0), None, "the oldest were dropped");
    }
}
