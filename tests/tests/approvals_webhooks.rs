//! Workflows v2, part 2, over real sockets and HTTP on every backend:
//! `request_approval` decided by NIP-25 reactions (first approver counts,
//! others change nothing, deny, timeout, a race on two processes, a
//! decision the engine finds after a restart), `call_webhook` against a
//! server the test runs (output used by the next step, non-2xx, timeout,
//! signature, secrets sealed at rest, the address guard, crash and retry
//! with a stable idempotency key), and the `reaction_added` trigger.

use std::time::Duration;

use hmac::{Hmac, Mac};
use nostr::prelude::{Event, Keys, ToBech32};
use serde_json::{json, Value};
use sha2::Sha256;
use tests::hooks::{Answer, HookServer};
use tests::relay::Store;
use tests::workflow::{api, ended, eventually, relay_messages, run_until, start_run, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    an_approver_approves_and_others_change_nothing,
    deny_fails_or_continues,
    an_approval_times_out,
    a_reaction_after_the_deadline_decides_nothing,
    two_approvers_racing_on_two_processes_decide_once,
    a_decision_stored_while_the_engine_is_down_is_found_after_restart,
    a_webhook_answer_feeds_the_next_step_signed_with_a_sealed_secret,
    webhook_failures_fail_the_run_with_their_code,
    one_owners_hanging_calls_leave_another_owners_call_alone,
    the_address_guard_refuses_every_loopback_form_and_plain_http,
    a_crash_mid_call_retries_only_when_asked_with_the_same_key,
    calls_over_tls_verify_the_server,
    reactions_trigger_workflows_without_loops,
    v2_part2_definitions_are_validated_at_publish,
);

const FAST: &str = "[deliveries]\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n";

fn options(extra: &str) -> RelayOptions {
    RelayOptions {
        config_toml: format!("{FAST}{extra}"),
        ..Default::default()
    }
}

/// Webhooks may reach the test's own server on loopback.
fn hooks_allowed() -> RelayOptions {
    options("[webhooks]\ncall_grace_secs = 1\n[communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n")
}

/// The status of each step of a run view.
fn step_statuses(run: &Value) -> Vec<&str> {
    run["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["status"].as_str().expect("status"))
        .collect()
}

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

/// Adds `who` to the fixture's channel.
async fn add_member(fx: &mut Fixture, who: &Keys) {
    let put = event(&fx.owner, 9000, "", &[&["h", &fx.channel], &["p", &hex(who)]]);
    fx.owner_client.publish_ok(&put).await;
}

/// Reacts with `content` to `target` in the fixture's channel as `who`.
async fn react(relay: &Relay, fx: &Fixture, who: &Keys, target: &str, content: &str) -> Event {
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(who).await;
    let ev = event(who, 7, content, &[&["e", target], &["h", &fx.channel]]);
    c.publish_ok(&ev).await;
    ev
}

fn tag<'e>(ev: &'e Event, name: &str) -> Option<&'e [String]> {
    ev.tags.iter().find(|t| t.kind() == name).map(|t| t.as_slice())
}

fn tag_values(ev: &Event, name: &str) -> Vec<String> {
    ev.tags
        .iter()
        .filter(|t| t.kind() == name)
        .filter_map(|t| t.content().map(str::to_string))
        .collect()
}

/// The approval request of `run_id`, once the run waits for it.
async fn request_of(relay: &Relay, fx: &Fixture, run_id: &str) -> Event {
    run_until(relay, &fx.owner, run_id, 10, |r| r["status"] == "waiting").await;
    let msgs = relay_messages(relay, fx).await;
    msgs.into_iter()
        .find(|m| {
            tag(m, "workflow-approval").is_some_and(|t| t[1] == "request")
                && tag(m, "workflow-run").is_some_and(|t| t[1] == run_id)
        })
        .expect("the approval request is stored")
}

/// The relay's decision messages under `request`.
async fn decisions_under(relay: &Relay, fx: &Fixture, request: &Event) -> Vec<Event> {
    relay_messages(relay, fx)
        .await
        .into_iter()
        .filter(|m| {
            tag(m, "e").is_some_and(|t| t[1] == request.id.to_hex())
                && tag(m, "workflow-approval").is_some_and(|t| t[1] != "request")
        })
        .collect()
}

