//! Management (NIP-86 and ours, docs/protocol.md "Management") over real HTTP and
//! WebSocket, on every backend: each method by an admin, a workflow's
//! owner and a stranger; bans that hold at once (on a second process
//! too); a failed delivery re-driven until its run completes; pause and
//! resume; every action visible as the relay's notice.

use std::time::Duration;

use nostr::prelude::{Event, Keys};
use serde_json::{json, Value};
use tests::workflow::{api, claim_when_due, finish, ok, refused, rpc, rpc_as, run_until, start_run, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    nip86_lists_and_names_by_admin_owner_and_stranger,
    a_failed_delivery_is_retried_and_its_run_continues,
    cancel_delivery_and_cancel_run,
    pause_holds_open_work_and_resume_restores_triggers,
);

const FAST: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n";

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

/// Options making `admin` an admin of the default community.
fn with_admin(admin: &Keys) -> RelayOptions {
    RelayOptions {
        config_toml: format!("{FAST}[communities.default]\nadmins = [\"{}\"]\n", hex(admin)),
        ..Default::default()
    }
}

/// The relay's management notices (NIP-32 labels) in the community.
async fn labels(relay: &Relay, relay_pk: &str) -> Vec<Event> {
    let mut c = Client::connect(&relay.ws_url()).await;
    c.req("l", vec![json!({"kinds": [1985], "authors": [relay_pk]})])
        .await
        .events()
}

fn tag<'e>(e: &'e Event, name: &str) -> Option<&'e str> {
    e.tags
        .iter()
        .find(|t| t.kind() == name)
        .and_then(|t| t.as_slice().get(1))
        .map(String::as_str)
}

