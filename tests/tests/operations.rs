//! Operating the relay (docs/operations.md): health and readiness as a
//! load balancer asks for them, on any host.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tests::metrics::{scrape, value};
use tests::workflow::{api, claim_when_due, eventually, finish, Fixture};
use tests::{backend_tests, Backend, Relay, RelayOptions};

backend_tests!(
    health_and_readiness_answer_on_any_host,
    attempts_are_kept_with_their_causes,
    metrics_move_with_events_deliveries_and_failures,
    agent_metrics_count_turns_and_verification_failures
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_is_honoured_with_json_lines_and_an_access_log() {
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            config_toml: "log_format = \"json\"\n".into(),
            env: vec![("RUST_LOG".into(), "warn,access=info".into())],
        },
    );
    let who = nostr::prelude::Keys::generate();
    let (status, _) = tests::http_nip98(
        &relay.http_url(),
        &relay.addr.to_string(),
        &who,
        "GET",
        "/me",
        b"",
    )
    .await;
    assert_eq!(status, 200);
    get(&relay, "127.0.0.1", "/healthz").await;
    // The access line is written after the answer: wait for the last one.
    let log = eventually(|| async {
        let log = relay.log();
        log.contains("\"path\":\"/healthz\"").then_some(log)
    })
    .await;
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let access: Vec<&Value> = lines.iter().filter(|l| l["target"] == "access").collect();
    let me = access
        .iter()
        .find(|l| l["path"] == "/me")
        .unwrap_or_else(|| panic!("no access line for /me: {log}"));
    assert_eq!(me["method"], "GET");
    assert_eq!(me["status"], 200);
    assert_eq!(me["caller"], who.public_key().to_hex());
    assert!(me["duration_us"].as_u64().is_some(), "{me}");
    let health = access
        .iter()
        .find(|l| l["path"] == "/healthz")
        .expect("healthz line");
    assert_eq!(health["caller"], "-");
    // RUST_LOG said warn for everything else: no info line of the relay's.
    assert!(
        !lines
            .iter()
            .any(|l| l["level"] == "INFO" && l["target"] != "access"),
        "{log}"
    );
}

#[test]
fn a_log_filter_that_does_not_parse_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("r.db").display());
    for (args, env) in [
        (vec!["--log", "relay=loudest"], vec![]),
        (vec![], vec![("RUST_LOG", "info,relay=loudest")]),
    ] {
        let mut all = vec!["--database-url", db.as_str(), "--listen", "127.0.0.1:0"];
        all.extend(args);
        let out = tests::relay::run_relay(&all, &env, dir.path(), Duration::from_secs(20));
        assert_ne!(out.code, Some(0), "{out:?}");
        assert!(out.code.is_some(), "it must exit, not serve: {out:?}");
        assert!(out.stderr.contains("log filter"), "{}", out.stderr);
    }
}

/// `GET <path>` with `Host: host`; status and JSON body.
async fn get(relay: &Relay, host: &str, path: &str) -> (u16, Value) {
    tests::http_raw(&relay.http_url(), host, "GET", path, None, b"").await
}

