//! A PostgreSQL primary with a hot standby (streaming replication set up
//! with `pg_basebackup`, synchronous), and a relay given both hosts in
//! libpq's form with `target_session_attrs=read-write`, the standby
//! first: it uses the primary; when the primary is SIGKILLed and the
//! standby promoted, it moves to the new primary without a restart, and
//! every event it acknowledged before is there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nostr::prelude::Keys;
use tests::pg::{own_server, PgServer};
use tests::relay::Store;
use tests::{event, Client, Relay, RelayOptions};

/// How many of `ids` the server's database `db` holds.
fn held(server: &PgServer, db: &str, ids: &[String]) -> usize {
    let list: Vec<String> = ids.iter().map(|id| format!("'\\x{id}'::bytea")).collect();
    let q = format!("SELECT COUNT(*) FROM events WHERE id IN ({})", list.join(","));
    server.psql(db, &q).expect("count").parse().expect("a count")
}

/// Publishes one event (a fresh connection each time: the relay may
/// have dropped the last); whether it was acknowledged within 5 s, and
/// its id. One not acknowledged may still be stored (its write went on
/// after the client stopped waiting): only acknowledged ones are promised.
async fn publish(relay: &Relay, keys: &Keys, text: &str) -> (bool, String) {
    let ev = event(keys, 1, text, &[]);
    let id = ev.id.to_hex();
    let Ok(mut c) = Client::connect_host(&relay.ws_url(), None).await else {
        return (false, id);
    };
    c.send(serde_json::json!(["EVENT", ev])).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match c.try_recv(Duration::from_millis(500)).await {
            Some(v) if v[0] == "OK" && v[1] == id.as_str() => return (v[2] == true, id),
            Some(_) => {}
            None => break,
        }
    }
    (false, id)
}

/// `/readyz`'s status once it is `want` (polled for 15 s), else the last.
async fn ready_within(relay: &Relay, want: u16) -> Option<u16> {
    let mut last = None;
    for _ in 0..150 {
        let got = reqwest::get(format!("{}/readyz", relay.http_url())).await;
        last = got.ok().map(|r| r.status().as_u16());
        if last == Some(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn the_relay_follows_the_primary_through_a_promotion() {
    let primary = Arc::new(own_server());
    let standby = primary.standby(true).expect("a standby");
    // The standby first: the relay must pass it over for the primary.
    let store = Store::on_hosts(&primary, &[standby.port, primary.port]);
    let db = store.database_url.rsplit('/').next().expect("a database");
    let db = db.split('?').next().expect("a name").to_string();
    let relay = Relay::start_with(store, RelayOptions::default());
    let keys = Keys::generate();
    let mut acked = Vec::new();
    for i in 0..20 {
        let (ok, id) = publish(&relay, &keys, &format!("before {i}")).await;
        assert!(ok, "event {i} refused before the failover");
        acked.push(id);
    }
    // Synchronous: every acknowledged commit was flushed on the standby.
    primary.kill();
    let killed = Instant::now();
    // No writable host: not ready (what a load balancer reads).
    assert_eq!(
        ready_within(&relay, 503).await,
        Some(503),
        "ready with no primary"
    );
    standby.promote().expect("promotion");
    // The relay moves to the new primary by itself: a write is accepted
    // again (each attempt a new connection; bounded).
    let mut first_accepted = None;
    for i in 0..120 {
        let (ok, id) = publish(&relay, &keys, &format!("after {i}")).await;
        if ok {
            acked.push(id);
            first_accepted = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = first_accepted.expect("no write accepted within 30 s of the promotion");
    eprintln!("first write accepted {took:?} after the primary's SIGKILL");
    assert_eq!(
        held(&standby, &db, &acked),
        acked.len(),
        "acknowledged events missing"
    );
    // Reads too, over REQ, from the relay still running.
    let mut c = Client::connect(&relay.ws_url()).await;
    let got = c
        .req(
            "all",
            vec![serde_json::json!({"authors": [keys.public_key().to_hex()]})],
        )
        .await
        .events();
    let seen: Vec<String> = got.iter().map(|e| e.id.to_hex()).collect();
    assert!(
        acked.iter().all(|id| seen.contains(id)),
        "an acknowledged event is not served"
    );
}
