//! Rerun of a failed run from the step it failed at (NIP-86 `rerunrun`,
//! `rerunruns`, `relayctl runs rerun`), over real HTTP on every backend:
//! a `call_webhook` step that failed is called again once its server is
//! fixed while the steps before keep their results and are not run again;
//! a rerun asked again makes nothing; the latest definition is used only
//! when it keeps the steps before; a hundred runs failed with one error
//! code are rerun in bulk by a filter, and the others are left alone.

use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};
use serde_json::{json, Value};
use tests::hooks::{Answer, HookServer};
use tests::workflow::{
    api, get_run, ok, refused, relay_messages, relayctl, rpc, run_until, start_run, Fixture,
};
use tests::{backend_tests, Backend, Relay, RelayOptions};

backend_tests!(
    a_failed_call_is_rerun_from_its_step_once,
    the_latest_definition_is_used_only_when_it_keeps_the_steps_before,
    runs_failed_with_one_code_are_rerun_in_bulk_by_a_filter,
    a_cancelled_run_is_rerun_from_the_step_it_was_at,
);

const FAST: &str = "[deliveries]\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n\
[webhooks]\ncall_grace_secs = 1\n[communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n";

fn options() -> RelayOptions {
    RelayOptions {
        config_toml: FAST.into(),
        ..Default::default()
    }
}

/// A message, a webhook call, and a message reading both.
fn pipeline(url: &str, last: &str) -> Value {
    json!({"name": "pipe", "trigger": {"on": "manual"}, "steps": [
        {"id": "first", "action": "send_message", "text": "first {{trigger.body.text}}"},
        {"id": "call", "action": "call_webhook", "url": url, "body": {"text": "{{trigger.body.text}}"}},
        {"id": "last", "action": "send_message",
         "text": format!("{last} {{{{steps.call.output.body.ticket}}}} after {{{{steps.first.output.event_id}}}}")}
    ]})
}

/// A new revision of workflow `id`, `later` seconds ahead of now (a
/// revision of the same second as the one stored may lose to it).
async fn revise(fx: &mut Fixture, id: &str, def: &Value, later: u64) -> Event {
    let ev = EventBuilder::new(Kind::from_u16(30620), def.to_string())
        .tags([Tag::identifier(id), Tag::custom("h", [fx.channel.as_str()])])
        .custom_created_at(Timestamp::from_secs(Timestamp::now().as_secs() + later))
        .finalize(&fx.owner)
        .expect("sign");
    fx.owner_client.publish_ok(&ev).await;
    ev
}

fn ended(run: &Value) -> bool {
    tests::workflow::ended(run)
}

fn has_tag(e: &Event, name: &str, value: &str) -> bool {
    e.tags.iter().any(|t| {
        let s = t.as_slice();
        s.len() >= 2 && s[0] == name && s[1] == value
    })
}

fn count(msgs: &[Event], text: &str) -> usize {
    msgs.iter().filter(|m| m.content == text).count()
}

async fn a_failed_call_is_rerun_from_its_step_once(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/flaky", Answer::json(503, json!({"error": "maintenance"})));
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    fx.define("pipe", &pipeline(&server.url("/flaky"), "ticket"))
        .await;
    let origin = start_run(&relay, &fx.owner, "pipe", json!({"text": "hi"})).await;
    let failed = run_until(&relay, &fx.owner, &origin, 20, ended).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["step"], "call");
    assert_eq!(failed["error"]["code"], "http_503");
    let first_id = failed["steps"][0]["output"]["event_id"]
        .as_str()
        .unwrap()
        .to_string();

    server.answer("/flaky", Answer::json(200, json!({"ticket": 9})));
    refused(
        rpc(&relay, &Keys::generate(), "rerunrun", json!([origin])).await,
        403,
        "not_owner",
    );
    let a = ok(rpc(&relay, &fx.owner, "rerunrun", json!([origin])).await);
    assert_eq!(
        (&a["id"], &a["from_step"], &a["created"]),
        (&json!(origin), &json!("call"), &json!(true))
    );
    let rerun = a["rerun"].as_str().unwrap().to_string();
    assert_ne!(rerun, origin);
    let done = run_until(&relay, &fx.owner, &rerun, 20, ended).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["cause"], json!({"type": "rerun", "id": origin}));
    assert_eq!(done["steps"][0]["kept_from"], json!(origin));
    assert_eq!(done["steps"][0]["output"], failed["steps"][0]["output"]);
    assert!(done["steps"][1].get("kept_from").is_none(), "{done}");
    assert_eq!(done["steps"][1]["output"]["body"]["ticket"], 9);
    assert_eq!(done["steps"][1]["call"]["status"], 200, "{done}");

    // The first step did not run again; the rest ran once, reading both.
    let msgs = relay_messages(&relay, &fx).await;
    assert_eq!(count(&msgs, "first hi"), 1, "{msgs:?}");
    assert_eq!(count(&msgs, &format!("ticket 9 after {first_id}")), 1, "{msgs:?}");
    let got = server.received("/flaky");
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[1].header("idempotency-key"),
        Some(format!("{rerun}:call").as_str())
    );

    // Asked again: the same rerun, nothing new, no second notice.
    let again = ok(rpc(&relay, &fx.owner, "rerunrun", json!([origin])).await);
    assert_eq!(
        (&again["rerun"], &again["created"]),
        (&json!(rerun), &json!(false))
    );
    let msgs = relay_messages(&relay, &fx).await;
    let notices: Vec<&Event> = msgs.iter().filter(|m| has_tag(m, "nip86", "rerunrun")).collect();
    assert_eq!(notices.len(), 1, "{msgs:?}");
    assert!(has_tag(notices[0], "run", &origin) && has_tag(notices[0], "rerun", &rerun));
    let (_, shown) = get_run(&relay, &fx.owner, &origin).await;
    assert_eq!(shown["rerun_by"], json!(rerun));

    refused(
        rpc(&relay, &fx.owner, "rerunrun", json!([rerun])).await,
        409,
        "not_rerunnable",
    );
    refused(
        rpc(&relay, &fx.owner, "rerunrun", json!(["nope"])).await,
        404,
        "unknown_run",
    );
    refused(
        rpc(
            &relay,
            &fx.owner,
            "rerunrun",
            json!([origin, {"definition": "newest"}]),
        )
        .await,
        400,
        "invalid",
    );
}

