//! PostgreSQL-specific behaviour: several relay processes on one database,
//! a database restart under a running relay, time partitions, tag indexing,
//! plans that do not depend on the statistics of the moment.

use std::sync::Arc;
use std::time::Duration;

use nostr::prelude::Keys;
use serde_json::json;
use tests::relay::Store;
use tests::workflow::{claim, deliveries, eventually, on_message, Fixture};
use tests::{event, Backend, Client, Relay, RelayOptions};

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn two_processes_share_live_events_exactly_once() {
    let backend = Backend::postgres();
    let store = Store::new(&backend);
    let a = Relay::start_with(store.clone(), RelayOptions::default());
    let b = Relay::start_with(store.clone(), RelayOptions::default());
    let k = Keys::generate();

    // A subscriber on B receives, once, an event published on A.
    let mut sub_b = Client::connect(&b.ws_url()).await;
    sub_b
        .req(
            "s",
            vec![json!({"authors": [hex(&k)], "kinds": [1]}), json!({"kinds": [1]})],
        )
        .await
        .events();
    let mut pub_a = Client::connect(&a.ws_url()).await;
    let e = event(&k, 1, "from A", &[]);
    pub_a.publish_ok(&e).await;
    assert_eq!(sub_b.next_event("s").await.id, e.id);
    sub_b.expect_silence(Duration::from_millis(500)).await;

    // Ephemeral events cross processes too.
    sub_b.req("eph", vec![json!({"kinds": [20002]})]).await.events();
    let eph = event(&k, 20002, "ephemeral from A", &[]);
    pub_a.publish_ok(&eph).await;
    assert_eq!(sub_b.next_event("eph").await.id, eph.id);

    // A p-gated event published on A reaches only its authenticated target on B.
    let target = Keys::generate();
    let mut right = Client::connect(&b.ws_url()).await;
    right.auth(&target).await;
    right
        .req("w", vec![json!({"kinds": [24620], "#p": [hex(&target)]})])
        .await
        .events();
    let mut wrong = Client::connect(&b.ws_url()).await;
    wrong.auth(&Keys::generate()).await;
    wrong.req("w", vec![json!({"kinds": [24620]})]).await.events();
    let mut anon = Client::connect(&b.ws_url()).await;
    anon.req("all", vec![json!({"authors": [hex(&k)]})])
        .await
        .events();
    let wake = event(&k, 24620, "", &[&["p", &hex(&target)]]);
    pub_a.publish_ok(&wake).await;
    assert_eq!(right.next_event("w").await.id, wake.id);
    right.expect_silence(Duration::from_millis(300)).await;
    wrong.expect_silence(Duration::from_millis(300)).await;
    anon.expect_silence(Duration::from_millis(300)).await;

    // The same event sent to both processes is stored once.
    let dup = event(&k, 1, "sent to both", &[]);
    let mut pub_b = Client::connect(&b.ws_url()).await;
    pub_a.send(json!(["EVENT", dup])).await;
    pub_b.send(json!(["EVENT", dup])).await;
    let (ok_a, _) = pub_a.wait_ok(&dup.id.to_hex()).await;
    let (ok_b, _) = pub_b.wait_ok(&dup.id.to_hex()).await;
    assert!(ok_a && ok_b);
    assert_eq!(pub_a.count("c", vec![json!({"ids": [dup.id]})]).await.unwrap(), 1);
    // And the subscriber on B saw it once.
    assert_eq!(sub_b.next_event("s").await.id, dup.id);
    sub_b.expect_silence(Duration::from_millis(500)).await;
    let Backend::Postgres(server) = &backend else {
        unreachable!()
    };
    let db = store.database_url.rsplit('/').next().unwrap().to_string();
    let n = server
        .psql(
            &db,
            &format!("SELECT count(*) FROM events WHERE id = '\\x{}'", dup.id.to_hex()),
        )
        .unwrap();
    assert_eq!(n, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn a_steps_wakes_reach_agents_on_another_process() {
    let backend = Backend::postgres();
    let store = Store::new(&backend);
    let a = Relay::start_with(store.clone(), RelayOptions::default());
    let b = Relay::start_with(store.clone(), RelayOptions::default());
    let mut fx = tests::workflow::Fixture::new(&a, "wakes", 3).await;
    // Every agent listens for its wakes on B; the run starts (and its step
    // runs) on A, whose engine forwards the step's wakes in one transaction.
    let mut listeners = Vec::new();
    for k in &fx.agents {
        let mut c = Client::connect(&b.ws_url()).await;
        c.auth(k).await;
        c.req("w", vec![json!({"kinds": [24620], "#p": [hex(k)]})])
            .await
            .events();
        listeners.push(c);
    }
    let text = format!("{} {} {} go", fx.mention(0), fx.mention(1), fx.mention(2));
    fx.define("w", &tests::workflow::on_message(&text)).await;
    fx.post("go").await;
    for (c, k) in listeners.iter_mut().zip(&fx.agents) {
        let wake = c.next_event("w").await;
        assert_eq!(wake.kind.as_u16(), 24620);
        let to: Vec<String> = wake.tags.public_keys().map(|p| p.to_hex()).collect();
        assert_eq!(to, vec![hex(k)]);
        c.expect_silence(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn concurrent_replacements_across_processes_keep_the_newest() {
    let backend = Backend::postgres();
    let store = Store::new(&backend);
    let a = Relay::start_with(store.clone(), RelayOptions::default());
    let b = Relay::start_with(store.clone(), RelayOptions::default());
    let k = Keys::generate();
    let mut ca = Client::connect(&a.ws_url()).await;
    let mut cb = Client::connect(&b.ws_url()).await;
    let base = tests::now() - 1000;
    let versions: Vec<_> = (0..20)
        .map(|i| tests::event_at(&k, 10002, &format!("v{i}"), &[], base + i))
        .collect();
    for (i, v) in versions.iter().enumerate() {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        c.send(json!(["EVENT", v])).await;
    }
    for (i, v) in versions.iter().enumerate() {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        c.wait_ok(&v.id.to_hex()).await;
    }
    let got = ca
        .req("r", vec![json!({"kinds": [10002], "authors": [hex(&k)]})])
        .await
        .events();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, versions[19].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn relay_survives_a_database_restart() {
    let server = tests::pg::own_server();
    let server = Arc::new(server);
    let backend = Backend::Postgres(server.clone());
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[postgres]\nacquire_timeout_ms = 1000\n".into(),
            ..Default::default()
        },
    );
    let k = Keys::generate();
    let mut acked = Vec::new();
    let mut c = Client::connect(&relay.ws_url()).await;
    let mut sub = Client::connect(&relay.ws_url()).await;
    sub.req("live", vec![json!({"authors": [hex(&k)], "limit": 0})])
        .await
        .events();
    for i in 0..10 {
        let e = event(&k, 1, &format!("before {i}"), &[]);
        c.publish_ok(&e).await;
        acked.push(e);
    }
    server.stop();
    // While the database is down: machine-readable errors, no crash.
    let e = event(&k, 1, "while down", &[]);
    let (ok, msg) = c.publish(&e).await;
    assert!(!ok && msg.starts_with("error:"), "{msg}");
    let msg = c.req("q", vec![json!({"authors": [hex(&k)]})]).await.closed();
    assert!(msg.starts_with("error:"), "{msg}");
    server.start_again();
    // Recovers by itself: retry until accepted.
    let mut recovered = false;
    for _ in 0..60 {
        let (ok, _) = c.publish(&e).await;
        if ok {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(recovered, "relay did not recover after the database came back");
    acked.push(e);
    for i in 0..5 {
        let e = event(&k, 1, &format!("after {i}"), &[]);
        c.publish_ok(&e).await;
        acked.push(e);
    }
    let got = c.req("all", vec![json!({"authors": [hex(&k)]})]).await.events();
    assert_eq!(
        got.len(),
        acked.len(),
        "acknowledged events lost across the database restart"
    );
    // Live subscribers on the same process keep receiving.
    let live = event(&k, 1, "live after restart", &[]);
    c.publish_ok(&live).await;
    loop {
        if sub.next_event("live").await.id == live.id {
            break;
        }
    }
}

/// A claim reads its row by its key even when the statistics say that no
/// delivery is pending (gathered in a quiet moment) while thousands are: with
/// `status = 'pending'` the planner took `deliveries_pending_expiry`, which
/// the statistics said was empty, and every claim walked all pending rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn claims_read_their_row_by_key_whatever_the_statistics() {
    let backend = Backend::postgres();
    let store = Store::new(&backend);
    // No sweep after the one at startup, so that only the claim reads the
    // table: the sweep for expired rows can still walk `deliveries_due`
    // with statistics like these (docs/performance.md, "Plans that
    // depend on a quiet moment's statistics").
    let relay = Relay::start_with(
        store.clone(),
        RelayOptions {
            config_toml: "[deliveries]\nsweep_interval_ms = 3600000\n".into(),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("go").await;
    let row = eventually(|| async { deliveries(&relay).into_iter().next() }).await;
    let id = row["id"].as_str().expect("id").to_string();
    // 4,000 more pending rows (copies under other runs, due in an hour, so
    // that nothing claims them), then a quiet moment in which none is
    // pending and the statistics are gathered, then the burst again.
    store.sql(&format!(
        "INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, \
         target_pubkey, channel, definition_event_id, message_event_id, message_created_at, status, \
         attempt, max_attempts, next_attempt_at, expires_at, trigger_context, execution_trace, \
         created_at, updated_at) SELECT community_id, 'waiting-' || g, workflow_id, 'waiting-' || g, \
         step_id, target_pubkey, channel, definition_event_id, message_event_id, message_created_at, \
         status, 0, max_attempts, next_attempt_at + 3600, expires_at, trigger_context, \
         execution_trace, created_at, updated_at FROM workflow_agent_deliveries, \
         generate_series(1, 4000) g WHERE id = '{id}'"
    ));
    store.sql("UPDATE workflow_agent_deliveries SET status = 'delivered' WHERE status = 'pending'");
    store.sql("ANALYZE workflow_agent_deliveries");
    store.sql("UPDATE workflow_agent_deliveries SET status = 'pending' WHERE status = 'delivered'");
    store.sql("SELECT pg_stat_reset()");

    let expected = json!({"run_id": row["run_id"], "step_id": "notify",
        "definition_event_id": row["definition_event_id"],
        "message_event_id": row["message_event_id"], "channel": "ops"});
    let (status, v) = claim(
        &relay,
        &fx.agents[0],
        json!({"delivery_id": id, "expected": expected}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["delivery"]["id"].as_str(), Some(id.as_str()), "{v}");

    // Index entries read, per index, once the backend that ran the claim has
    // reported its counters with the claim's update (it does so when idle,
    // within about ten seconds).
    let mut reported = false;
    for _ in 0..300 {
        let updated = store
            .sql("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'workflow_agent_deliveries'");
        if updated.parse::<i64>().unwrap_or(0) > 0 {
            reported = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reported, "the claim's update was never reported");
    let seen = store.sql(
        "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes \
         WHERE relname = 'workflow_agent_deliveries' AND idx_tup_read > 0 ORDER BY 1",
    );
    let total: i64 = seen
        .lines()
        .filter_map(|l| l.rsplit('|').next()?.trim().parse::<i64>().ok())
        .sum();
    assert!(total > 0, "no index reads reported: {seen:?}");
    assert!(total < 100, "the claim read {total} index entries: {seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn partitions_ahead_and_large_tag_values() {
    let backend = Backend::postgres();
    let relay = Relay::start(&backend);
    let Backend::Postgres(server) = &backend else {
        unreachable!()
    };
    let db = relay.store.database_url.rsplit('/').next().unwrap().to_string();
    let parts = server
        .psql(
            &db,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events'::regclass",
        )
        .unwrap();
    // Default partition + the current month + 3 ahead.
    assert_eq!(parts, "5", "partitions: {parts}");
    let now = time_now_partition();
    let exists = server
        .psql(
            &db,
            &format!("SELECT count(*) FROM pg_class WHERE relname = '{now}'"),
        )
        .unwrap();
    assert_eq!(exists, "1", "no partition {now}");
    // A 1000-byte tag value is stored and found by #t; a longer one is refused.
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let long = "v".repeat(1000);
    let e = event(&k, 1, "long tag", &[&["t", &long]]);
    c.publish_ok(&e).await;
    assert_eq!(c.req("t", vec![json!({"#t": [long]})]).await.events().len(), 1);
    let (ok, msg) = c
        .publish(&event(&k, 1, "too long", &[&["t", &"w".repeat(5000)]]))
        .await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // The event landed in its month's partition, not the default one.
    let n = server.psql(&db, &format!("SELECT count(*) FROM {now}")).unwrap();
    assert_eq!(n, "1");
}

fn time_now_partition() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+events_y%Ym%m"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A table that grew from nothing has its statistics gathered by the relay
/// within seconds (autovacuum's nap is a minute, and until then the
/// connections keep plans made for an empty table: docs/backends.md, "A
/// new database's first minute"); a table that changed little is left to
/// autovacuum. `last_analyze` is set by an `ANALYZE` a client sends, never
/// by autovacuum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn statistics_of_a_table_that_grew_are_gathered() {
    let backend = Backend::postgres();
    let store = Store::new(&backend);
    let _relay = Relay::start_with(store.clone(), RelayOptions::default());
    let auth_rows = |from: u32, to: u32| {
        format!(
            "INSERT INTO http_auth_seen (community_id, event_id, expires_at) \
             SELECT 'default', decode(md5('a' || g), 'hex'), 4000000000 FROM generate_series({from}, {to}) g"
        )
    };
    store.sql(&auth_rows(1, 3000));
    wait_analyzed(&store, "http_auth_seen").await;
    // 100 more rows (3% of what the statistics counted): left alone, while
    // a later growth of another table is seen (what must happen next).
    store.sql(&auth_rows(3001, 3100));
    let last = "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'http_auth_seen'";
    let before = store.sql(last);
    store.sql(
        "INSERT INTO deletions (community_id, pubkey, target, deleted_until) \
         SELECT 'default', decode(md5('d' || g), 'hex'), 't' || g, 0 FROM generate_series(1, 3000) g",
    );
    wait_analyzed(&store, "deletions").await;
    assert_eq!(
        before,
        store.sql(last),
        "a table that changed by 3% was analyzed again"
    );
}

/// Waits (30 s) until a client analyzed `table`.
async fn wait_analyzed(store: &Store, table: &str) {
    let q = format!("SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = '{table}'");
    for _ in 0..300 {
        if store.sql(&q) == "t" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the statistics of {table}, which grew, were not gathered");
}
