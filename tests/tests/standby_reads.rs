//! Reads from a hot standby (`read_database_urls`): a primary and an
//! asynchronous standby made by the test (`pg_basebackup`), a relay
//! writing to the primary and reading from the standby while it is
//! within `postgres.standby_max_lag_ms`. The standby's replay is paused
//! to make it lag on demand: a client still reads its own writes, and
//! another client the events published since the standby stopped (the
//! hub adds them); a deletion the standby has not replayed sends the
//! read to the primary; past the bound every read goes to the primary.
//! Where each read went is counted in `relay_reads_total{from}`.

use std::sync::Arc;

use nostr::prelude::Keys;
use serde_json::json;
use tests::metrics::{scrape, value};
use tests::pg::{own_server, PgServer};
use tests::relay::Store;
use tests::workflow::eventually;
use tests::{event, Backend, Client, Relay, RelayOptions};

/// A primary, its standby, and a relay reading from the standby.
struct Setup {
    primary: Arc<PgServer>,
    standby: PgServer,
    db: String,
    relay: Relay,
}

fn start(max_lag_ms: u64) -> Setup {
    let primary = Arc::new(own_server());
    let store = Store::new(&Backend::Postgres(primary.clone()));
    let db = store
        .database_url
        .rsplit('/')
        .next()
        .expect("a database")
        .to_string();
    let standby = primary.standby(false).expect("a standby");
    let config_toml = format!(
        "metrics_listen = \"127.0.0.1:0\"\n\
         read_database_urls = [\"postgres://postgres@127.0.0.1:{}/{db}\"]\n\
         [postgres]\nstandby_max_lag_ms = {max_lag_ms}\n",
        standby.port
    );
    let relay = Relay::start_with(
        store,
        RelayOptions {
            config_toml,
            ..Default::default()
        },
    );
    Setup {
        primary,
        standby,
        db,
        relay,
    }
}

/// Reads counted so far as gone to `from` (`primary`, `standby`).
async fn reads(relay: &Relay, from: &str) -> f64 {
    value(&scrape(relay).await, "relay_reads_total", &[("from", from)])
}

/// Waits until a REQ (from a client that never wrote) is read from the
/// standby: the relay has seen it catch up.
async fn standby_serving(relay: &Relay) {
    eventually(|| async {
        let before = reads(relay, "standby").await;
        let mut c = Client::connect(&relay.ws_url()).await;
        c.req("probe", vec![json!({"kinds": [1], "limit": 1})]).await;
        (reads(relay, "standby").await > before).then_some(())
    })
    .await;
}