fn approval_def(approvers: &[String], on_deny: &str, timeout: u64) -> Value {
    json!({"name": "deploy", "trigger": {"on": "manual"}, "steps": [
        {"id": "ok", "action": "request_approval", "text": "Deploy {{trigger.body.version}}?",
         "approvers": approvers, "on_deny": on_deny, "timeout_secs": timeout},
        {"id": "go", "action": "send_message", "if": "steps.ok.output.decision == 'approved'",
         "text": "deploying after {{steps.ok.output.decision}} by {{steps.ok.output.by}}"},
        {"id": "no", "action": "send_message", "if": "steps.ok.output.decision != 'approved'",
         "text": "not deploying: {{steps.ok.output.decision}}"}]})
}

async fn an_approver_approves_and_others_change_nothing(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let (approver, stranger) = (Keys::generate(), Keys::generate());
    add_member(&mut fx, &approver).await;
    add_member(&mut fx, &stranger).await;
    fx.define("deploy", &approval_def(&[hex(&approver)], "fail", 3600))
        .await;
    let run_id = start_run(&relay, &fx.owner, "deploy", json!({"version": "v2"})).await;
    let request = request_of(&relay, &fx, &run_id).await;
    assert_eq!(request.content, "Deploy v2?");
    assert_eq!(tag_values(&request, "p"), [hex(&fx.owner), hex(&approver)]);
    assert_eq!(tag(&request, "workflow-step").unwrap()[1], "ok");
    let request_id = request.id.to_hex();

    // A stranger's approval and an approver's other reaction change nothing.
    react(&relay, &fx, &stranger, &request_id, "+").await;
    react(&relay, &fx, &approver, &request_id, "❤️").await;
    react(&relay, &fx, &approver, &request_id, "").await;
    fx.barrier(&relay).await;
    let (_, run) = tests::workflow::get_run(&relay, &fx.owner, &run_id).await;
    assert_eq!(run["status"], "waiting", "{run}");
    assert_eq!(run["steps"][0]["status"], "waiting", "{run}");

    let decision = react(&relay, &fx, &approver, &request_id, "👍🏽").await;
    let run = run_until(&relay, &fx.owner, &run_id, 10, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["steps"][0]["output"],
        json!({"decision": "approved", "by": hex(&approver), "event_id": decision.id.to_hex()})
    );
    let statuses = step_statuses(&run);
    assert_eq!(statuses, ["done", "done", "skipped"], "{run}");

    // A later decision (the owner's deny) counts for nothing.
    react(&relay, &fx, &fx.owner.clone(), &request_id, "-").await;
    fx.barrier(&relay).await;
    let decisions = decisions_under(&relay, &fx, &request).await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    let npub = approver.public_key().to_bech32().unwrap();
    assert_eq!(decisions[0].content, format!("Approved by nostr:{npub}"));
    assert_eq!(tag(&decisions[0], "e").unwrap()[3], "root");
    assert_eq!(tag(&decisions[0], "workflow-approval").unwrap()[1], "approved");
    let msgs = relay_messages(&relay, &fx).await;
    let go: Vec<&Event> = msgs
        .iter()
        .filter(|m| m.content.starts_with("deploying after"))
        .collect();
    assert_eq!(go.len(), 1);
    assert_eq!(
        go[0].content,
        format!("deploying after approved by {}", hex(&approver))
    );
}

async fn deny_fails_or_continues(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    fx.define("strict", &approval_def(&[], "fail", 3600)).await;
    fx.define("lenient", &approval_def(&[], "continue", 3600)).await;
    let strict = start_run(&relay, &fx.owner, "strict", json!({"version": "1"})).await;
    let lenient = start_run(&relay, &fx.owner, "lenient", json!({"version": "2"})).await;
    let r1 = request_of(&relay, &fx, &strict).await;
    let r2 = request_of(&relay, &fx, &lenient).await;
    let owner = fx.owner.clone();
    react(&relay, &fx, &owner, &r1.id.to_hex(), "-").await;
    react(&relay, &fx, &owner, &r2.id.to_hex(), "👎").await;

    let run = run_until(&relay, &fx.owner, &strict, 10, ended).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "denied", "{run}");
    assert_eq!(run["error"]["step"], "ok", "{run}");
    assert_eq!(run["steps"][0]["status"], "failed");
    assert_eq!(run["steps"][0]["output"]["decision"], "denied");
    assert_eq!(run["steps"][1]["status"], "pending", "{run}");

    let run = run_until(&relay, &fx.owner, &lenient, 10, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let statuses = step_statuses(&run);
    assert_eq!(statuses, ["failed", "skipped", "done"], "{run}");
    assert_eq!(run["steps"][0]["error"]["code"], "denied");
    let denied = decisions_under(&relay, &fx, &r2).await;
    assert_eq!(denied.len(), 1);
    assert!(
        denied[0].content.starts_with("Denied by nostr:npub1"),
        "{}",
        denied[0].content
    );
}

