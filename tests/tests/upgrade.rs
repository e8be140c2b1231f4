//! Upgrading a store written by an earlier schema: the data a relay wrote
//! is taken back to that layout, the new relay migrates it at start, and
//! what was there still holds. SQLite before migration 0005 (tag index
//! keyed by event id, events without a `seq`): every tag query, deletion
//! and foreign key; both backends before runs could be rerun (the
//! `workflow_runs` CHECK widened): every run row as it was; both backends
//! before the latest migration: every row of every table as it was.

use std::collections::BTreeMap;
use std::process::Command;

use nostr::prelude::Keys;
use serde_json::json;
use tests::workflow::{get_run, rpc, run_until, start_run, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    runs_written_before_reruns_survive_the_migration,
    every_table_survives_the_latest_migration
);

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

/// Runs the Python program `py` with the database's path and `script`.
fn python(py: &str, path: &str, script: &str) {
    let out = Command::new("python3")
        .args(["-c", py, path, script])
        .output()
        .expect("python3");
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "script failed: {why}");
}

/// Runs `script` on the store: on SQLite by `on_sqlite` (given the
/// file's path), on PostgreSQL with psql.
fn run_script(store: &tests::relay::Store, script: &str, on_sqlite: fn(&str, &str)) {
    match &store.backend {
        Backend::Sqlite => on_sqlite(store.database_url.trim_start_matches("sqlite://"), script),
        Backend::Postgres(_) => {
            store.sql(script);
        }
    }
}

fn sqlite_script(path: &str, script: &str) {
    let py = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1], isolation_level=None)\nc.executescript(sys.argv[2])";
    python(py, path, script);
}

/// Runs `script` (statements one per `;` and line end) in one
/// transaction, the triggers dropped during it and made again after:
/// SQLite checks every trigger when a column is dropped, and the search
/// index's triggers name FTS5 options newer than Python's SQLite. A
/// trigger the script drops (`DROP TRIGGER IF EXISTS <name>;`) is not
/// made again.
fn sqlite_without_triggers(path: &str, script: &str) {
    let py = "import sqlite3,sys\n\
        c=sqlite3.connect(sys.argv[1], isolation_level=None)\n\
        c.execute('BEGIN')\n\
        t=c.execute(\"SELECT name, sql FROM sqlite_master WHERE type='trigger'\").fetchall()\n\
        for n,_ in t: c.execute('DROP TRIGGER \"%s\"' % n)\n\
        for st in sys.argv[2].split(';\\n'):\n\
        \x20   st=st.strip().rstrip(';')\n\
        \x20   if st: c.execute(st)\n\
        for n,sql in t:\n\
        \x20   if 'DROP TRIGGER IF EXISTS %s;' % n not in sys.argv[2]: c.execute(sql)\n\
        c.execute('COMMIT')";
    python(py, path, script);
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
    run_script(&relay.store, &back_before_reruns(&backend), sqlite_script);
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

/// PostgreSQL's latest migration's revert (0022 keyed the NIP-98 records
/// by their expiry).
const AUTH_SEEN_BY_KEY_PG: &str = "ALTER TABLE http_auth_seen DROP CONSTRAINT http_auth_seen_pkey;\n\
     ALTER TABLE http_auth_seen ADD PRIMARY KEY (community_id, event_id);\n\
     CREATE INDEX http_auth_seen_by_expiry ON http_auth_seen (expires_at);\n";

/// SQLite's latest migration's revert (0026 keyed the NIP-98 records by
/// their expiry, without a rowid).
const AUTH_SEEN_BY_KEY: &str = "CREATE TABLE http_auth_seen_old (community_id TEXT NOT NULL, \
     event_id BLOB NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (community_id, event_id));\n\
     INSERT INTO http_auth_seen_old SELECT community_id, event_id, expires_at FROM http_auth_seen;\n\
     DROP TABLE http_auth_seen;\n\
     ALTER TABLE http_auth_seen_old RENAME TO http_auth_seen;\n\
     CREATE INDEX http_auth_seen_by_expiry ON http_auth_seen (expires_at);\n";

/// The latest migration of each backend, run backwards, and its version.
/// A new migration must come with its own here (the test checks the
/// version is the store's latest).
fn back_before_latest(backend: &Backend) -> (String, u32) {
    let (down, version) = match backend {
        Backend::Sqlite => (AUTH_SEEN_BY_KEY, 26),
        Backend::Postgres(_) => (AUTH_SEEN_BY_KEY_PG, 22),
    };
    let sql = format!("{down}DELETE FROM _sqlx_migrations WHERE version = {version};");
    match backend {
        Backend::Sqlite => (sql, version),
        Backend::Postgres(_) => (format!("BEGIN;\n{sql}\nCOMMIT;"), version),
    }
}

/// The store's tables (a partitioned table once, not its partitions; a
/// virtual table through its shadow tables, which Python's SQLite reads).
fn tables(store: &tests::relay::Store) -> Vec<String> {
    let q = match store.backend {
        Backend::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'table' \
            AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations' \
            AND sql NOT LIKE 'CREATE VIRTUAL TABLE%' ORDER BY name"
        }
        Backend::Postgres(_) => {
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
            WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
            AND c.relname <> '_sqlx_migrations' ORDER BY 1"
        }
    };
    store.sql(q).lines().map(str::to_string).collect()
}

