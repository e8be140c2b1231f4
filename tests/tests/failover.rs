//! A PostgreSQL primary with a hot standby (streaming replication set up
//! with `pg_basebackup`, synchronous), and a relay given both hosts in
//! libpq's form with `target_session_attrs=read-write`, the standby
//! first: it uses the primary; when the primary is SIGKILLed and the
//! standby promoted, it moves to the new primary without a restart, and
//! every event it acknowledged before is there. Under load too: four
//! publishers on two relay processes, an agent answering `ask_agent`
//! runs and runs waiting on a timer, started all along; every event and
//! run acknowledged is there once, each run completes once.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nostr::prelude::Keys;
use tests::pg::{own_server, PgServer};
use tests::relay::Store;
use tests::{event, Client, Relay, RelayOptions};

/// A primary, its synchronous standby, and a store on a new database
/// whose URL names both (the standby first when `standby_first`).
fn servers(standby_first: bool) -> (Arc<PgServer>, PgServer, Arc<Store>) {
    let primary = Arc::new(own_server());
    let standby = primary.standby(true).expect("a standby");
    let mut ports = [primary.port, standby.port];
    if standby_first {
        ports.reverse();
    }
    let store = Store::on_hosts(&primary, &ports);
    (primary, standby, store)
}

/// The name of the store's database (its URL names several hosts).
fn database(store: &Store) -> String {
    let path = store.database_url.rsplit('/').next().expect("a database");
    path.split('?').next().expect("a name").to_string()
}