async fn an_approval_times_out(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    fx.define("deploy", &approval_def(&[], "fail", 60)).await;
    let run_id = start_run(&relay, &fx.owner, "deploy", json!({"version": "v3"})).await;
    let request = request_of(&relay, &fx, &run_id).await;
    let run = run_until(&relay, &fx.owner, &run_id, 75, ended).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "step_timeout", "{run}");
    assert_eq!(
        run["steps"][0]["output"],
        json!({"decision": "timed_out", "by": "", "event_id": ""})
    );
    // A decision after the deadline changes nothing.
    let owner = fx.owner.clone();
    react(&relay, &fx, &owner, &request.id.to_hex(), "+").await;
    fx.barrier(&relay).await;
    let decisions = decisions_under(&relay, &fx, &request).await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(
        decisions[0].content,
        "No decision within 60 s: the request timed out"
    );
    let (_, again) = tests::workflow::get_run(&relay, &fx.owner, &run_id).await;
    assert_eq!(again["status"], "failed");
}

/// The deadline decides, in the transaction that stores the reaction: a
/// reaction that comes after it, before the engine's pass has timed the
/// request out, approves nothing. (The test moves the step's start back
/// past its timeout, as if the time had passed, and leaves the engine's
/// wake-up where it was, so that the reaction comes first.)
async fn a_reaction_after_the_deadline_decides_nothing(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    fx.define("deploy", &approval_def(&[], "continue", 60)).await;
    let run_id = start_run(&relay, &fx.owner, "deploy", json!({"version": "late"})).await;
    let request = request_of(&relay, &fx, &run_id).await;
    let db = &relay.store;
    let run_where = format!("community_id = 'default' AND id = '{run_id}'");
    let approval_where = format!("community_id = 'default' AND run_id = '{run_id}'");
    // The request's deadline is the step's start plus its timeout.
    let started = db.sql(&format!(
        "SELECT step_started_at FROM workflow_runs WHERE {run_where}"
    ));
    let deadline = db.sql(&format!(
        "SELECT deadline FROM workflow_approvals WHERE {approval_where}"
    ));
    assert_eq!(
        deadline.parse::<i64>().unwrap(),
        started.parse::<i64>().unwrap() + 60
    );
    db.sql(&format!(
        "UPDATE workflow_runs SET step_started_at = step_started_at - 61 WHERE {run_where}"
    ));
    db.sql(&format!(
        "UPDATE workflow_approvals SET deadline = deadline - 61 WHERE {approval_where}"
    ));
    let owner = fx.owner.clone();
    react(&relay, &fx, &owner, &request.id.to_hex(), "+").await;
    let decision = db.sql(&format!(
        "SELECT COALESCE(decision, 'none') FROM workflow_approvals WHERE {approval_where}"
    ));
    assert_eq!(
        decision, "none",
        "a reaction after the deadline decided the request"
    );
    // The engine's pass, when it comes, times the request out.
    db.sql(&format!("UPDATE workflow_runs SET wake_at = 0 WHERE {run_where}"));
    let run = run_until(&relay, &fx.owner, &run_id, 10, ended).await;
    assert_eq!(run["steps"][0]["output"]["decision"], "timed_out", "{run}");
    assert_eq!(step_statuses(&run), ["failed", "skipped", "done"], "{run}");
}