async fn nip86_lists_and_names_by_admin_owner_and_stranger(backend: Backend) {
    let admin = Keys::generate();
    let relay = Relay::start_opts(&backend, with_admin(&admin));
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("w", &tests::workflow::on_message("noted")).await;
    let (owner, stranger, spammer) = (fx.owner.clone(), Keys::generate(), Keys::generate());

    // supportedmethods: all for the admin, the owner's share for an owner.
    let all = ok(rpc(&relay, &admin, "supportedmethods", json!([])).await);
    assert_eq!(all.as_array().unwrap().len(), 22, "{all}");
    let owners = ok(rpc(&relay, &owner, "supportedmethods", json!([])).await);
    let owners: Vec<&str> = owners
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        owners.contains(&"retrydelivery") && owners.contains(&"rerunrun") && !owners.contains(&"banpubkey"),
        "{owners:?}"
    );
    refused(
        rpc(&relay, &stranger, "supportedmethods", json!([])).await,
        403,
        "restricted:",
    );

    // A spammer posts; the admin bans it (the owner and a stranger may not).
    let mut sc = Client::connect(&relay.ws_url()).await;
    let spam = event(&spammer, 1, "buy now", &[]);
    sc.publish_ok(&spam).await;
    for who in [&owner, &stranger] {
        let params = json!([hex(&spammer), "spam"]);
        refused(rpc(&relay, who, "banpubkey", params).await, 403, "restricted:");
    }
    assert_eq!(
        ok(rpc(&relay, &admin, "banpubkey", json!([hex(&spammer), "spam"])).await),
        json!(true)
    );
    // At once: its events, its AUTH and its HTTP calls are refused.
    let (accepted, msg) = sc.publish(&event(&spammer, 1, "again", &[])).await;
    assert!(!accepted && msg.starts_with("blocked:"), "{msg}");
    let (authed, msg) = sc.auth_as(&spammer, &relay.ws_url()).await;
    assert!(!authed && msg.starts_with("blocked:"), "{msg}");
    let (status, v) = api(&relay, &spammer, "GET", "/me", None).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("banned")), "{v}");
    // Nothing of it was deleted silently: its earlier note stays.
    let mut reader = Client::connect(&relay.ws_url()).await;
    let kept = reader
        .req("k", vec![json!({"ids": [spam.id.to_hex()]})])
        .await
        .events();
    assert_eq!(kept.len(), 1);
    let listed = ok(rpc(&relay, &admin, "listbannedpubkeys", json!([])).await);
    assert_eq!(listed, json!([{"pubkey": hex(&spammer), "reason": "spam"}]));
    refused(
        rpc(&relay, &owner, "listbannedpubkeys", json!([])).await,
        403,
        "restricted:",
    );

    // allowpubkey lifts the ban and lists the key as allowed.
    assert_eq!(
        ok(rpc(&relay, &admin, "allowpubkey", json!([hex(&spammer), "appealed"])).await),
        json!(true)
    );
    sc.publish_ok(&event(&spammer, 1, "sorry", &[])).await;
    assert_eq!(
        ok(rpc(&relay, &admin, "listbannedpubkeys", json!([])).await),
        json!([])
    );
    let allowed = ok(rpc(&relay, &admin, "listallowedpubkeys", json!([])).await);
    assert_eq!(allowed, json!([{"pubkey": hex(&spammer), "reason": "appealed"}]));
    refused(
        rpc(&relay, &stranger, "allowpubkey", json!([hex(&stranger)])).await,
        403,
        "restricted:",
    );
    refused(
        rpc(&relay, &owner, "listallowedpubkeys", json!([])).await,
        403,
        "restricted:",
    );

    // banevent removes the event and refuses it from then on.
    refused(
        rpc(&relay, &owner, "banevent", json!([spam.id.to_hex()])).await,
        403,
        "restricted:",
    );
    ok(rpc(&relay, &admin, "banevent", json!([spam.id.to_hex(), "scam link"])).await);
    let gone = reader
        .req("g", vec![json!({"ids": [spam.id.to_hex()]})])
        .await
        .events();
    assert!(gone.is_empty(), "{gone:?}");
    let (accepted, msg) = sc.publish(&spam).await;
    assert!(!accepted && msg.starts_with("blocked:"), "{msg}");
    let events = ok(rpc(&relay, &admin, "listbannedevents", json!([])).await);
    assert_eq!(events, json!([{"id": spam.id.to_hex(), "reason": "scam link"}]));
    refused(
        rpc(&relay, &stranger, "listbannedevents", json!([])).await,
        403,
        "restricted:",
    );

    // Name and description, as NIP-11 shows them; the WebSocket URL is a
    // `u` the relay accepts too.
    let ws_u = format!("ws://{}", relay.addr);
    ok(rpc_as(&relay, &admin, &ws_u, "changerelayname", json!(["Ops relay"])).await);
    ok(rpc(
        &relay,
        &admin,
        "changerelaydescription",
        json!(["Where ops talks to agents"]),
    )
    .await);
    refused(
        rpc(&relay, &owner, "changerelayname", json!(["mine"])).await,
        403,
        "restricted:",
    );
    refused(
        rpc(&relay, &stranger, "changerelaydescription", json!(["x"])).await,
        403,
        "restricted:",
    );
    let info = reqwest::Client::new()
        .get(relay.http_url())
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        (info["name"].as_str(), info["description"].as_str()),
        (Some("Ops relay"), Some("Where ops talks to agents"))
    );
    assert!(
        info["supported_nips"].as_array().unwrap().contains(&json!(86)),
        "{info}"
    );

    // Every change is the relay's notice naming the admin.
    let notices = labels(&relay, &fx.relay_pk).await;
    let mut methods: Vec<&str> = notices
        .iter()
        .filter_map(|e| {
            e.tags
                .iter()
                .find(|t| t.kind() == "l")
                .and_then(|t| t.as_slice().get(1))
                .map(String::as_str)
        })
        .collect();
    methods.sort_unstable();
    assert_eq!(
        methods,
        [
            "allowpubkey",
            "banevent",
            "banpubkey",
            "changerelaydescription",
            "changerelayname"
        ]
    );
    for n in &notices {
        assert_eq!(tag(n, "by"), Some(hex(&admin).as_str()), "{n:?}");
        assert_eq!(tag(n, "L"), Some("nip86"));
    }

    // Refusals say what is wrong, machine-readably.
    refused(
        rpc(&relay, &admin, "dropeverything", json!([])).await,
        400,
        "invalid:",
    );
    refused(
        rpc(&relay, &admin, "banpubkey", json!(["not hex"])).await,
        400,
        "invalid:",
    );
    let plain = reqwest::Client::new()
        .post(format!("{}/", relay.http_url()))
        .header("Content-Type", "application/json")
        .header(
            "Authorization",
            protocol::nip98::header(&admin, "POST", &format!("http://{}/", relay.addr), b"{}"),
        )
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 415);
    let unsigned = reqwest::Client::new()
        .post(format!("{}/", relay.http_url()))
        .header("Content-Type", protocol::nip86::CONTENT_TYPE)
        .body(r#"{"method":"supportedmethods","params":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status().as_u16(), 401);
}