async fn the_latest_definition_is_used_only_when_it_keeps_the_steps_before(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/down", Answer::json(503, json!({})));
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let url = server.url("/down");
    fx.define("pipe", &pipeline(&url, "v1")).await;
    let a = start_run(&relay, &fx.owner, "pipe", json!({"text": "a"})).await;
    let b = start_run(&relay, &fx.owner, "pipe", json!({"text": "b"})).await;
    for run in [&a, &b] {
        let r = run_until(&relay, &fx.owner, run, 20, ended).await;
        assert_eq!(r["status"], "failed", "{r}");
    }
    server.answer("/down", Answer::json(200, json!({"ticket": 5})));

    // v2 changes only the last step: a rerun with the latest runs it.
    let v2 = revise(&mut fx, "pipe", &pipeline(&url, "v2"), 2).await;
    let ra = ok(rpc(
        &relay,
        &fx.owner,
        "rerunrun",
        json!([a, {"definition": "latest"}]),
    )
    .await);
    let ra = ra["rerun"].as_str().unwrap().to_string();
    let done = run_until(&relay, &fx.owner, &ra, 20, ended).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["definition_event_id"], json!(v2.id.to_hex()));

    // v3 renames the first step: only the definition b ran with reruns it.
    let mut v3 = pipeline(&url, "v3");
    v3["steps"][0]["id"] = json!("hello");
    v3["steps"][2]["text"] = json!("v3 {{steps.call.output.body.ticket}}");
    revise(&mut fx, "pipe", &v3, 4).await;
    refused(
        rpc(
            &relay,
            &fx.owner,
            "rerunrun",
            json!([b, {"definition": "latest"}]),
        )
        .await,
        409,
        "definition_changed",
    );
    let rb = ok(rpc(&relay, &fx.owner, "rerunrun", json!([b])).await);
    let rb = rb["rerun"].as_str().unwrap().to_string();
    let done = run_until(&relay, &fx.owner, &rb, 20, ended).await;
    assert_eq!(done["status"], "completed", "{done}");
    let msgs = relay_messages(&relay, &fx).await;
    let b_first = done["steps"][0]["output"]["event_id"].as_str().unwrap();
    assert_eq!(count(&msgs, &format!("v1 5 after {b_first}")), 1, "{msgs:?}");
    assert!(msgs.iter().all(|m| !m.content.starts_with("v3")), "{msgs:?}");
}

/// Every run of a workflow, newest first, page by page.
async fn all_runs(relay: &Relay, owner: &Keys, workflow: &str) -> Vec<Value> {
    let mut runs = Vec::new();
    let mut query = String::new();
    for _ in 0..20 {
        let path = format!("/workflows/{workflow}/runs?limit=40{query}");
        let (status, page) = api(relay, owner, "GET", &path, None).await;
        assert_eq!(status, 200, "{page}");
        runs.extend(page["runs"].as_array().unwrap().iter().cloned());
        match (page["next_before"].as_i64(), page["next_before_id"].as_str()) {
            (Some(t), Some(id)) => query = format!("&before={t}&before_id={id}"),
            _ => return runs,
        }
    }
    panic!("more than 20 pages of runs");
}