/// How many of `ids` the server's database `db` holds (asked 500 at a
/// time: one argument of psql holds at most 128 KiB).
fn held(server: &PgServer, db: &str, ids: &[String]) -> usize {
    ids.chunks(500)
        .map(|chunk| {
            let list: Vec<String> = chunk.iter().map(|id| format!("'\\x{id}'::bytea")).collect();
            let q = format!("SELECT COUNT(*) FROM events WHERE id IN ({})", list.join(","));
            server
                .psql(db, &q)
                .expect("count")
                .parse::<usize>()
                .expect("a count")
        })
        .sum()
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
    // The standby first: the relay must pass it over for the primary.
    let (primary, standby, store) = servers(true);
    let db = database(&store);
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

/// Starts a manual run of `workflow`; its id once the relay answered
/// (a run is promised only then), else `None`.
async fn try_start(relay: &Relay, owner: &Keys, workflow: &str, n: usize) -> Option<String> {
    let body = serde_json::json!({"n": n});
    let path = format!("/workflows/{workflow}/runs");
    let (status, v) = tests::workflow::api(relay, owner, "POST", &path, Some(&body)).await;
    (status == 200).then(|| v["run_id"].as_str().map(str::to_string))?
}

/// What a load task keeps: the ids acknowledged, and when the first was
/// acknowledged after `since`.
#[derive(Default)]
struct Acked {
    ids: Vec<String>,
    first_after_kill: Option<Instant>,
}

fn record(acked: &Mutex<Acked>, id: String, killed: &OnceLock<Instant>) {
    let mut a = acked.lock().unwrap_or_else(|p| p.into_inner());
    a.ids.push(id);
    if killed.get().is_some() && a.first_after_kill.is_none() {
        a.first_after_kill = Some(Instant::now());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn under_load_every_acknowledged_event_and_run_survives_a_promotion() {
    let (primary, standby, store) = servers(false);
    let fast = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n\
                [workflows]\nrun_poll_interval_ms = 200\n";
    let options = RelayOptions {
        config_toml: fast.into(),
        ..Default::default()
    };
    // Two relay processes: publishers on both, the agent on the second.
    let relays = Arc::new([
        Relay::start_with(store.clone(), options.clone()),
        Relay::start_with(store.clone(), options),
    ]);
    let mut fx = tests::workflow::Fixture::new(&relays[0], "ops", 1).await;
    let agent = tests::agent::AgentProc::start(&relays[1], &fx.agents[0], &fx.owner, "type = \"echo\"", "");
    agent.wait_subscribed().await;
    let ask = serde_json::json!({"name": "ask", "trigger": {"on": "manual"}, "steps": [
        {"id": "ask", "action": "ask_agent", "text": format!("{} item {{{{trigger.body.n}}}}", fx.mention(0))},
        {"id": "final", "action": "send_message", "text": "agent said: {{steps.ask.output.reply}}"}]});
    let wait = serde_json::json!({"name": "wait", "trigger": {"on": "manual"}, "steps": [
        {"id": "pause", "action": "delay", "secs": 3},
        {"id": "final", "action": "send_message", "text": "waited {{trigger.body.n}}"}]});
    fx.define("ask", &ask).await;
    fx.define("wait", &wait).await;
    let events = Arc::new(Mutex::new(Acked::default()));
    let runs = Arc::new(Mutex::new(Acked::default()));
    let killed = Arc::new(OnceLock::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for p in 0..4 {
        let (relays, events, killed, stop) = (relays.clone(), events.clone(), killed.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let keys = Keys::generate();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (ok, id) = publish(&relays[p % 2], &keys, &format!("publisher {p} event {i}")).await;
                if ok {
                    record(&events, id, &killed);
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                i += 1;
            }
        }));
    }
    {
        let (relays, runs, killed, stop) = (relays.clone(), runs.clone(), killed.clone(), stop.clone());
        let owner = fx.owner.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let workflow = if n % 2 == 0 { "ask" } else { "wait" };
                match try_start(&relays[n % 2], &owner, workflow, n).await {
                    Some(id) => record(&runs, id, &killed),
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    primary.kill();
    let kill_at = Instant::now();
    killed.set(kill_at).expect("killed once");
    standby.promote().expect("promotion");
    // Load on until both kinds of write were accepted again, and 3 s more.
    let resumed = tests::workflow::eventually(|| async {
        let e = events.lock().unwrap_or_else(|p| p.into_inner()).first_after_kill;
        let r = runs.lock().unwrap_or_else(|p| p.into_inner()).first_after_kill;
        e.zip(r)
    });
    let (event_at, run_at) = tokio::time::timeout(Duration::from_secs(30), resumed)
        .await
        .expect("writes accepted again within 30 s of the promotion");
    eprintln!(
        "after the primary's SIGKILL: first event accepted {:?}, first run {:?}",
        event_at - kill_at,
        run_at - kill_at
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("load task");
    }
    let events = std::mem::take(&mut events.lock().unwrap_or_else(|p| p.into_inner()).ids);
    let runs = std::mem::take(&mut runs.lock().unwrap_or_else(|p| p.into_inner()).ids);
    assert!(
        events.len() > 20 && runs.len() > 10,
        "too little load: {} events, {} runs",
        events.len(),
        runs.len()
    );
    eprintln!("acknowledged: {} events, {} runs", events.len(), runs.len());
    let db = store.database_url.rsplit('/').next().expect("db");
    let db = db.split('?').next().expect("a name");
    assert_eq!(
        held(&standby, db, &events),
        events.len(),
        "acknowledged events missing"
    );
    // Every acknowledged run ends, completed, its final message posted
    // once; an `ask` run's one delivery delivered (the agent answered).
    for id in &runs {
        let run = tests::workflow::run_until(&relays[0], &fx.owner, id, 60, tests::workflow::ended).await;
        assert_eq!(run["status"], "completed", "{run}");
        let finals = standby
            .psql(
                db,
                &format!(
                    "SELECT COUNT(*) FROM events WHERE kind = 9 AND raw LIKE '%[\"workflow-run\",\"{id}\"]%' \
                     AND raw LIKE '%[\"workflow-step\",\"final\"]%'"
                ),
            )
            .expect("finals");
        assert_eq!(finals, "1", "run {id}: final messages");
        let deliveries = standby
            .psql(
                db,
                &format!(
                    "SELECT string_agg(status, ',') FROM workflow_agent_deliveries WHERE run_id = '{id}'"
                ),
            )
            .expect("deliveries");
        let want = if run["workflow_id"] == "ask" {
            "delivered"
        } else {
            ""
        };
        assert_eq!(deliveries, want, "run {id}: deliveries");
    }
    // The same processes served throughout: no restart.
    for r in relays.iter() {
        assert!(r
            .pid()
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()));
    }
}