async fn two_approvers_racing_on_two_processes_decide_once(backend: Backend) {
    let store = Store::new(&backend);
    let a = Relay::start_with(store.clone(), options(""));
    let b = Relay::start_with(store.clone(), options(""));
    let mut fx = Fixture::new(&a, "ops", 0).await;
    let (x, y) = (Keys::generate(), Keys::generate());
    add_member(&mut fx, &x).await;
    add_member(&mut fx, &y).await;
    fx.define("deploy", &approval_def(&[hex(&x), hex(&y)], "continue", 3600))
        .await;
    for round in 0..4 {
        let run_id = start_run(&a, &fx.owner, "deploy", json!({"version": round})).await;
        let request = request_of(&a, &fx, &run_id).await;
        let id = request.id.to_hex();
        let (ex, ey) = tokio::join!(react(&a, &fx, &x, &id, "+"), react(&b, &fx, &y, &id, "-"));
        let run = run_until(&b, &fx.owner, &run_id, 10, ended).await;
        let out = &run["steps"][0]["output"];
        let (winner, reaction) = if out["by"] == hex(&x) {
            ("approved", &ex)
        } else {
            ("denied", &ey)
        };
        assert_eq!(out["decision"], winner, "{run}");
        assert_eq!(out["event_id"], reaction.id.to_hex(), "{run}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let decisions = decisions_under(&a, &fx, &request).await;
        assert_eq!(decisions.len(), 1, "round {round}: {decisions:?}");
        assert_eq!(tag(&decisions[0], "workflow-approval").unwrap()[1], winner);
    }
}

async fn a_decision_stored_while_the_engine_is_down_is_found_after_restart(backend: Backend) {
    // The engine fails every time it would end the step: the decision is
    // stored (OK true) but nothing acts on it until the process is gone.
    let faulty = RelayOptions {
        env: vec![("RELAY_FAULTS".into(), "approval:before_end=error".into())],
        ..options("")
    };
    let mut relay = Relay::start_opts(&backend, faulty);
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let approver = Keys::generate();
    add_member(&mut fx, &approver).await;
    fx.define("deploy", &approval_def(&[hex(&approver)], "fail", 3600))
        .await;
    let run_id = start_run(&relay, &fx.owner, "deploy", json!({"version": "v9"})).await;
    let request = request_of(&relay, &fx, &run_id).await;
    let decision = react(&relay, &fx, &approver, &request.id.to_hex(), "+").await;
    eventually(|| async { relay.log().contains("approval:before_end").then_some(()) }).await;
    let (_, run) = tests::workflow::get_run(&relay, &fx.owner, &run_id).await;
    assert_eq!(run["status"], "waiting", "{run}");

    relay.kill();
    relay.restart_with(options(""));
    let run = run_until(&relay, &fx.owner, &run_id, 15, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["output"]["event_id"], decision.id.to_hex());
    assert_eq!(decisions_under(&relay, &fx, &request).await.len(), 1);
}

fn verify_signature(secret: &str, body: &[u8], header: &str) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    header == format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn webhook_def(url: &str, extra: Value) -> Value {
    let mut call = json!({"id": "call", "action": "call_webhook", "url": url,
                          "body": {"text": "{{trigger.body.text}}", "n": "{{trigger.body.n}}", "fixed": [1, true]}});
    for (k, v) in extra.as_object().unwrap() {
        call[k] = v.clone();
    }
    json!({"name": "hook", "trigger": {"on": "manual"}, "steps": [call,
        {"id": "after", "action": "send_message",
         "text": "ticket {{steps.call.output.body.ticket}} status {{steps.call.output.status}}"}]})
}

/// Call slots are shared by owner: one owner's hanging calls hold at most
/// its own share (`max_in_flight_per_owner`), and another owner's call is
/// sent and answered while they still hang.
async fn one_owners_hanging_calls_leave_another_owners_call_alone(backend: Backend) {
    let server = HookServer::start().await;
    let mut hang = Answer::json(200, json!({"ticket": 0}));
    hang.delay = Duration::from_secs(120);
    server.answer("/hang", hang);
    server.answer("/quick", Answer::json(200, json!({"ticket": 7})));
    let mut opts = hooks_allowed();
    opts.config_toml = opts.config_toml.replace(
        "[webhooks]\n",
        "[webhooks]\nmax_in_flight = 4\nmax_in_flight_per_owner = 2\n",
    );
    let relay = Relay::start_opts(&backend, opts);
    let mut greedy = Fixture::new(&relay, "greedy", 0).await;
    let mut other = Fixture::new(&relay, "other", 0).await;
    greedy
        .define(
            "hang",
            &webhook_def(&server.url("/hang"), json!({"timeout_secs": 60})),
        )
        .await;
    other
        .define("quick", &webhook_def(&server.url("/quick"), json!({})))
        .await;
    for n in 0..6 {
        start_run(&relay, &greedy.owner, "hang", json!({"text": "x", "n": n})).await;
    }
    tests::workflow::eventually(|| async { (server.received("/hang").len() == 2).then_some(()) }).await;
    let run_id = start_run(&relay, &other.owner, "quick", json!({"text": "y", "n": 1})).await;
    let run = run_until(&relay, &other.owner, &run_id, 15, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["output"]["body"]["ticket"], 7, "{run}");
    // The greedy owner's calls still hang, and no more of them were sent.
    assert_eq!(server.received("/hang").len(), 2);
}

async fn set_secret(relay: &Relay, who: &Keys, workflow: &str, name: &str, value: &str) -> (u16, Value) {
    let path = format!("/workflows/{workflow}/secrets/{name}");
    api(relay, who, "PUT", &path, Some(&json!({"value": value}))).await
}

async fn a_webhook_answer_feeds_the_next_step_signed_with_a_sealed_secret(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/ok", Answer::json(200, json!({"ticket": 42})));
    let relay = Relay::start_opts(&backend, hooks_allowed());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    fx.define("hook", &webhook_def(&server.url("/ok"), json!({"secret": "sig"})))
        .await;
    let (status, v) = set_secret(&relay, &Keys::generate(), "hook", "sig", "nope").await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = set_secret(&relay, &fx.owner, "hook", "Bad Name", "x").await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = set_secret(&relay, &fx.owner, "hook", "sig", "s3cret-value").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["name"], "sig");
    assert!(v.get("value").is_none(), "{v}");

    let run_id = start_run(&relay, &fx.owner, "hook", json!({"text": "say \"hi\"", "n": 3})).await;
    let run = run_until(&relay, &fx.owner, &run_id, 15, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["steps"][0]["output"],
        json!({"status": 200, "body": {"ticket": 42}})
    );
    let msgs = relay_messages(&relay, &fx).await;
    assert!(
        msgs.iter().any(|m| m.content == "ticket 42 status 200"),
        "{msgs:?}"
    );
    let got = server.received("/ok");
    assert_eq!(got.len(), 1);
    let req = &got[0];
    assert_eq!(req.method, "POST");
    assert_eq!(
        req.header("idempotency-key"),
        Some(format!("{run_id}:call").as_str())
    );
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(
        req.json(),
        json!({"text": "say \"hi\"", "n": 3, "fixed": [1, true]})
    );
    let sig = req.header("x-workflow-signature").expect("signed");
    assert!(verify_signature("s3cret-value", &req.body, sig), "{sig}");

    // The database holds the secret sealed, never in clear.
    let probe = match backend {
        Backend::Sqlite => "SELECT count(*) FROM workflow_secrets WHERE instr(sealed, CAST('s3cret-value' AS BLOB)) > 0",
        Backend::Postgres(_) => {
            "SELECT count(*) FROM workflow_secrets WHERE position(convert_to('s3cret-value', 'UTF8') in sealed) > 0"
        }
    };
    assert_eq!(relay.store.sql(probe).trim(), "0");
    assert_eq!(
        relay.store.sql("SELECT count(*) FROM workflow_secrets").trim(),
        "1"
    );
    assert!(!relay.log().contains("s3cret-value"));

    // Rotation: the next call is signed with the new value only.
    let (status, _) = set_secret(&relay, &fx.owner, "hook", "sig", "rotated").await;
    assert_eq!(status, 200);
    let run_id = start_run(&relay, &fx.owner, "hook", json!({"text": "again", "n": 4})).await;
    run_until(&relay, &fx.owner, &run_id, 15, ended).await;
    let req = server.received("/ok").pop().unwrap();
    let sig = req.header("x-workflow-signature").unwrap();
    assert!(verify_signature("rotated", &req.body, sig));
    assert!(!verify_signature("s3cret-value", &req.body, sig));
}