/// A workflow that asks agent 0 and then says what it answered.
fn ask_then_say(fx: &Fixture, trigger: Value) -> Value {
    json!({"name": "ask", "trigger": trigger, "steps": [
        {"id": "ask", "action": "ask_agent", "text": format!("{} check the disk", fx.mention(0))},
        {"id": "say", "action": "send_message", "text": "agent said: {{steps.ask.output.reply}}"}]})
}

fn reply(agent: &Keys, text: &str) -> Event {
    event(agent, 9, text, &[&["h", "ops"]])
}

/// The relay's kind 9 notices of management actions in channel `ops`.
async fn channel_notices(relay: &Relay, fx: &Fixture) -> Vec<Event> {
    tests::workflow::relay_messages(relay, fx)
        .await
        .into_iter()
        .filter(|e| tag(e, "nip86").is_some())
        .collect()
}

async fn a_failed_delivery_is_retried_and_its_run_continues(backend: Backend) {
    let admin = Keys::generate();
    let relay = Relay::start_opts(&backend, with_admin(&admin));
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    fx.define("ask", &ask_then_say(&fx, json!({"on": "manual"})))
        .await;
    let run_id = start_run(&relay, &fx.owner, "ask", json!({})).await;
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let body =
        json!({"claim_token": d["claim_token"], "outcome": "failed", "failure_code": "disk_tool_down"});
    assert_eq!(finish(&relay, &agent, &id, &body).await.0, 200);
    let run = run_until(&relay, &fx.owner, &run_id, 10, |r| r["status"] == "failed").await;
    assert_eq!(run["error"]["step"], "ask", "{run}");

    // The owner finds it, and may retry it; a stranger may do neither.
    let stranger = Keys::generate();
    let failed = ok(rpc(
        &relay,
        &fx.owner,
        "listdeliveries",
        json!([{"status": "failed", "workflow": "ask"}]),
    )
    .await);
    assert_eq!(failed.as_array().unwrap().len(), 1, "{failed}");
    assert_eq!(failed[0]["id"], id.as_str());
    refused(
        rpc(&relay, &stranger, "listdeliveries", json!([])).await,
        403,
        "restricted:",
    );
    let by_admin = ok(rpc(&relay, &admin, "listdeliveries", json!([{"older_than_secs": 0}])).await);
    assert_eq!(by_admin.as_array().unwrap().len(), 1, "{by_admin}");
    refused(
        rpc(&relay, &stranger, "retrydelivery", json!([id])).await,
        403,
        "not_owner:",
    );
    let retried = ok(rpc(&relay, &fx.owner, "retrydelivery", json!([id])).await);
    assert_eq!(retried, json!({"id": id, "status": "pending"}));
    // Retrying what is no longer ended is refused.
    refused(
        rpc(&relay, &fx.owner, "retrydelivery", json!([id])).await,
        409,
        "not_retryable:",
    );
    let run = run_until(&relay, &fx.owner, &run_id, 10, |r| r["status"] == "waiting").await;
    assert!(run["error"].is_null(), "{run}");

    // Delivered on the second attempt, the run goes on from its step.
    let d = claim_when_due(&relay, &agent, json!({})).await;
    assert_eq!(
        (d["id"].as_str(), d["attempt"].as_i64()),
        (Some(id.as_str()), Some(2))
    );
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply(&agent, "disk is fine")});
    assert_eq!(finish(&relay, &agent, &id, &body).await.0, 200);
    let run = run_until(&relay, &fx.owner, &run_id, 10, tests::workflow::ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["status"], "done", "{run}");
    let said = tests::workflow::relay_messages(&relay, &fx).await;
    assert!(
        said.iter().any(|m| m.content == "agent said: disk is fine"),
        "{said:?}"
    );
    // Its history keeps both attempts.
    let (_, shown) = api(&relay, &fx.owner, "GET", &format!("/deliveries/{id}"), None).await;
    let outcomes: Vec<&str> = shown["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["failed", "delivered"], "{shown}");
    refused(
        rpc(&relay, &admin, "retrydelivery", json!([id])).await,
        409,
        "not_retryable:",
    );
    refused(
        rpc(&relay, &admin, "retrydelivery", json!(["0123abcd"])).await,
        404,
        "not_found:",
    );
    // The channel saw who retried it.
    let notices = channel_notices(&relay, &fx).await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(tag(&notices[0], "nip86"), Some("retrydelivery"));
    assert_eq!(tag(&notices[0], "by"), Some(hex(&fx.owner).as_str()));
    assert_eq!(tag(&notices[0], "delivery"), Some(id.as_str()));
}