/// The workflow's runs once there are `want` and all have ended (60 s).
async fn settled(relay: &Relay, owner: &Keys, want: usize) -> Vec<Value> {
    let mut last = 0;
    for _ in 0..240 {
        let runs = all_runs(relay, owner, "bulk").await;
        if runs.len() == want && runs.iter().all(ended) {
            return runs;
        }
        last = runs.iter().filter(|r| ended(r)).count();
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    panic!("{last} of {want} runs ended within 60 s");
}

async fn runs_failed_with_one_code_are_rerun_in_bulk_by_a_filter(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/bulk", Answer::json(503, json!({})));
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let def = json!({"name": "bulk", "trigger": {"on": "manual"}, "steps": [
        {"id": "call", "action": "call_webhook", "url": server.url("/bulk"), "body": {"n": "{{trigger.body.n}}"}}]});
    fx.define("bulk", &def).await;
    for n in 0..100 {
        start_run(&relay, &fx.owner, "bulk", json!({"n": n})).await;
    }
    let first = settled(&relay, &fx.owner, 100).await;
    let first_created = first
        .iter()
        .filter_map(|r| r["created_at"].as_i64())
        .min()
        .unwrap();
    server.answer("/bulk", Answer::json(500, json!({})));
    for n in 100..105 {
        start_run(&relay, &fx.owner, "bulk", json!({"n": n})).await;
    }
    settled(&relay, &fx.owner, 105).await;
    server.answer("/bulk", Answer::json(200, json!({"ok": true})));

    // Without --yes: what would be rerun, and nothing is.
    let since = first_created.to_string();
    let args = [
        "runs",
        "rerun",
        "--workflow",
        "bulk",
        "--error-code",
        "http_503",
        "--since",
        &since,
        "--limit",
        "500",
    ];
    let shown = relayctl(&relay, &fx.owner, &args);
    assert!(shown.contains("100 runs selected; nothing rerun"), "{shown}");
    let mut yes = args.to_vec();
    yes.extend(["--yes", "--json"]);
    let answer: Value = serde_json::from_str(&relayctl(&relay, &fx.owner, &yes)).unwrap();
    assert_eq!(answer["changed"].as_array().unwrap().len(), 100, "{answer}");
    assert_eq!(answer["refused"], json!([]));
    assert!(answer["changed"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["created"] == true));

    let runs = settled(&relay, &fx.owner, 205).await;
    let completed: Vec<&Value> = runs.iter().filter(|r| r["status"] == "completed").collect();
    assert_eq!(completed.len(), 100);
    assert!(completed.iter().all(|r| r["cause"]["type"] == "rerun"));
    let codes = |code: &str| runs.iter().filter(|r| r["error"]["code"] == code).count();
    assert_eq!((codes("http_503"), codes("http_500")), (100, 5));
    assert_eq!(server.received("/bulk").len(), 205);

    // Again: every origin was rerun before; nothing new is made.
    let answer: Value = serde_json::from_str(&relayctl(&relay, &fx.owner, &yes)).unwrap();
    assert!(
        answer["changed"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["created"] == false),
        "{answer}"
    );
    assert_eq!(all_runs(&relay, &fx.owner, "bulk").await.len(), 205);
}

/// A run cancelled while it waited is rerun from that step: the steps
/// before are kept, the wait starts again and the rest runs.
async fn a_cancelled_run_is_rerun_from_the_step_it_was_at(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let def = json!({"name": "wait", "trigger": {"on": "manual"}, "steps": [
        {"id": "hello", "action": "send_message", "text": "hello {{trigger.body.who}}"},
        {"id": "pause", "action": "delay", "secs": 3600},
        {"id": "bye", "action": "send_message", "text": "bye {{trigger.body.who}}"}]});
    fx.define("wait", &def).await;
    let origin = start_run(&relay, &fx.owner, "wait", json!({"who": "ann"})).await;
    run_until(&relay, &fx.owner, &origin, 20, |r| r["status"] == "waiting").await;
    ok(rpc(&relay, &fx.owner, "cancelrun", json!([origin])).await);
    let a = ok(rpc(&relay, &fx.owner, "rerunrun", json!([origin])).await);
    assert_eq!(a["from_step"], "pause");
    let rerun = a["rerun"].as_str().unwrap().to_string();
    let r = run_until(&relay, &fx.owner, &rerun, 20, |r| r["status"] == "waiting").await;
    assert_eq!(r["current_step"], 1, "{r}");
    assert_eq!(r["steps"][0]["kept_from"], json!(origin));
    assert!(r["wake_at"].as_i64().unwrap() > tests::now() as i64 + 3000, "{r}");
    let msgs = relay_messages(&relay, &fx).await;
    assert_eq!(count(&msgs, "hello ann"), 1, "{msgs:?}");
    // Cancelled in turn, it is rerun again from the same step.
    ok(rpc(&relay, &fx.owner, "cancelrun", json!([rerun])).await);
    let again = ok(rpc(&relay, &fx.owner, "rerunrun", json!([rerun])).await);
    let third = again["rerun"].as_str().unwrap().to_string();
    let r = run_until(&relay, &fx.owner, &third, 20, |r| r["status"] == "waiting").await;
    // The kept step still names the run it ran in.
    assert_eq!(r["steps"][0]["kept_from"], json!(origin), "{r}");
    assert_eq!(r["cause"], json!({"type": "rerun", "id": rerun}));
}