/// The ids a REQ for `filter` returns.
async fn ids(c: &mut Client, filter: serde_json::Value) -> Vec<String> {
    let got = c.req("q", vec![filter]).await.events();
    got.iter().map(|e| e.id.to_hex()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn a_lagging_standby_serves_reads_without_hiding_recent_writes() {
    let s = start(5_000);
    standby_serving(&s.relay).await;
    // Each client sees its own event right after its OK, whether the
    // standby has replayed it yet or not, and so does another client.
    let keys = Keys::generate();
    let mut writer = Client::connect(&s.relay.ws_url()).await;
    let mut reader = Client::connect(&s.relay.ws_url()).await;
    for i in 0..20 {
        let ev = event(&keys, 1, &format!("note {i}"), &[]);
        writer.publish_ok(&ev).await;
        let id = ev.id.to_hex();
        assert_eq!(
            ids(&mut writer, json!({"ids": [id]})).await,
            vec![id.clone()],
            "own write {i}"
        );
        assert_eq!(
            ids(&mut reader, json!({"ids": [id]})).await,
            vec![id.clone()],
            "other's write {i}"
        );
    }
    // The standby stops replaying: within the bound it still serves the
    // reads of a client that never wrote, the hub adding what it lacks.
    s.standby
        .psql(&s.db, "SELECT pg_wal_replay_pause()")
        .expect("pause");
    let paused = std::time::Instant::now();
    let late = event(&keys, 1, "after the pause", &[]);
    writer.publish_ok(&late).await;
    let late_id = late.id.to_hex();
    let held = |server: &PgServer| {
        let q = format!("SELECT COUNT(*) FROM events WHERE id = '\\x{late_id}'::bytea");
        server.psql(&s.db, &q).expect("count")
    };
    assert_eq!(held(&s.standby), "0", "the paused standby has the event");
    assert_eq!(held(&s.primary), "1");
    let before = reads(&s.relay, "standby").await;
    let author = json!({"authors": [keys.public_key().to_hex()], "kinds": [1]});
    let got = ids(&mut reader, author.clone()).await;
    assert!(
        got.contains(&late_id),
        "the event published since the pause is missing"
    );
    assert_eq!(got.len(), 21, "each event once");
    assert!(
        reads(&s.relay, "standby").await > before,
        "that REQ was not read from the standby"
    );
    assert!(
        paused.elapsed().as_millis() < 5_000,
        "the test was too slow to be within the bound"
    );
    // A COUNT, with no live part to add the missing event, goes to the
    // primary while the hub knows of one the standby may lack.
    assert_eq!(reader.count("n", vec![author.clone()]).await, Ok(21));
    // A deletion the standby has not replayed: the hub must not add the
    // event it deleted; the read goes to the primary.
    let deletion = event(&keys, 5, "", &[&["e", &late_id]]);
    writer.publish_ok(&deletion).await;
    let (standby_before, primary_before) =
        (reads(&s.relay, "standby").await, reads(&s.relay, "primary").await);
    let mut fresh = Client::connect(&s.relay.ws_url()).await;
    assert!(
        ids(&mut fresh, json!({"ids": [late_id]})).await.is_empty(),
        "a deleted event was served"
    );
    assert_eq!(reads(&s.relay, "standby").await, standby_before);
    assert!(reads(&s.relay, "primary").await > primary_before);
    assert!(
        paused.elapsed().as_millis() < 5_000,
        "the test was too slow to be within the bound"
    );
    s.standby
        .psql(&s.db, "SELECT pg_wal_replay_resume()")
        .expect("resume");
    standby_serving(&s.relay).await;
    // Paused again while the primary writes (anything: the log is the
    // server's): past the bound every read goes to the primary.
    s.standby
        .psql(&s.db, "SELECT pg_wal_replay_pause()")
        .expect("pause");
    s.primary
        .psql("postgres", "CREATE TABLE lag_maker AS SELECT 1 AS x")
        .expect("a write on the primary");
    eventually(|| async {
        let standby_before = reads(&s.relay, "standby").await;
        let primary_before = reads(&s.relay, "primary").await;
        let mut c = Client::connect(&s.relay.ws_url()).await;
        let got = ids(&mut c, author.clone()).await;
        assert_eq!(got.len(), 20, "the deleted event is gone, the others are there");
        let standby_after = reads(&s.relay, "standby").await;
        let primary_after = reads(&s.relay, "primary").await;
        (standby_after == standby_before && primary_after > primary_before).then_some(())
    })
    .await;
    s.standby
        .psql(&s.db, "SELECT pg_wal_replay_resume()")
        .expect("resume");
    standby_serving(&s.relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn a_standby_that_dies_fails_no_read() {
    let s = start(1_000);
    let keys = Keys::generate();
    let mut writer = Client::connect(&s.relay.ws_url()).await;
    for i in 0..5 {
        writer
            .publish_ok(&event(&keys, 1, &format!("note {i}"), &[]))
            .await;
    }
    standby_serving(&s.relay).await;
    s.standby.kill();
    // The reads in flight and the next ones (the standby still counted as
    // caught up until its next check) fall back to the primary: each
    // answered in full, none refused.
    let author = json!({"authors": [keys.public_key().to_hex()]});
    for _ in 0..20 {
        let mut c = Client::connect(&s.relay.ws_url()).await;
        assert_eq!(ids(&mut c, author.clone()).await.len(), 5);
        assert_eq!(c.count("n", vec![author.clone()]).await, Ok(5));
    }
    assert!(reads(&s.relay, "primary").await > 0.0);
}