async fn webhook_failures_fail_the_run_with_their_code(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/down", Answer::json(503, json!({"error": "maintenance"})));
    let mut slow = Answer::json(200, json!({"ticket": 1}));
    slow.delay = Duration::from_secs(4);
    server.answer("/slow", slow);
    let mut redirect = Answer::json(302, json!({}));
    redirect.location = Some(format!("http://localhost:{}/ok", server.addr.port()));
    server.answer("/moved", redirect);
    server.answer("/big", Answer::json(200, json!({"x": "y".repeat(70_000)})));
    let relay = Relay::start_opts(&backend, hooks_allowed());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    for (id, url, extra) in [
        ("down", server.url("/down"), json!({})),
        ("slow", server.url("/slow"), json!({"timeout_secs": 1})),
        ("moved", server.url("/moved"), json!({})),
        ("big", server.url("/big"), json!({})),
        ("nosecret", server.url("/down"), json!({"secret": "never-set"})),
    ] {
        fx.define(id, &webhook_def(&url, extra)).await;
    }
    let mut runs = Vec::new();
    for id in ["down", "slow", "moved", "big", "nosecret"] {
        runs.push((
            id,
            start_run(&relay, &fx.owner, id, json!({"text": "t", "n": 1})).await,
        ));
    }
    let mut codes = Vec::new();
    for (id, run_id) in &runs {
        let run = run_until(&relay, &fx.owner, run_id, 20, ended).await;
        assert_eq!(run["status"], "failed", "{id}: {run}");
        assert_eq!(run["error"]["step"], "call", "{run}");
        codes.push(run["error"]["code"].as_str().unwrap().to_string());
        if *id == "down" {
            assert_eq!(
                run["steps"][0]["output"],
                json!({"status": 503, "body": {"error": "maintenance"}})
            );
        }
    }
    assert_eq!(
        codes,
        [
            "http_503",
            "webhook_timeout",
            "http_302",
            "answer_too_large",
            "secret_missing"
        ]
    );
    // The redirect to another origin was not followed; the step with no
    // secret sent nothing.
    assert!(server.received("/ok").is_empty());
    assert_eq!(server.received("/down").len(), 1);
}