/// A table's columns, in order.
fn columns(store: &tests::relay::Store, table: &str) -> Vec<String> {
    let q = match store.backend {
        Backend::Sqlite => format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid"),
        Backend::Postgres(_) => format!(
            "SELECT column_name FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY ordinal_position"
        ),
    };
    store.sql(&q).lines().map(str::to_string).collect()
}

/// Every row of every table, as text, over the columns `layout` names
/// for it (its columns now when `layout` has none), in order.
fn snapshot(
    store: &tests::relay::Store,
    layout: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, (Vec<String>, String)> {
    tables(store)
        .into_iter()
        .map(|t| {
            let cols = layout.get(&t).cloned().unwrap_or_else(|| columns(store, &t));
            let order: Vec<String> = (1..=cols.len()).map(|i| i.to_string()).collect();
            let quoted: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
            let rows = store.sql(&format!(
                "SELECT {} FROM \"{t}\" ORDER BY {}",
                quoted.join(", "),
                order.join(", ")
            ));
            (t, (cols, rows))
        })
        .collect()
}

/// Fills the store's tables the way a relay in use does: a channel with
/// an agent, notes and a deletion, runs that asked the agent (one
/// answered after recording an operation, one waiting), called a
/// webhook (its secret set) and wait for an approval, an invite, a
/// management ban and name. Left empty: join requests, and the rows that
/// live only while work is under way (run wakes, fan-out spill).
async fn fill(relay: &Relay, admin: &Keys) -> Fixture {
    let mut fx = Fixture::new(relay, "ops", 1).await;
    let hooks = tests::hooks::HookServer::start().await;
    hooks.answer("/call", tests::hooks::Answer::json(200, json!({"ok": true})));
    let steps = json!([
        {"id": "ask", "action": "ask_agent", "text": format!("{} look at {{{{trigger.body.n}}}}", fx.mention(0)),
         "priority": 3},
        {"id": "call", "action": "call_webhook", "url": hooks.url("/call"), "body": {"n": "{{trigger.body.n}}"}},
        {"id": "approve", "action": "request_approval", "text": "ship it?",
         "approvers": [fx.owner.public_key().to_hex()]},
        {"id": "final", "action": "send_message", "text": "shipped"}
    ]);
    fx.define(
        "full",
        &json!({"name": "full", "trigger": {"on": "manual"}, "concurrency": 5, "steps": steps}),
    )
    .await;
    let answered = start_run(relay, &fx.owner, "full", json!({"n": 1})).await;
    let d = tests::workflow::claim_when_due(relay, &fx.agents[0], json!({"records_operations": true})).await;
    let id = d["id"].as_str().expect("a delivery").to_string();
    let op = json!({"claim_token": d["claim_token"], "name": "lookup", "effect": "read"});
    let path = format!("/deliveries/{id}/operations");
    tests::workflow::ok(tests::workflow::api(relay, &fx.agents[0], "POST", &path, Some(&op)).await);
    let secret = json!({"value": "s3cret"});
    let path = "/workflows/full/secrets/token";
    tests::workflow::ok(tests::workflow::api(relay, &fx.owner, "PUT", path, Some(&secret)).await);
    let reply = event(&fx.agents[0], 9, "looked", &[&["h", "ops"]]);
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    tests::workflow::ok(tests::workflow::finish(relay, &fx.agents[0], &id, &body).await);
    run_until(relay, &fx.owner, &answered, 20, |r| {
        r["status"] == "waiting" && r["current_step"] == 2
    })
    .await;
    start_run(relay, &fx.owner, "full", json!({"n": 2})).await;
    let mut c = Client::connect(&relay.ws_url()).await;
    let alice = Keys::generate();
    let note = event(&alice, 1, "a searchable note", &[&["t", "upgrade"]]);
    c.publish_ok(&note).await;
    c.publish_ok(&event(&alice, 1, "kept", &[&["t", "upgrade"]]))
        .await;
    c.publish_ok(&event(&alice, 5, "", &[&["e", &note.id.to_hex()]]))
        .await;
    c.publish_ok(&event(&alice, 0, "{\"name\":\"alice\"}", &[])).await;
    fx.owner_client
        .publish_ok(&event(
            &fx.owner,
            9009,
            "",
            &[&["h", "ops"], &["code", "welcome"]],
        ))
        .await;
    let (status, v) = rpc(relay, admin, "changerelayname", json!(["Upgraded relay"])).await;
    assert_eq!(status, 200, "{v}");
    let stranger = Keys::generate().public_key().to_hex();
    let (status, v) = rpc(relay, admin, "banpubkey", json!([stranger, "spam"])).await;
    assert_eq!(status, 200, "{v}");
    fx
}

async fn every_table_survives_the_latest_migration(backend: Backend) {
    let admin = Keys::generate();
    let config = format!(
        "admins = [\"{}\"]\n[workflows]\nrun_poll_interval_ms = 200\n[webhooks]\ncall_grace_secs = 1\n\
         [communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n",
        admin.public_key().to_hex()
    );
    let options = RelayOptions {
        config_toml: config,
        ..Default::default()
    };
    let mut relay = Relay::start_opts(&backend, options);
    let _fx = fill(&relay, &admin).await;
    relay.terminate();
    let (down, version) = back_before_latest(&backend);
    let latest = relay.store.sql("SELECT max(version) FROM _sqlx_migrations");
    assert_eq!(
        latest,
        version.to_string(),
        "a newer migration: run it backwards here too"
    );
    run_script(&relay.store, &down, sqlite_without_triggers);
    assert_eq!(
        relay.store.sql("SELECT max(version) FROM _sqlx_migrations"),
        (version - 1).to_string()
    );
    let before = snapshot(&relay.store, &BTreeMap::new());
    let empty: Vec<&String> = before
        .iter()
        .filter(|(_, (_, rows))| rows.is_empty())
        .map(|(t, _)| t)
        .collect();
    eprintln!("{} tables, empty before the upgrade: {empty:?}", before.len());
    for must in [
        "events",
        "event_tags",
        "workflow_runs",
        "workflow_agent_deliveries",
        "workflow_webhook_calls",
        "workflow_approvals",
        "channels",
        "channel_members",
        "agents",
        "moderation",
        "delivery_attempts",
        "delivery_operations",
        "workflow_secrets",
        "channel_invites",
        "community_info",
    ] {
        assert!(
            before.get(must).is_some_and(|(_, rows)| !rows.is_empty()),
            "{must} is empty: fill it"
        );
    }
    relay.restart();
    let ran = format!("SELECT count(*) FROM _sqlx_migrations WHERE version = {version} AND success");
    assert_eq!(relay.store.sql(&ran), "1", "the migration ran at start");
    relay.terminate();
    let layout = before
        .iter()
        .map(|(t, (cols, _))| (t.clone(), cols.clone()))
        .collect();
    let after = snapshot(&relay.store, &layout);
    for (table, (_, rows)) in &before {
        let now = after.get(table).map(|(_, r)| r.as_str());
        assert_eq!(now, Some(rows.as_str()), "table {table} changed in the upgrade");
    }
    // The new columns: the defaults a row made before them takes.
    let added = relay
        .store
        .sql("SELECT DISTINCT source FROM workflow_agent_deliveries");
    assert_eq!(added, "workflow", "the rows are a workflow's");
    if matches!(backend, Backend::Sqlite) {
        assert_eq!(relay.store.sql("PRAGMA integrity_check"), "ok");
        let trigger = "SELECT count(*) FROM sqlite_master WHERE name = 'events_search_insert'";
        assert_eq!(relay.store.sql(trigger), "0", "0023 drops the insert trigger");
    }
}