async fn cancel_delivery_and_cancel_run(backend: Backend) {
    let admin = Keys::generate();
    let relay = Relay::start_opts(&backend, with_admin(&admin));
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    fx.define("ask", &ask_then_say(&fx, json!({"on": "manual"})))
        .await;
    let stranger = Keys::generate();

    // canceldelivery: the held row is cancelled (its holder's finish is
    // refused) and the run waiting on it fails.
    let first = start_run(&relay, &fx.owner, "ask", json!({})).await;
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();
    refused(
        rpc(&relay, &stranger, "canceldelivery", json!([id])).await,
        403,
        "not_owner:",
    );
    let cancelled = ok(rpc(&relay, &admin, "canceldelivery", json!([id])).await);
    assert_eq!(cancelled, json!({"id": id, "status": "cancelled"}));
    refused(
        rpc(&relay, &admin, "canceldelivery", json!([id])).await,
        409,
        "already_ended:",
    );
    let body =
        json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply(&agent, "late")});
    let (status, v) = finish(&relay, &agent, &id, &body).await;
    assert_eq!((status, v["error"].as_str()), (410, Some("cancelled")), "{v}");
    let run = run_until(&relay, &fx.owner, &first, 10, tests::workflow::ended).await;
    assert_eq!(run["status"], "failed", "{run}");
    let (_, shown) = api(&relay, &fx.owner, "GET", &format!("/deliveries/{id}"), None).await;
    assert_eq!(shown["failure_code"], "cancelled_by_operator", "{shown}");
    assert_eq!(shown["attempts"][0]["outcome"], "cancelled", "{shown}");

    // cancelrun: the run and its open delivery.
    let second = start_run(&relay, &fx.owner, "ask", json!({})).await;
    run_until(&relay, &fx.owner, &second, 10, |r| r["status"] == "waiting").await;
    refused(
        rpc(&relay, &stranger, "cancelrun", json!([second])).await,
        403,
        "not_owner:",
    );
    let changed = ok(rpc(&relay, &fx.owner, "cancelrun", json!([second])).await);
    assert_eq!(changed, json!({"id": second, "status": "cancelled"}));
    refused(
        rpc(&relay, &admin, "cancelrun", json!([second])).await,
        409,
        "run_ended:",
    );
    refused(
        rpc(&relay, &admin, "cancelrun", json!(["feedbeef"])).await,
        404,
        "unknown_run:",
    );
    let run = run_until(&relay, &fx.owner, &second, 10, tests::workflow::ended).await;
    assert_eq!(
        (run["status"].as_str(), run["error"]["code"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{run}"
    );
    let open = ok(rpc(&relay, &admin, "listdeliveries", json!([{"status": "pending"}])).await);
    assert_eq!(open, json!([]), "the run's delivery was cancelled with it");
    let notices = channel_notices(&relay, &fx).await;
    let mut said: Vec<(&str, &str)> = notices
        .iter()
        .map(|n| (tag(n, "nip86").unwrap(), tag(n, "by").unwrap()))
        .collect();
    said.sort_unstable();
    let (a, o) = (hex(&admin), hex(&fx.owner));
    assert_eq!(said, [("canceldelivery", a.as_str()), ("cancelrun", o.as_str())]);
}

async fn pause_holds_open_work_and_resume_restores_triggers(backend: Backend) {
    let admin = Keys::generate();
    let mut options = with_admin(&admin);
    options.config_toml = format!("metrics_listen = \"127.0.0.1:0\"\n{}", options.config_toml);
    let relay = Relay::start_opts(&backend, options);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    let trigger = json!({"on": "message_posted", "filter": {"text_contains": "alert"}});
    fx.define("watch", &ask_then_say(&fx, trigger)).await;
    fx.post("alert: disk almost full").await;
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();

    refused(
        rpc(&relay, &Keys::generate(), "pauseworkflow", json!(["watch"])).await,
        403,
        "not_owner:",
    );
    let paused = ok(rpc(&relay, &fx.owner, "pauseworkflow", json!(["watch"])).await);
    assert_eq!(paused, json!({"id": "watch", "paused": true}));
    // Paused: no new run, and the open delivery stays the agent's to finish.
    fx.post("alert: disk full now").await;
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply(&agent, "cleaned /tmp")});
    assert_eq!(finish(&relay, &agent, &id, &body).await.0, 200);
    // The finish woke the run; the engine must leave it where it is.
    fx.barrier(&relay).await;
    let (_, runs) = api(&relay, &fx.owner, "GET", "/workflows/watch/runs", None).await;
    let runs = runs["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 1, "{runs:?}");
    // Its run is held at the step it was on.
    assert_eq!(runs[0]["status"], "waiting", "{runs:?}");
    // The message its trigger matched while paused is counted, not lost unseen.
    let passed = relay.metric_lines("relay_trigger_refusals_total").await;
    assert!(
        passed.len() == 1
            && passed[0].contains("trigger=\"message_posted\"")
            && passed[0].contains("code=\"workflow_paused\"")
            && passed[0].ends_with(" 1"),
        "{passed:?}"
    );
    let run_id = runs[0]["id"].as_str().unwrap().to_string();
    // Pausing twice changes nothing (and posts no second notice).
    ok(rpc(&relay, &admin, "pauseworkflow", json!(["watch"])).await);

    let resumed = ok(rpc(&relay, &admin, "resumeworkflow", json!(["watch"])).await);
    assert_eq!(resumed, json!({"id": "watch", "paused": false}));
    let run = run_until(&relay, &fx.owner, &run_id, 10, tests::workflow::ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    // Triggers fire again (the message posted while paused started nothing).
    fx.post("alert: disk full again").await;
    let d = claim_when_due(&relay, &agent, json!({})).await;
    assert_ne!(d["id"].as_str(), Some(id.as_str()));
    let (_, runs) = api(&relay, &fx.owner, "GET", "/workflows/watch/runs", None).await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "{runs}");
    refused(
        rpc(&relay, &admin, "pauseworkflow", json!(["nope"])).await,
        404,
        "unknown_workflow:",
    );
    let notices = channel_notices(&relay, &fx).await;
    let said: Vec<&str> = notices.iter().map(|n| tag(n, "nip86").unwrap()).collect();
    assert_eq!(
        said.iter().filter(|m| **m == "pauseworkflow").count(),
        1,
        "{said:?}"
    );
    assert_eq!(
        said.iter().filter(|m| **m == "resumeworkflow").count(),
        1,
        "{said:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
async fn a_ban_holds_on_a_second_relay_process() {
    let backend = Backend::postgres();
    let admin = Keys::generate();
    let store = tests::relay::Store::new(&backend);
    let a = Relay::start_with(store.clone(), with_admin(&admin));
    let b = Relay::start_with(store.clone(), with_admin(&admin));
    let spammer = Keys::generate();
    let mut on_b = Client::connect(&b.ws_url()).await;
    // B has read the community's (empty) bans before the ban.
    on_b.publish_ok(&event(&spammer, 1, "first", &[])).await;
    ok(rpc(&a, &admin, "banpubkey", json!([hex(&spammer), "spam"])).await);
    // B refuses the next event: the relay's notice reached it through
    // the fan-out and it forgot what it had read.
    let mut refused_after = None;
    for i in 0..100 {
        let (accepted, msg) = on_b.publish(&event(&spammer, 1, &format!("try {i}"), &[])).await;
        if !accepted {
            assert!(msg.starts_with("blocked:"), "{msg}");
            refused_after = Some(i);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    refused_after.expect("B never refused the banned pubkey");
    let (status, _) = api(&b, &spammer, "GET", "/me", None).await;
    assert_eq!(status, 403);
}