async fn the_address_guard_refuses_every_loopback_form_and_plain_http(backend: Backend) {
    // No allow-list: names pinned to loopback in every written form, and
    // literals, must be refused before any connection. (Private, link-local
    // and multicast classes are checked by `relay::outcall`'s unit test,
    // so that no test sends a packet toward addresses off this machine.)
    let server = HookServer::start().await;
    let port = server.addr.port();
    let pins = "[webhooks]\ncall_grace_secs = 1\n[webhooks.resolve]\n\"loop.test\" = [\"127.0.0.1\"]\n\
        \"loop8.test\" = [\"127.8.9.10\"]\n\"v6.test\" = [\"::1\"]\n\"mapped.test\" = [\"::ffff:127.0.0.1\"]\n\
        \"nat64.test\" = [\"64:ff9b::7f00:1\"]\n\"sixtofour.test\" = [\"2002:7f00:1::1\"]\n\
        \"zero.test\" = [\"0.0.0.0\"]\n";
    let relay = Relay::start_opts(&backend, options(pins));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let cases = [
        (format!("https://loop.test:{port}/ok"), "loopback"),
        (format!("https://loop8.test:{port}/ok"), "loopback"),
        (format!("https://v6.test:{port}/ok"), "loopback"),
        (format!("https://mapped.test:{port}/ok"), "loopback"),
        (format!("https://nat64.test:{port}/ok"), "loopback"),
        (format!("https://sixtofour.test:{port}/ok"), "loopback"),
        (format!("https://zero.test:{port}/ok"), "unspecified"),
        (format!("https://127.0.0.1:{port}/ok"), "loopback"),
        (format!("https://[::1]:{port}/ok"), "loopback"),
        (format!("https://[::ffff:127.0.0.1]:{port}/ok"), "loopback"),
        (format!("https://0.0.0.0:{port}/ok"), "unspecified"),
        (format!("http://loop.test:{port}/ok"), "must be https"),
    ];
    let mut runs = Vec::new();
    for (i, (url, _)) in cases.iter().enumerate() {
        let id = format!("guard{i}");
        fx.define(&id, &webhook_def(url, json!({}))).await;
        runs.push(start_run(&relay, &fx.owner, &id, json!({"text": "t", "n": 1})).await);
    }
    for ((url, class), run_id) in cases.iter().zip(&runs) {
        let run = run_until(&relay, &fx.owner, run_id, 20, ended).await;
        assert_eq!(run["status"], "failed", "{url}: {run}");
        assert_eq!(run["error"]["code"], "webhook_refused", "{url}: {run}");
        let message = run["error"]["message"].as_str().unwrap();
        assert!(message.contains(class), "{url}: {message}");
    }
    assert!(server.all().is_empty(), "{:?}", server.all());
}

