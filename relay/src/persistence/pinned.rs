//! PostgreSQL pools of one connection, one for each store writer (the
//! event writer and the call writers), opened by the writer itself.
//!
//! Why: a writer runs on a thread of its own (`dedicated`), and a socket
//! is served by the I/O driver of the runtime that opened it. On the
//! shared main pool a writer mostly took connections that another thread
//! had opened (the relay's shared runtime, another writer, the engine), so
//! each answer from the server woke that thread first, and it the writer:
//! a wake-up more, and a wait behind whatever that thread was running, on
//! every statement of a transaction that holds locks. A pinned pool's
//! connection is opened by its writer's first acquire, on the writer's
//! thread, and no other task uses it (docs/performance.md, "Delivery on
//! PostgreSQL", has the figures before and after).
//!
//! The pinned pools count against `postgres.pool_size` (the main pool has
//! that many fewer), take the main pool's settings and its epoch (a
//! connection opened before a move to another host is not used again),
//! move with it (`primary::watch`) and close with it.

use std::sync::Mutex;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// One plan per statement: the writers' connections and the query pools'
/// (`persistence::postgres::open`).
pub(crate) const GENERIC_PLANS: &str = "force_generic_plan";

/// A writer's connection: the main pool's, with one plan per statement
/// (`plan_cache_mode = force_generic_plan`, as the query pools). A
/// writer's statements are the same few texts run thousands of times, and
/// PostgreSQL's own choice planned some again at every run: a batch's
/// claims (`delivery::claim::together`, one text for any number of
/// claims) at each of 2,054 runs, 0.7 ms a plan, with no gain in their
/// execution (docs/performance.md, "Delivery on PostgreSQL").
fn writer_options(main: &PgConnectOptions) -> PgConnectOptions {
    main.clone().options([("plan_cache_mode", GENERIC_PLANS)])
}

/// The main pool's settings for a pool of `size` connections.
type Settings = Box<dyn Fn(u32) -> PgPoolOptions + Send + Sync>;

/// The pinned pools of one store, made as its writers start.
pub struct Pinned {
    settings: Settings,
    /// At most `limit` (the writers the main pool left room for).
    made: Mutex<Vec<PgPool>>,
    limit: usize,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Pinned {
    pub(crate) fn new(settings: Settings, limit: usize) -> Self {
        Self {
            settings,
            made: Mutex::new(Vec::with_capacity(limit)),
            limit,
        }
    }

    /// A pool of one connection, opened when first acquired, to the host
    /// `main` uses; `main` itself once `limit` pools are made (a writer
    /// more than the main pool left room for shares it).
    pub fn make(&self, main: &PgPool) -> PgPool {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if made.len() >= self.limit {
            tracing::warn!(
                limit = self.limit,
                "no pinned connection left: a writer shares the main pool"
            );
            return main.clone();
        }
        // Read under the lock that `moved` takes: a move either happened
        // before (these are the new options) or updates this pool too.
        let pool = (self.settings)(1).connect_lazy_with(writer_options(&main.connect_options()));
        made.push(pool.clone());
        pool
    }

    /// Points every pinned pool at another host (the main pool's new
    /// options).
    pub(crate) fn moved(&self, options: &PgConnectOptions) {
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        for pool in made.iter() {
            pool.set_connect_options(writer_options(options));
        }
    }

    /// Closes every pinned pool (after their writers' last transaction).
    pub async fn close(&self) {
        let made: Vec<PgPool> = self.made.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for pool in made {
            pool.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn settings() -> Settings {
        Box::new(|size| PgPoolOptions::new().max_connections(size))
    }

    /// At most `limit` pools of one connection each, then the main pool;
    /// a move points every one made at the new host. (Lazy pools: no
    /// server is reached.)
    #[tokio::test]
    async fn pools_are_bounded_and_move_with_the_main_pool() {
        let first = PgConnectOptions::from_str("postgres://relay@first.invalid/db").unwrap();
        let main = PgPoolOptions::new().max_connections(7).connect_lazy_with(first);
        let pinned = Pinned::new(settings(), 2);
        let made: Vec<PgPool> = (0..3).map(|_| pinned.make(&main)).collect();
        let sizes: Vec<u32> = made.iter().map(|p| p.options().get_max_connections()).collect();
        assert_eq!(sizes, [1, 1, 7], "the third writer shares the main pool");
        let second = PgConnectOptions::from_str("postgres://relay@second.invalid/db").unwrap();
        main.set_connect_options(second.clone());
        pinned.moved(&second);
        for pool in &made {
            assert_eq!(pool.connect_options().get_host(), "second.invalid");
        }
        pinned.close().await;
        assert!(made[0].is_closed() && made[1].is_closed());
    }
}