/// Polls `/readyz` until its status is `want` (within `secs`).
async fn ready_becomes(relay: &Relay, want: u16, secs: u64) -> Value {
    let mut last = Value::Null;
    for _ in 0..secs * 5 {
        let (status, body) = get(relay, "127.0.0.1", "/readyz").await;
        if status == want {
            return body;
        }
        last = json!({"status": status, "body": body});
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("/readyz did not answer {want} within {secs} s: {last}");
}

async fn health_and_readiness_answer_on_any_host(backend: Backend) {
    let relay = Relay::start(&backend);
    // The version and the commit built: the checkout's HEAD, as
    // `relay --version` says.
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(tests::workspace_root())
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let version = std::process::Command::new(tests::workspace_bin("relay"))
        .arg("--version")
        .output()
        .expect("relay --version");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    for host in ["127.0.0.1", "lb.internal.example"] {
        let (status, body) = get(&relay, host, "/healthz").await;
        assert_eq!((status, &body["status"]), (200, &json!("ok")), "host {host:?}");
        assert_eq!(body["version"], env!("CARGO_PKG_VERSION"), "{body}");
        let commit = body["commit"].as_str().unwrap_or_default();
        if head.is_empty() {
            assert_eq!(commit, "unknown", "built outside a git checkout");
        } else {
            assert!(commit.starts_with(&head), "{commit} is not HEAD {head}");
        }
        assert_eq!(version, format!("relay {} ({commit})", env!("CARGO_PKG_VERSION")));
    }
    let body = ready_becomes(&relay, 200, 10).await;
    assert_eq!(body, json!({"status": "ok"}));
    let (status, body) = get(&relay, "no-such-community.example", "/readyz").await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    // Community routes still fail closed for an unknown host.
    let (status, body) = get(&relay, "no-such-community.example", "/").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn readiness_follows_postgresql_down_and_back() {
    let server = tests::pg::own_server();
    let server = Arc::new(server);
    let relay = Relay::start_opts(
        &Backend::Postgres(server.clone()),
        RelayOptions {
            config_toml: "[postgres]\nacquire_timeout_ms = 1000\n".into(),
            ..Default::default()
        },
    );
    ready_becomes(&relay, 200, 10).await;
    server.stop();
    let body = ready_becomes(&relay, 503, 15).await;
    assert_eq!(body["status"], "unready", "{body}");
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("database"), "{reason}");
    // The process itself still serves.
    let (status, _) = get(&relay, "127.0.0.1", "/healthz").await;
    assert_eq!(status, 200);
    server.start_again();
    ready_becomes(&relay, 200, 30).await;
}

async fn attempts_are_kept_with_their_causes(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 1\nsweep_interval_ms = 200\n"
                .into(),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    let text = format!("{} check the logs", fx.mention(0));
    fx.define("check", &tests::workflow::on_message(&text)).await;
    fx.post("disk full").await;
    // Attempt 1: the agent asks for a retry, with its reason.
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let (status, v) = finish(
        &relay,
        &agent,
        &id,
        &json!({"claim_token": d["claim_token"], "outcome": "retry", "failure_code": "busy",
                "failure_message": "try later"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    // Attempt 2: the lease (1 s) runs out; the sweeper ends it (a lapsed
    // lease fails the delivery: the agent may have acted).
    let d = claim_when_due(&relay, &agent, json!({"lease_seconds": 1})).await;
    assert_eq!(d["id"], id.as_str());
    let path = format!("/deliveries/{id}");
    let mut shown = Value::Null;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        shown = api(&relay, &agent, "GET", &path, None).await.1;
        if shown["status"] == "failed" {
            break;
        }
    }
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["status"], "failed", "{shown}");
    let attempts = shown["attempts"].as_array().expect("attempts");
    let outcomes: Vec<(i64, &str, Value)> = attempts
        .iter()
        .map(|a| {
            (
                a["attempt"].as_i64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["failure_code"].clone(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [(1, "retry", json!("busy")), (2, "failed", json!("lease_expired"))],
        "{shown}"
    );
    assert_eq!(attempts[0]["failure_message"], "try later");
    for a in attempts {
        assert!(
            a["claimed_at"].as_i64().unwrap() <= a["finished_at"].as_i64().unwrap(),
            "{a}"
        );
    }
    // The workflow's owner sees it too; anyone else does not.
    let (status, by_owner) = api(&relay, &fx.owner, "GET", &path, None).await;
    assert_eq!((status, &by_owner), (200, &shown));
    let (status, v) = api(&relay, &nostr::prelude::Keys::generate(), "GET", &path, None).await;
    assert_eq!(status, 403, "{v}");
    let (status, _) = api(&relay, &agent, "GET", "/deliveries/nope", None).await;
    assert_eq!(status, 404);
    // The operator's CLI shows the same history.
    let cli: Value = serde_json::from_str(relay.cli(&["deliveries", "show", &id]).trim()).unwrap();
    assert_eq!(cli["attempts"], shown["attempts"]);
}

async fn metrics_move_with_events_deliveries_and_failures(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "metrics_listen = \"127.0.0.1:0\"\nmetrics_interval_secs = 1\n\
                          [deliveries]\nsweep_interval_ms = 200\n"
                .into(),
            ..Default::default()
        },
    );
    let before = scrape(&relay).await;
    assert_eq!(
        value(
            &before,
            "relay_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    // Every status of a delivery and of a run is a series from the first
    // scrape, at 0 while no row has it.
    for (name, statuses) in [
        (
            "relay_deliveries",
            &[
                "pending",
                "claimed",
                "delivered",
                "failed",
                "expired",
                "cancelled",
            ][..],
        ),
        (
            "relay_runs",
            &["running", "waiting", "completed", "failed", "cancelled"][..],
        ),
    ] {
        for status in statuses {
            let present = before.samples.iter().any(|s| {
                s.metric == name
                    && s.labels.get("community") == Some("default")
                    && s.labels.get("status") == Some(*status)
            });
            assert!(present, "{name}{{status={status}}} missing from the first scrape");
            assert_eq!(
                value(&before, name, &[("community", "default"), ("status", status)]),
                0.0
            );
        }
    }
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    let text = format!("{} look", fx.mention(0));
    let definition = fx.define("look", &tests::workflow::on_message(&text)).await;
    fx.post("something broke").await;
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let body = json!({"claim_token": d["claim_token"], "outcome": "failed", "failure_code": "tool_broke"});
    let (status, v) = finish(&relay, &agent, &id, &body).await;
    assert_eq!(status, 200, "{v}");
    // A second delivery, left pending, is cancelled in bulk when the owner
    // deletes the workflow (NIP-09): a transition counted like the others.
    fx.post("something else broke").await;
    tests::workflow::eventually(|| async { (tests::workflow::deliveries(&relay).len() == 2).then_some(()) })
        .await;
    let deletion = tests::event(&fx.owner, 5, "", &[&["e", &definition.id.to_hex()]]);
    fx.owner_client.publish_ok(&deletion).await;
    // A plain note goes through the event writer's group commit.
    let note = tests::event(&fx.owner, 1, "a note", &[]);
    fx.owner_client.publish_ok(&note).await;
    let bad = tests::event(&fx.owner, 1, "two channels", &[&["h", "a"], &["h", "b"]]);
    let (ok, msg) = fx.owner_client.publish(&bad).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    fx.owner_client
        .req("r", vec![json!({"kinds": [9], "limit": 5})])
        .await;

    let mut after = scrape(&relay).await;
    for _ in 0..30 {
        if value(
            &after,
            "relay_deliveries",
            &[("community", "default"), ("status", "failed")],
        ) == 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = scrape(&relay).await;
    }
    let moved =
        |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    assert!(value(&after, "relay_connections", &[]) >= 1.0);
    // The engine's heartbeat: a recent unix time, which moves on.
    let tick = value(&after, "relay_engine_last_tick_seconds", &[]);
    let unix_now = tests::now() as f64;
    assert!(
        tick > unix_now - 30.0 && tick <= unix_now + 1.0,
        "{tick} at {unix_now}"
    );
    let mut later = tick;
    for _ in 0..50 {
        later = value(&scrape(&relay).await, "relay_engine_last_tick_seconds", &[]);
        if later > tick {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(later > tick, "the engine's heartbeat stayed at {tick}");
    assert!(moved("relay_events_received_total", &[("outcome", "stored")]) >= 4.0);
    assert_eq!(
        moved("relay_events_received_total", &[("outcome", "invalid")]),
        1.0
    );
    assert!(moved("relay_req_duration_seconds", &[]) >= 1.0);
    assert!(moved("relay_write_batch_events", &[]) >= 1.0);
    assert_eq!(
        moved("relay_delivery_transitions_total", &[("to", "claimed")]),
        1.0
    );
    // The agent's own code is not a label: it counts as "agent".
    assert_eq!(
        moved(
            "relay_delivery_transitions_total",
            &[("to", "failed"), ("code", "agent")]
        ),
        1.0
    );
    assert_eq!(
        moved(
            "relay_delivery_transitions_total",
            &[("to", "cancelled"), ("code", "workflow_disabled")]
        ),
        1.0
    );
    assert_eq!(moved("relay_delivery_wait_seconds", &[]), 1.0);
    assert_eq!(
        value(
            &after,
            "relay_deliveries",
            &[("community", "default"), ("status", "failed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "relay_runs",
            &[("community", "default"), ("status", "completed")]
        ),
        2.0,
        "both runs posted their message and completed"
    );
    assert_eq!(
        value(
            &after,
            "relay_delivery_oldest_pending_seconds",
            &[("community", "default")]
        ),
        0.0
    );
    // Bounded labels: no pubkey or id is ever a label value.
    for s in &after.samples {
        for (k, v) in s.labels.iter() {
            assert!(
                !(v.len() >= 32 && v.bytes().all(|b| b.is_ascii_hexdigit())),
                "{} {k}={v}",
                s.metric
            );
        }
    }
}

async fn agent_metrics_count_turns_and_verification_failures(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let extra = format!("metrics_listen = \"127.0.0.1:{port}\"");
    let agent = tests::agent::AgentProc::start(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"", &extra);
    agent.wait_subscribed().await;
    // One delivery the agent verifies and answers; one from a workflow of
    // someone it does not work for, which it refuses before dispatch.
    let text = format!("{} echo this", fx.mention(0));
    fx.define("echo", &tests::workflow::on_message(&text)).await;
    let stranger = nostr::prelude::Keys::generate();
    let put = tests::event(
        &fx.owner,
        9000,
        "",
        &[&["h", "ops"], &["p", &stranger.public_key().to_hex()]],
    );
    fx.owner_client.publish_ok(&put).await;
    let mut sc = tests::Client::connect(&relay.ws_url()).await;
    sc.auth(&stranger).await;
    let def = json!({"name": "other", "trigger": {"on": "manual"},
                     "steps": [{"id": "s", "action": "send_message", "text": format!("{} hi", fx.mention(0))}]});
    sc.publish_ok(&tests::workflow::definition(&stranger, "other", "ops", &def))
        .await;
    fx.post("first").await;
    let (status, v) = api(
        &relay,
        &stranger,
        "POST",
        "/workflows/other/runs",
        Some(&json!({})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let url = format!("http://127.0.0.1:{port}/metrics");
    let mut last = String::new();
    for _ in 0..100 {
        if let Ok(resp) = reqwest::get(&url).await {
            last = resp.text().await.unwrap_or_default();
            let scrape =
                prometheus_parse::Scrape::parse(last.lines().map(|l| Ok(l.to_string()))).expect("parse");
            let delivered = value(&scrape, "agent_turns_total", &[("outcome", "delivered")]);
            let failed = value(&scrape, "agent_turns_total", &[("outcome", "failed")]);
            let refused: f64 = scrape
                .samples
                .iter()
                .filter(|s| s.metric == "agent_verification_failures_total")
                .map(|_| 1.0)
                .sum();
            if delivered == 1.0 && refused >= 1.0 {
                assert_eq!(failed, 0.0, "a refused delivery is not a turn");
                assert!(value(&scrape, "agent_handler_seconds", &[]) >= 1.0, "{last}");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the agent's metrics did not move: {last}\n{}", agent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_says_when_it_cannot_reach_its_relay() {
    let mut relay = Relay::start(&Backend::Sqlite);
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = tests::agent::AgentProc::start(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"", "");
    agent.wait_subscribed().await;
    relay.kill();
    wait_for_log(&agent, &relay.ws_url()).await;
    // An agent started while its relay is down says so at once (naming
    // the relay and why), and runs once the relay is back.
    let late = tests::agent::AgentProc::start_unready(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"");
    wait_for_log(&late, &relay.http_url()).await;
    relay.restart();
    late.wait_subscribed().await;
}

/// Waits (10 s) for the agent's "cannot reach the relay" line naming `relay`.
async fn wait_for_log(agent: &tests::agent::AgentProc, relay: &str) {
    for _ in 0..100 {
        let log = agent.log();
        if log.contains("cannot reach the relay") {
            assert!(log.contains(relay), "the line names the relay ({relay}): {log}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the agent said nothing of the unreachable relay:\n{}",
        agent.log()
    );
}