async fn a_crash_mid_call_retries_only_when_asked_with_the_same_key(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/ok", Answer::json(200, json!({"ticket": 7})));
    let dying = |point: &str| RelayOptions {
        env: vec![("RELAY_FAULTS".into(), format!("{point}=kill*1"))],
        ..hooks_allowed()
    };
    let store = Store::new(&backend);
    let mut relay = Relay::start_with(store.clone(), hooks_allowed());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let url = server.url("/ok");
    fx.define(
        "again",
        &webhook_def(&url, json!({"retry": true, "timeout_secs": 1})),
    )
    .await;
    fx.define("once", &webhook_def(&url, json!({"timeout_secs": 1})))
        .await;

    // Killed after the server answered, before the answer was recorded.
    for (workflow, retried) in [("again", true), ("once", false)] {
        relay.restart_with(dying("webhook:after_send"));
        let before = server.received("/ok").len();
        let run_id = start_run(&relay, &fx.owner, workflow, json!({"text": workflow, "n": 1})).await;
        wait_exit(&mut relay).await;
        relay.restart_with(hooks_allowed());
        let run = run_until(&relay, &fx.owner, &run_id, 20, ended).await;
        let got: Vec<_> = server.received("/ok").split_off(before);
        let key = format!("{run_id}:call");
        assert!(
            got.iter().all(|r| r.header("idempotency-key") == Some(&key)),
            "{got:?}"
        );
        if retried {
            assert_eq!(run["status"], "completed", "{run}");
            assert_eq!(got.len(), 2, "sent, then sent again after the crash");
            assert_eq!(got[0].body, got[1].body);
        } else {
            assert_eq!(run["status"], "failed", "{run}");
            assert_eq!(run["error"]["code"], "interrupted", "{run}");
            assert_eq!(got.len(), 1, "never sent twice without retry");
        }
    }
    // Killed with the answer recorded, before the run went on: the run
    // goes on from that answer after the restart, sent once.
    relay.restart_with(dying("webhook:after_answer"));
    let before = server.received("/ok").len();
    let run_id = start_run(&relay, &fx.owner, "once", json!({"text": "y", "n": 1})).await;
    wait_exit(&mut relay).await;
    relay.restart_with(hooks_allowed());
    let run = run_until(&relay, &fx.owner, &run_id, 20, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["output"]["body"]["ticket"], 7, "{run}");
    assert_eq!(server.received("/ok").len(), before + 1, "sent once");
    // Killed after the call was recorded, before it was sent.
    relay.restart_with(dying("webhook:before_send"));
    let before = server.received("/ok").len();
    let run_id = start_run(&relay, &fx.owner, "once", json!({"text": "x", "n": 1})).await;
    wait_exit(&mut relay).await;
    relay.restart_with(hooks_allowed());
    let run = run_until(&relay, &fx.owner, &run_id, 20, ended).await;
    assert_eq!(run["error"]["code"], "interrupted", "{run}");
    assert_eq!(server.received("/ok").len(), before, "nothing was sent");
}

async fn calls_over_tls_verify_the_server(backend: Backend) {
    // A server with a certificate for hooks.test only, trusted through
    // webhooks.ca_file; other.test reaches the same server, whose
    // certificate does not name it.
    let (server, pem) = HookServer::start_tls("hooks.test").await;
    server.answer("/ok", Answer::json(201, json!({"ticket": "tls"})));
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pem).unwrap();
    let toml = format!(
        "[webhooks]\nca_file = \"{}\"\n[webhooks.resolve]\n\"hooks.test\" = [\"127.0.0.1\"]\n\
         \"other.test\" = [\"127.0.0.1\"]\n[communities.default]\n\
         webhook_allow_hosts = [\"hooks.test\", \"other.test\"]\n",
        ca.display()
    );
    let relay = Relay::start_opts(&backend, options(&toml));
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let port = server.addr.port();
    fx.define(
        "good",
        &webhook_def(&format!("https://hooks.test:{port}/ok"), json!({})),
    )
    .await;
    fx.define(
        "wrong",
        &webhook_def(&format!("https://other.test:{port}/ok"), json!({})),
    )
    .await;
    let good = start_run(&relay, &fx.owner, "good", json!({"text": "t", "n": 1})).await;
    let wrong = start_run(&relay, &fx.owner, "wrong", json!({"text": "t", "n": 2})).await;
    let run = run_until(&relay, &fx.owner, &good, 15, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["steps"][0]["output"],
        json!({"status": 201, "body": {"ticket": "tls"}})
    );
    let run = run_until(&relay, &fx.owner, &wrong, 15, ended).await;
    assert_eq!(run["error"]["code"], "webhook_unreachable", "{run}");
    let message = run["error"]["message"].as_str().unwrap().to_lowercase();
    assert!(message.contains("certificate"), "{message}");
    assert_eq!(server.received("/ok").len(), 1, "the wrong name sent nothing");
}

