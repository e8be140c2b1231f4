//! Upgrading a store written by an earlier schema: the data a relay wrote
//! is taken back to that layout, the new relay migrates it at start, and
//! what was there still holds. SQLite before migration 0005 (tag index
//! keyed by event id, events without a `seq`): every tag query, deletion
//! and foreign key; both backends before runs could be rerun (the
//! `workflow_runs` CHECK widened): every run row as it was.

use std::process::Command;

use nostr::prelude::Keys;
use serde_json::json;
use tests::workflow::{get_run, rpc, run_until, start_run, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(runs_written_before_reruns_survive_the_migration);

/// The layout of migrations 0001–0004 for `events` and `event_tags`, filled
/// from the current tables. Old rowids are made unlike the current `seq`
/// (×7 + 3), so that the migration must map tag rows to events by id.
const BACK_TO_0004: &str = "
PRAGMA foreign_keys = OFF;
BEGIN;
CREATE TABLE events_old (
    community_id TEXT NOT NULL, id BLOB NOT NULL, pubkey BLOB NOT NULL, created_at INTEGER NOT NULL,
    kind INTEGER NOT NULL, d_tag TEXT, expires_at INTEGER, raw TEXT NOT NULL, channel TEXT,
    superseded BOOLEAN NOT NULL DEFAULT FALSE, UNIQUE (community_id, id));
INSERT INTO events_old (rowid, community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded)
SELECT seq * 7 + 3, community_id, id, pubkey, created_at, kind, d_tag, expires_at, raw, channel, superseded FROM events;
CREATE TABLE event_tags_old (
    community_id TEXT NOT NULL, event_created_at INTEGER NOT NULL, event_id BLOB NOT NULL,
    name TEXT NOT NULL, value TEXT NOT NULL, value_hash BLOB NOT NULL,
    PRIMARY KEY (community_id, event_id, name, value),
    FOREIGN KEY (community_id, event_id) REFERENCES events (community_id, id) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO event_tags_old SELECT community_id, event_created_at, event_id, name, value, X'00' FROM event_tags;
DROP TABLE event_tags;
DROP TABLE events;
ALTER TABLE events_old RENAME TO events;
ALTER TABLE event_tags_old RENAME TO event_tags;
CREATE INDEX events_by_time ON events (community_id, created_at DESC, id);
CREATE INDEX events_by_author ON events (community_id, pubkey, created_at DESC, id);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC, id);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiry ON events (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX events_by_channel ON events (community_id, channel, created_at DESC, id) WHERE channel IS NOT NULL;
CREATE INDEX event_tags_by_value ON event_tags (community_id, name, value, event_created_at DESC);
DELETE FROM _sqlx_migrations WHERE version = 5;
COMMIT;
PRAGMA foreign_keys = ON;
";

fn sqlite_script(path: &str, script: &str) {
    let py = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1], isolation_level=None)\nc.executescript(sys.argv[2])";
    let out = Command::new("python3")
        .args(["-c", py, path, script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn ids_of(c: &mut Client, sub: &str, filter: serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = c
        .req(sub, vec![filter])
        .await
        .events()
        .iter()
        .map(|e| e.id.to_hex())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_before_0005_upgrades_in_place() {
    let mut relay = Relay::start(&Backend::Sqlite);
    let (alice, bob) = (Keys::generate(), Keys::generate());
    let bob_hex = bob.public_key().to_hex();
    let mut c = Client::connect(&relay.ws_url()).await;
    let mut tagged = Vec::new();
    for i in 0..40 {
        let e = event(
            &alice,
            1,
            &format!("n{i}"),
            &[&["t", "upgrade"], &["p", &bob_hex]],
        );
        c.publish_ok(&e).await;
        tagged.push(e.id.to_hex());
    }
    let other = event(&bob, 1, "other", &[&["t", "elsewhere"]]);
    c.publish_ok(&other).await;
    c.close().await;
    relay.terminate();

    let path = relay
        .store
        .database_url
        .trim_start_matches("sqlite://")
        .to_string();
    sqlite_script(&path, BACK_TO_0004);
    let old_layout = relay
        .store
        .sql("SELECT count(*) FROM pragma_table_info('event_tags') WHERE name = 'event_seq'");
    assert_eq!(old_layout, "0", "the store is back in the 0004 layout");

    relay.restart();
    assert_eq!(
        relay
            .store
            .sql("SELECT count(*) FROM _sqlx_migrations WHERE version = 5 AND success"),
        "1",
        "migration 0005 ran at start"
    );
    assert_eq!(relay.store.sql("PRAGMA foreign_key_check"), "");
    assert_eq!(relay.store.sql("PRAGMA integrity_check"), "ok");
    assert_eq!(
        relay.store.sql(
            "SELECT count(*) FROM event_tags t JOIN events e ON e.seq = t.event_seq \
             AND e.id = t.event_id AND e.community_id = t.community_id"
        ),
        relay.store.sql("SELECT count(*) FROM event_tags"),
        "every tag row points at its own event"
    );

    let mut c = Client::connect(&relay.ws_url()).await;
    let mut expected = tagged.clone();
    expected.sort();
    assert_eq!(ids_of(&mut c, "t", json!({"#t": ["upgrade"]})).await, expected);
    assert_eq!(ids_of(&mut c, "p", json!({"#p": [bob_hex]})).await, expected);
    assert_eq!(
        ids_of(&mut c, "e", json!({"#t": ["elsewhere"]})).await,
        vec![other.id.to_hex()]
    );

    // A deletion after the upgrade takes the event's tag rows with it.
    let victim = tagged[0].clone();
    c.publish_ok(&event(&alice, 5, "", &[&["e", &victim]])).await;
    expected.retain(|id| *id != victim);
    assert_eq!(ids_of(&mut c, "t2", json!({"#t": ["upgrade"]})).await, expected);
    assert_eq!(
        relay.store.sql(&format!(
            "SELECT count(*) FROM event_tags WHERE event_id = X'{victim}'"
        )),
        "0"
    );

    // New events after the upgrade are indexed the new way.
    let fresh = event(&alice, 1, "after", &[&["t", "upgrade"]]);
    c.publish_ok(&fresh).await;
    expected.push(fresh.id.to_hex());
    expected.sort();
    assert_eq!(ids_of(&mut c, "t3", json!({"#t": ["upgrade"]})).await, expected);
}

/// `workflow_runs` as before reruns: the migration run backwards (the
/// CHECK without `rerun`), and its record gone.
fn back_before_reruns(backend: &Backend) -> String {
    match backend {
        // A legacy rename leaves the other tables' triggers unparsed: the
        // FTS5 options of the search index's are newer than Python's SQLite.
        Backend::Sqlite => {
            "PRAGMA legacy_alter_table = ON;\n".to_string()
                + &include_str!("../../migrations/sqlite/0017_run_rerun.sql").replace(", 'rerun')", ")")
                + "DELETE FROM _sqlx_migrations WHERE version = 17;"
        }
        Backend::Postgres(_) => {
            include_str!("../../migrations/postgres/0016_run_rerun.sql").replace(", 'rerun')", ")")
                + "DELETE FROM _sqlx_migrations WHERE version = 16;"
        }
    }
}

const RUN_ROWS: &str = "SELECT id, workflow_id, status, current_step, cause_type, cause_id, trace, \
    trigger_context, error, error_code, error_step, created_at, updated_at FROM workflow_runs ORDER BY id";

async fn runs_written_before_reruns_survive_the_migration(backend: Backend) {
    let fast = "[workflows]\nrun_poll_interval_ms = 200\n[webhooks]\ncall_grace_secs = 1\n";
    let options = RelayOptions {
        config_toml: fast.into(),
        ..Default::default()
    };
    let mut relay = Relay::start_opts(&backend, options);
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let steps = json!([
        {"id": "hello", "action": "send_message", "text": "hello {{trigger.body.n}}"},
        // Loopback is refused without an allow-list: the step fails.
        {"id": "call", "action": "call_webhook", "url": "http://127.0.0.1:9/x"}
    ]);
    fx.define(
        "w",
        &json!({"name": "w", "trigger": {"on": "manual"}, "steps": steps}),
    )
    .await;
    let mut runs = Vec::new();
    for n in 0..3 {
        let run = start_run(&relay, &fx.owner, "w", json!({"n": n})).await;
        let r = run_until(&relay, &fx.owner, &run, 20, tests::workflow::ended).await;
        assert_eq!(r["status"], "failed", "{r}");
        runs.push(run);
    }
    let before = relay.store.sql(RUN_ROWS);
    relay.terminate();
    match &backend {
        Backend::Sqlite => {
            let path = relay
                .store
                .database_url
                .trim_start_matches("sqlite://")
                .to_string();
            sqlite_script(&path, &back_before_reruns(&backend));
        }
        Backend::Postgres(_) => {
            relay.store.sql(&back_before_reruns(&backend));
        }
    }
    let version = if matches!(backend, Backend::Sqlite) {
        17
    } else {
        16
    };
    let ran = format!("SELECT count(*) FROM _sqlx_migrations WHERE version = {version} AND success");
    assert_eq!(relay.store.sql(&ran), "0", "the store is back before reruns");

    relay.restart();
    assert_eq!(relay.store.sql(&ran), "1", "the migration ran at start");
    assert_eq!(relay.store.sql(RUN_ROWS), before, "every run row as it was");
    if matches!(backend, Backend::Sqlite) {
        assert_eq!(relay.store.sql("PRAGMA integrity_check"), "ok");
    }
    // The migrated table takes a rerun.
    let (status, v) = rpc(&relay, &fx.owner, "rerunrun", json!([runs[0]])).await;
    assert_eq!(status, 200, "{v}");
    let rerun = v["result"]["rerun"].as_str().unwrap().to_string();
    let r = run_until(&relay, &fx.owner, &rerun, 20, tests::workflow::ended).await;
    assert_eq!(r["cause"]["type"], "rerun", "{r}");
    assert_eq!(r["steps"][0]["kept_from"], json!(runs[0]), "{r}");
    let (_, origin) = get_run(&relay, &fx.owner, &runs[0]).await;
    assert_eq!(origin["rerun_by"], json!(rerun));
}