/// Waits (10 s) for a relay armed with a kill fault to die.
async fn wait_exit(relay: &mut Relay) {
    for _ in 0..100 {
        if relay.exited() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the relay did not reach its kill point");
}

async fn reactions_trigger_workflows_without_loops(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let member = Keys::generate();
    add_member(&mut fx, &member).await;
    fx.define(
        "rockets",
        &json!({"name": "rockets", "trigger": {"on": "reaction_added", "filter": {"content": ["🚀"]}},
                "steps": [{"id": "say", "action": "send_message",
                           "text": "{{trigger.author}} reacted {{trigger.text}} to {{trigger.event_id}}"}]}),
    )
    .await;
    let post = fx.post("launch today").await;
    let post_id = post.id.to_hex();
    // Neither another reaction, an agent's rocket, nor a rocket on an
    // event outside the channel fires it.
    react(&relay, &fx, &member, &post_id, "👍").await;
    let agent = fx.agents[0].clone();
    react(&relay, &fx, &agent, &post_id, "🚀").await;
    let mut c = Client::connect(&relay.ws_url()).await;
    let outside = event(&member, 1, "not in the channel", &[]);
    c.publish_ok(&outside).await;
    react(&relay, &fx, &member, &outside.id.to_hex(), "🚀").await;
    let fired = react(&relay, &fx, &member, &post_id, "🚀").await;
    let want = format!("{} reacted 🚀 to {post_id}", hex(&member));
    let mut found = Vec::new();
    for _ in 0..50 {
        found = relay_messages(&relay, &fx).await;
        if found.iter().any(|m| m.content == want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fx.barrier(&relay).await;
    let msgs = relay_messages(&relay, &fx).await;
    let said: Vec<&Event> = msgs.iter().filter(|m| m.content.contains("reacted")).collect();
    assert_eq!(said.len(), 1, "{found:?}");
    assert_eq!(said[0].content, want);
    assert_eq!(
        tag(said[0], "workflow-cause").unwrap()[1..],
        ["event".to_string(), fired.id.to_hex()]
    );
}

async fn v2_part2_definitions_are_validated_at_publish(backend: Backend) {
    let relay = Relay::start_opts(&backend, options(""));
    let fx = Fixture::new(&relay, "ops", 0).await;
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&fx.owner).await;
    for (step, want) in [
        (
            json!({"id": "a", "action": "request_approval", "text": "ok?", "timeout_secs": 59}),
            "invalid: step a: timeout_secs: 59 is not from 60 to 2592000",
        ),
        (
            json!({"id": "a", "action": "request_approval", "text": "ok?", "approvers": ["bob"]}),
            "invalid: step a: approvers: must be at most 32",
        ),
        (
            json!({"id": "a", "action": "request_approval", "text": "ok?", "on_deny": "shrug"}),
            "invalid: step a: on_deny: must be \"fail\" or \"continue\"",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/{{trigger.text}}"}),
            "invalid: step w: url: is fixed",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "file:///etc/passwd"}),
            "invalid: step w: url: must be an http or https URL",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/", "method": "GET"}),
            "invalid: step w: method: must be \"POST\" or \"PUT\"",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/", "timeout_secs": 61}),
            "invalid: step w: timeout_secs: 61 is not from 1 to 60",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/", "secret": "No Way"}),
            "invalid: step w: secret: must be a name",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/", "body": {"x": "{{steps.w.output.status}}"}}),
            "invalid: step w: body: {{steps.w.output.status}} names step w",
        ),
        (
            json!({"id": "w", "action": "call_webhook", "url": "https://h.example/", "retry": "yes"}),
            "invalid: step w: retry: must be true or false",
        ),
    ] {
        let def = json!({"name": "bad", "trigger": {"on": "manual"}, "steps": [step]});
        let ev = tests::workflow::definition(&fx.owner, "bad", &fx.channel, &def);
        let (ok, msg) = c.publish(&ev).await;
        assert!(!ok && msg.starts_with(want), "{want}: {msg}");
    }
    let def = json!({"name": "bad", "trigger": {"on": "reaction_added", "filter": {"content": []}},
                     "steps": [{"id": "a", "action": "send_message", "text": "x"}]});
    let (ok, msg) = c
        .publish(&tests::workflow::definition(&fx.owner, "bad", &fx.channel, &def))
        .await;
    assert!(!ok && msg.starts_with("invalid: filter.content"), "{msg}");
}
