//! Workflows and durable agent delivery over real sockets and HTTP, on every
//! backend (docs/protocol.md, "Workflows" and "Deliveries").

use std::time::Duration;

use nostr::prelude::{Event, Keys, PublicKey};
use serde_json::{json, Value};
use tests::relay::Store;
use tests::workflow::{api, claim, claim_when_due, deliveries, eventually, on_message, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    lists_page_by_time_then_id,
    step_makes_one_event_and_one_row_per_agent,
    recipients_come_only_from_the_template,
    webhook_data_stays_private,
    replay_after_injected_failures_makes_one_event,
    concurrent_executions_collapse_to_one,
    wake_only_for_new_rows_and_only_to_the_target,
    claim_rules,
    claims_at_once_take_each_row_once,
    claims_at_once_keep_a_workflows_cap,
    fencing_refusals,
    retry_backoff_and_attempt_cap,
    lapsed_leases_terminal_or_read_only_redelivery,
    unclaimed_rows_expire,
    finish_is_idempotent_and_atomic_with_its_reply,
    a_finish_reply_starts_no_run,
    concurrent_finishes_fail_alone,
    channel_deletion_cancels,
    disabled_and_deleted_workflows_stop,
    definitions_are_validated,
    manual_runs_schedules_and_run_listing,
    startup_sweep_after_sigkill,
);

const FAST: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nlifetime_secs = 60\n\
default_lease_secs = 5\nmax_lease_secs = 30\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n";

fn start(backend: &Backend) -> Relay {
    Relay::start_opts(
        backend,
        RelayOptions {
            config_toml: FAST.into(),
            ..Default::default()
        },
    )
}

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

fn tags_named<'e>(e: &'e Event, name: &str) -> Vec<&'e [String]> {
    e.tags
        .iter()
        .filter(|t| t.kind() == name)
        .map(|t| t.as_slice())
        .collect()
}

/// Waits (10 s) for the first channel message `pick` accepts.
async fn wait_message(c: &mut Client, channel: &str, pick: impl Fn(&Event) -> bool) -> Event {
    for _ in 0..100 {
        let got = c
            .req("m", vec![json!({"kinds": [9], "#h": [channel]})])
            .await
            .events();
        c.send(json!(["CLOSE", "m"])).await;
        if let Some(e) = got.into_iter().find(|e| pick(e)) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no matching message in {channel} within 10 s");
}

/// Waits for the workflow message of a run (by its `workflow-run` tag).
async fn message_of_run(c: &mut Client, channel: &str, run_id: &str) -> Event {
    wait_message(c, channel, |e| {
        tags_named(e, "workflow-run")
            .first()
            .is_some_and(|t| t[1] == run_id)
    })
    .await
}

/// Waits for the one workflow message answering a trigger event.
async fn message_for(c: &mut Client, channel: &str, cause_event: &Event) -> Event {
    let id = cause_event.id.to_hex();
    wait_message(c, channel, |e| {
        tags_named(e, "workflow-cause")
            .first()
            .is_some_and(|t| t[2] == id)
    })
    .await
}

async fn step_makes_one_event_and_one_row_per_agent(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 3).await;
    let outsider = Keys::generate(); // an agent not in the channel: no row
    fx.owner_client
        .publish_ok(&tests::workflow::agent_profile(&outsider, &fx.owner))
        .await;
    let outsider_mention = format!(
        "nostr:{}",
        nostr::prelude::ToBech32::to_bech32(&outsider.public_key()).unwrap()
    );
    let text = format!(
        "{} {} {outsider_mention} please look: {{{{trigger.text}}}}",
        fx.mention(0),
        fx.mention(1)
    );
    let def = fx.define("triage", &json!({"name": "triage", "trigger": {"on": "message_posted", "filter": {"text_contains": "help"}},
        "steps": [{"id": "notify", "action": "send_message", "text": text, "reply_in_thread": true}]})).await;
    fx.post("nothing to see").await;
    let trigger = fx.post("HELP me please").await;
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;

    // The message: relay-signed, exact tags, rendered text.
    assert_eq!(msg.pubkey.to_hex(), fx.relay_pk);
    assert!(
        msg.content.ends_with("please look: HELP me please"),
        "{}",
        msg.content
    );
    assert_eq!(
        tags_named(&msg, "h"),
        vec![["h".to_string(), "ops".into()].as_slice()]
    );
    assert_eq!(
        tags_named(&msg, "workflow-definition")[0][1..],
        [def.id.to_hex(), "notify".into()]
    );
    assert_eq!(tags_named(&msg, "workflow-step")[0][1], "notify");
    assert_eq!(tags_named(&msg, "workflow-owner")[0][1], hex(&fx.owner));
    assert_eq!(
        tags_named(&msg, "workflow-cause")[0][1..],
        ["event".to_string(), trigger.id.to_hex()]
    );
    assert_eq!(tags_named(&msg, "workflow")[0][1], "message-v1");
    let e_tags = tags_named(&msg, "e");
    assert_eq!(e_tags.len(), 1);
    assert_eq!(e_tags[0][1], trigger.id.to_hex());
    assert_eq!(e_tags[0][3], "root");
    let mut ps: Vec<String> = tags_named(&msg, "p").iter().map(|t| t[1].clone()).collect();
    ps.sort();
    let mut want = vec![
        hex(&fx.owner),
        hex(&fx.agents[0]),
        hex(&fx.agents[1]),
        hex(&outsider),
    ];
    want.sort();
    assert_eq!(ps, want, "owner plus every mention, once");
    // Exactly one message for the run.
    let run_id = tags_named(&msg, "workflow-run")[0][1].clone();
    let all = fx
        .owner_client
        .req("all", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    assert_eq!(
        all.iter()
            .filter(|e| tags_named(e, "workflow-run")
                .first()
                .is_some_and(|t| t[1] == run_id))
            .count(),
        1
    );

    // One row per recipient that is a managed agent and a member: agents 0 and 1.
    let rows = eventually(|| async {
        let rows: Vec<Value> = deliveries(&relay)
            .into_iter()
            .filter(|d| d["run_id"] == run_id.as_str())
            .collect();
        (rows.len() == 2).then_some(rows)
    })
    .await;
    let mut targets: Vec<String> = rows
        .iter()
        .map(|r| r["target_pubkey"].as_str().unwrap().to_string())
        .collect();
    targets.sort();
    let mut want = vec![hex(&fx.agents[0]), hex(&fx.agents[1])];
    want.sort();
    assert_eq!(targets, want);
    for r in &rows {
        assert_eq!(r["message_event_id"], msg.id.to_hex());
        assert_eq!(r["definition_event_id"], def.id.to_hex());
        assert_eq!(r["status"], "pending");
        assert_eq!(r["step_id"], "notify");
    }
    // The message that did not match started nothing.
    let runs = relay.cli(&["runs", "list"]);
    assert_eq!(runs.lines().count(), 1, "{runs}");
}

async fn recipients_come_only_from_the_template(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define(
        "echo",
        &on_message(&format!("{} said {{{{trigger.text}}}}", fx.mention(0))),
    )
    .await;
    // The trigger text mentions agent 1: it must not become a recipient.
    let trigger = fx.post(&format!("hey {}", fx.mention(1))).await;
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
    assert!(msg.content.contains(&fx.mention(1)), "the text is rendered as is");
    let ps: Vec<String> = tags_named(&msg, "p").iter().map(|t| t[1].clone()).collect();
    assert!(
        !ps.contains(&hex(&fx.agents[1])),
        "trigger text added a recipient: {ps:?}"
    );
    assert!(ps.contains(&hex(&fx.agents[0])));
    // The step's rows commit with its message, which was read above.
    let rows = deliveries(&relay);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["target_pubkey"], hex(&fx.agents[0]));
    // Workflow messages and agents' messages do not trigger the workflow.
    let mut agent = Client::connect(&relay.ws_url()).await;
    agent
        .publish_ok(&event(&fx.agents[0], 9, "agent talking", &[&["h", "ops"]]))
        .await;
    // A message's runs start in the transaction that stores it: the OK is
    // the barrier.
    assert_eq!(
        relay.cli(&["runs", "list"]).lines().count(),
        1,
        "only the owner's message ran the workflow"
    );
}

async fn webhook_data_stays_private(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("hook", &json!({"name": "hook", "trigger": {"on": "webhook"},
        "steps": [{"id": "tell", "action": "send_message", "text": format!("{} ticket {{{{trigger.body.title}}}}", fx.mention(0))}]})).await;
    // No secret yet, wrong secret, not the owner.
    let hook = |secret: Option<String>, key: Option<&str>, body: Value| {
        let relay_http = relay.http_url();
        let host = relay.addr.to_string();
        let key = key.map(str::to_string);
        async move {
            let mut req = reqwest::Client::new()
                .post(format!("{relay_http}/hooks/hook"))
                .header("Host", host)
                .body(body.to_string());
            if let Some(s) = secret {
                req = req.header("Authorization", format!("Bearer {s}"));
            }
            if let Some(k) = key {
                req = req.header("Idempotency-Key", k);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, v) = hook(Some("guess".into()), None, json!({})).await;
    assert_eq!((status, v["error"].as_str()), (401, Some("bad_secret")));
    let stranger = Keys::generate();
    let (status, v) = api(&relay, &stranger, "POST", "/workflows/hook/webhook-secret", None).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("not_owner")));
    let (status, v) = api(&relay, &fx.owner, "POST", "/workflows/hook/webhook-secret", None).await;
    assert_eq!(status, 200, "{v}");
    let secret = v["secret"].as_str().unwrap().to_string();
    let (status, _) = hook(None, None, json!({})).await;
    assert_eq!(status, 401);
    let private = json!({"title": "disk full", "api_key": "sk-very-secret"});
    let (status, v) = hook(Some(secret.clone()), Some("req-1"), private.clone()).await;
    assert_eq!(status, 200, "{v}");
    let run_id = v["run_id"].as_str().unwrap().to_string();
    // The same idempotency key is the same run.
    let (_, again) = hook(Some(secret.clone()), Some("req-1"), private.clone()).await;
    assert_eq!(again["run_id"], run_id.as_str());
    let msg = message_of_run(&mut fx.owner_client, "ops", &run_id).await;
    assert!(msg.content.ends_with("ticket disk full"));
    let raw = serde_json::to_string(&msg.tags).unwrap();
    assert!(
        !raw.contains("sk-very-secret") && !raw.contains("disk full"),
        "private data in tags: {raw}"
    );
    assert_eq!(tags_named(&msg, "workflow-cause")[0][1], "webhook");
    // The private snapshot travels only to the claiming agent.
    let d = claim_when_due(&relay, &fx.agents[0], json!({})).await;
    assert_eq!(d["trigger_context"]["body"]["api_key"], "sk-very-secret");
    assert_eq!(d["trigger_context"]["cause"]["type"], "webhook");
    // Rotation: the old secret stops working.
    let (_, v) = api(&relay, &fx.owner, "POST", "/workflows/hook/webhook-secret", None).await;
    let new_secret = v["secret"].as_str().unwrap().to_string();
    assert_ne!(new_secret, secret);
    assert_eq!(hook(Some(secret), None, json!({})).await.0, 401);
    assert_eq!(hook(Some(new_secret), None, json!({"title": "x"})).await.0, 200);
}

/// Counts workflow messages (by run) and delivery rows of a run.
async fn counts(relay: &Relay, c: &mut Client, run_id: &str) -> (usize, usize) {
    let msgs = c
        .req("cnt", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    c.send(json!(["CLOSE", "cnt"])).await;
    let n_msgs = msgs
        .iter()
        .filter(|e| {
            tags_named(e, "workflow-run")
                .first()
                .is_some_and(|t| t[1] == run_id)
        })
        .count();
    let n_rows = deliveries(relay).iter().filter(|d| d["run_id"] == run_id).count();
    (n_msgs, n_rows)
}

async fn replay_after_injected_failures_makes_one_event(backend: Backend) {
    for point in ["step:after_event", "step:after_rows", "step:before_commit"] {
        let relay = Relay::start_opts(
            &backend,
            RelayOptions {
                config_toml: FAST.into(),
                env: vec![("RELAY_FAULTS".into(), format!("{point}=error*2"))],
            },
        );
        let mut fx = Fixture::new(&relay, "ops", 2).await;
        fx.define(
            "w",
            &on_message(&format!("{} {} go", fx.mention(0), fx.mention(1))),
        )
        .await;
        let trigger = fx.post("start").await;
        let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
        let run_id = tags_named(&msg, "workflow-run")[0][1].clone();
        assert!(
            relay.log().matches("injected fault").count() >= 2,
            "{point} was not reached"
        );
        // After two failed attempts and a successful replay: one event, two rows.
        let mut got = (0, 0);
        for _ in 0..100 {
            got = counts(&relay, &mut fx.owner_client, &run_id).await;
            if got.1 == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (n_msgs, n_rows) = got;
        assert_eq!((n_msgs, n_rows), (1, 2), "fault at {point}");
        let run: Value = serde_json::from_str(&relay.cli(&["runs", "show", &run_id])).unwrap();
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["steps"].as_array().unwrap().len(), 1);
        assert_eq!(run["steps"][0]["status"], "done", "{run}");
    }
}

async fn concurrent_executions_collapse_to_one(backend: Backend) {
    // Two relay processes on one database advance the same runs.
    let store = Store::new(&backend);
    let opts = RelayOptions {
        config_toml: FAST.replace("run_poll_interval_ms = 200", "run_poll_interval_ms = 20"),
        ..Default::default()
    };
    let a = Relay::start_with(store.clone(), opts.clone());
    let b = Relay::start_with(store.clone(), opts);
    let mut fx = Fixture::new(&a, "ops", 2).await;
    let text = format!("{} {} step one", fx.mention(0), fx.mention(1));
    fx.define("w", &json!({"name": "two steps", "trigger": {"on": "message_posted"}, "steps": [
        {"id": "one", "action": "send_message", "text": text},
        {"id": "two", "action": "send_message", "text": format!("{} after {{{{steps.one.output.event_id}}}}", fx.mention(0))}]})).await;
    let mut triggers = Vec::new();
    for i in 0..10 {
        triggers.push(fx.post(&format!("go {i}")).await);
    }
    let mut c = Client::connect(&b.ws_url()).await;
    let expected_rows = 10 * 3;
    let rows = eventually(|| async {
        let rows = deliveries(&a);
        (rows.len() >= expected_rows).then_some(rows)
    })
    .await;
    // A step's rows commit with the run's advance, and an ended run is
    // never advanced again: once every run has completed, the rows are
    // final, whichever process ran which step.
    eventually(|| async {
        let runs = a.cli(&["runs", "list", "--workflow", "w"]);
        let done = runs
            .lines()
            .filter(|l| l.contains("\"status\":\"completed\""))
            .count();
        (done == 10).then_some(())
    })
    .await;
    let rows_after = deliveries(&a);
    assert_eq!(rows_after.len(), rows.len(), "rows kept growing");
    assert_eq!(rows.len(), expected_rows);
    let msgs = c
        .req(
            "all",
            vec![json!({"kinds": [9], "#h": ["ops"], "authors": [fx.relay_pk]})],
        )
        .await
        .events();
    assert_eq!(msgs.len(), 20, "one message per run and step");
    let runs: Vec<Value> = a
        .cli(&["runs", "list"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 10);
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:?}");
    // The second step saw the first step's output.
    let two = msgs
        .iter()
        .find(|m| tags_named(m, "workflow-step")[0][1] == "two")
        .unwrap();
    let run = &tags_named(two, "workflow-run")[0][1];
    let one = msgs
        .iter()
        .find(|m| {
            tags_named(m, "workflow-step")[0][1] == "one" && &tags_named(m, "workflow-run")[0][1] == run
        })
        .unwrap();
    assert!(two.content.ends_with(&format!("after {}", one.id.to_hex())));
}

async fn wake_only_for_new_rows_and_only_to_the_target(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    let mut a0 = Client::connect(&relay.ws_url()).await;
    a0.auth(&fx.agents[0]).await;
    a0.req("w", vec![json!({"kinds": [24620], "#p": [hex(&fx.agents[0])]})])
        .await
        .events();
    let mut a1 = Client::connect(&relay.ws_url()).await;
    a1.auth(&fx.agents[1]).await;
    a1.req("w", vec![json!({"kinds": [24620]})]).await.events();
    let mut anon = Client::connect(&relay.ws_url()).await;
    anon.req(
        "all",
        vec![json!({"#h": ["ops"]}), json!({"authors": [fx.relay_pk]})],
    )
    .await
    .events();
    fx.define("w", &on_message(&format!("{} only", fx.mention(0))))
        .await;
    let trigger = fx.post("go").await;
    let wake = a0.next_event("w").await;
    assert_eq!(wake.kind.as_u16(), 24620);
    assert_eq!(wake.pubkey.to_hex(), fx.relay_pk);
    assert!(wake.content.is_empty());
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
    let rows = deliveries(&relay);
    assert_eq!(rows.len(), 1);
    let want = [
        ("p", hex(&fx.agents[0])),
        ("h", "ops".to_string()),
        ("delivery", rows[0]["id"].as_str().unwrap().to_string()),
        (
            "workflow-definition",
            rows[0]["definition_event_id"].as_str().unwrap().to_string(),
        ),
        ("workflow-run", rows[0]["run_id"].as_str().unwrap().to_string()),
        ("workflow-step", "notify".to_string()),
        ("e", msg.id.to_hex()),
    ];
    for (name, value) in want {
        let t = tags_named(&wake, name);
        assert_eq!(t.len(), 1, "{name}");
        assert_eq!(t[0][1], value, "{name}");
    }
    assert_eq!(wake.tags.len(), 7);
    // Nobody else got a wake.
    a1.expect_silence(Duration::from_millis(500)).await;
    while let Some(v) = anon.try_recv(Duration::from_millis(300)).await {
        assert_ne!(v[2]["kind"], 24620, "a wake leaked: {v}");
    }

    // No new row, no new wake: a duplicate trigger event starts nothing.
    fx.owner_client.publish(&trigger).await;
    a0.expect_silence(Duration::from_millis(800)).await;
}

async fn claim_rules(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define(
        "w",
        &on_message(&format!("{} {} go", fx.mention(0), fx.mention(1))),
    )
    .await;
    let trigger = fx.post("go").await;
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
    let rows = eventually(|| async {
        let r = deliveries(&relay);
        (r.len() == 2).then_some(r)
    })
    .await;
    let mine = rows
        .iter()
        .find(|r| r["target_pubkey"] == hex(&fx.agents[0]))
        .unwrap()
        .clone();
    let id = mine["id"].as_str().unwrap();
    let expected = json!({"run_id": mine["run_id"], "step_id": "notify", "definition_event_id": mine["definition_event_id"],
        "message_event_id": msg.id.to_hex(), "channel": "ops"});
    // Wrong bindings: null, nothing changes.
    for (field, value) in [
        ("run_id", json!("other")),
        ("step_id", json!("x")),
        ("channel", json!("elsewhere")),
        ("message_event_id", json!("00".repeat(32))),
        ("definition_event_id", json!("11".repeat(32))),
    ] {
        let mut e = expected.clone();
        e[field] = value;
        let (status, v) = claim(&relay, &fx.agents[0], json!({"delivery_id": id, "expected": e})).await;
        assert_eq!(status, 200, "{v}");
        assert!(v["delivery"].is_null(), "wrong {field} claimed: {v}");
    }
    let row = deliveries(&relay).into_iter().find(|r| r["id"] == id).unwrap();
    assert_eq!(
        (row["status"].as_str(), row["attempt"].as_i64()),
        (Some("pending"), Some(0))
    );
    // Someone else's delivery, unknown delivery.
    let (status, v) = claim(&relay, &fx.agents[1], json!({"delivery_id": id})).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("not_target")));
    let (status, v) = claim(&relay, &fx.agents[0], json!({"delivery_id": "nope"})).await;
    assert_eq!((status, v["error"].as_str()), (404, Some("not_found")));
    // A lease longer than the row's life is refused; too long for the config too.
    let (status, v) = claim(
        &relay,
        &fx.agents[0],
        json!({"delivery_id": id, "lease_seconds": 31}),
    )
    .await;
    assert_eq!((status, v["error"].as_str()), (400, Some("bad_lease")));
    // Right bindings: claimed, with the snapshot.
    let (status, v) = claim(
        &relay,
        &fx.agents[0],
        json!({"delivery_id": id, "expected": expected, "records_operations": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let d = &v["delivery"];
    assert_eq!(d["id"], id);
    assert_eq!(d["attempt"], 1);
    assert_eq!(d["target_pubkey"], hex(&fx.agents[0]));
    assert_eq!(d["trigger_context"]["text"], "go");
    assert_eq!(d["trigger_context"]["cause"]["id"], trigger.id.to_hex());
    assert!(d["execution_trace"].is_array());
    assert_eq!(d["claim_token"].as_str().unwrap().len(), 64);
    assert!(d["claim_expires_at"].as_i64().unwrap() <= d["expires_at"].as_i64().unwrap());
    // A competing claim gets nothing, by id or as oldest due.
    let (_, v) = claim(&relay, &fx.agents[0], json!({"delivery_id": id})).await;
    assert!(v["delivery"].is_null());
    let (_, v) = claim(&relay, &fx.agents[0], json!({})).await;
    assert!(v["delivery"].is_null());
    // The other agent claims its own as the oldest due one.
    let (_, v) = claim(&relay, &fx.agents[1], json!({})).await;
    assert_eq!(v["delivery"]["target_pubkey"], hex(&fx.agents[1]));
    // Own list.
    let (status, v) = api(&relay, &fx.agents[0], "GET", "/deliveries?status=claimed", None).await;
    assert_eq!(status, 200);
    assert_eq!(v["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(v["deliveries"][0]["id"], id);
    let (_, v) = api(&relay, &fx.agents[0], "GET", "/deliveries?status=pending", None).await;
    assert!(v["deliveries"].as_array().unwrap().is_empty());
    let (status, _) = api(&relay, &fx.agents[0], "GET", "/deliveries?status=bogus", None).await;
    assert_eq!(status, 400);
}

/// A relay with one call writer (every claim goes to one queue, and its
/// batches) and `n` agents in "ops", each mentioned by the workflow "w"
/// on every message (with its `concurrency` cap, if any).
async fn all_asked(backend: &Backend, n: usize, concurrency: Option<u32>) -> (Relay, Fixture) {
    let relay = Relay::start_opts(
        backend,
        RelayOptions {
            config_toml: format!("{FAST}[writer]\ncall_writers = 1\n"),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", n).await;
    let all: Vec<String> = (0..n).map(|i| fx.mention(i)).collect();
    let mut def = on_message(&format!("{} go", all.join(" ")));
    if let Some(cap) = concurrency {
        def["concurrency"] = json!(cap);
    }
    fx.define("w", &def).await;
    (relay, fx)
}

/// The claim body of `agent`'s row among `rows`, named with its bindings
/// as its wake said them (the message `msg` of step "notify").
fn as_woken(rows: &[Value], agent: &Keys, msg: &Event) -> Value {
    let row = rows
        .iter()
        .find(|r| r["target_pubkey"] == hex(agent))
        .expect("a row each");
    let expected = json!({"run_id": row["run_id"], "step_id": "notify",
        "definition_event_id": row["definition_event_id"], "message_event_id": msg.id.to_hex(),
        "channel": "ops"});
    json!({"delivery_id": row["id"], "expected": expected})
}

/// Agents woken together claim together: the call writer makes a batch's
/// claims by name in one statement. Each row is claimed once, by its
/// agent, with a token of its own that its finish is accepted with; a
/// caller's second claim of its row at once, and a claim of another
/// agent's row, are answered as on their own.
async fn claims_at_once_take_each_row_once(backend: Backend) {
    let n = 12;
    let (relay, mut fx) = all_asked(&backend, n, None).await;
    let mut rounds = 0;
    while !relay.log().contains("claims made in one statement") {
        rounds += 1;
        assert!(
            rounds <= 8,
            "no batch held two claims by name in 8 rounds: the test proved nothing"
        );
        let trigger = fx.post(&format!("go {rounds}")).await;
        let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
        let rows = eventually(|| async {
            let r: Vec<Value> = deliveries(&relay)
                .into_iter()
                .filter(|r| r["message_event_id"] == msg.id.to_hex())
                .collect();
            (r.len() == n).then_some(r)
        })
        .await;
        let row_of = |agent: &Keys| as_woken(&rows, agent, &msg);
        // Every agent its own; agent 0 twice; agent 1 agent 2's row too.
        let mut asks: Vec<(usize, Value)> = (0..n).map(|i| (i, row_of(&fx.agents[i]))).collect();
        asks.push((0, row_of(&fx.agents[0])));
        asks.push((1, row_of(&fx.agents[2])));
        let answers = futures_util::future::join_all(
            asks.iter()
                .map(|(i, body)| claim(&relay, &fx.agents[*i], body.clone())),
        )
        .await;
        let (stolen, own) = answers.split_last().expect("answers");
        assert_eq!((stolen.0, stolen.1["error"].as_str()), (403, Some("not_target")));
        let mut tokens = std::collections::HashSet::new();
        let mut claimed_by = vec![0; n];
        for ((i, body), (status, v)) in asks.iter().zip(own) {
            assert_eq!(*status, 200, "{v}");
            let d = &v["delivery"];
            if d.is_null() {
                continue;
            }
            assert_eq!(d["id"], body["delivery_id"]);
            assert_eq!(d["attempt"], 1);
            assert!(tokens.insert(d["claim_token"].as_str().expect("token").to_string()));
            claimed_by[*i] += 1;
            let reply = event(&fx.agents[*i], 9, "done", &[&["h", "ops"]]);
            let done = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
            let id = d["id"].as_str().expect("id");
            tests::workflow::ok(tests::workflow::finish(&relay, &fx.agents[*i], id, &done).await);
        }
        assert_eq!(claimed_by, vec![1; n], "each row claimed once, by its agent");
    }
    for row in deliveries(&relay) {
        assert_eq!(
            (row["status"].as_str(), row["attempt"].as_i64()),
            (Some("delivered"), Some(1)),
            "{row}"
        );
    }
}

/// A workflow's cap holds when its agents claim at once by name: the
/// batch's one statement leaves a capped workflow's rows to each claim on
/// its own, which counts the rows claimed before it.
async fn claims_at_once_keep_a_workflows_cap(backend: Backend) {
    let n = 8;
    let (relay, mut fx) = all_asked(&backend, n, Some(2)).await;
    let trigger = fx.post("go").await;
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
    let rows = eventually(|| async {
        let r = deliveries(&relay);
        (r.len() == n).then_some(r)
    })
    .await;
    let asks = fx
        .agents
        .iter()
        .map(|agent| claim(&relay, agent, as_woken(&rows, agent, &msg)));
    let answers = futures_util::future::join_all(asks).await;
    let mut claimed = 0;
    for (status, v) in &answers {
        assert_eq!(*status, 200, "{v}");
        claimed += usize::from(!v["delivery"].is_null());
    }
    assert_eq!(claimed, 2, "the workflow's cap: {answers:?}");
    let held = deliveries(&relay)
        .into_iter()
        .filter(|r| r["status"] == "claimed")
        .count();
    assert_eq!(held, 2);
}

/// Every page of a listing (`key` its items), following `next_before`
/// and `next_before_id`; the ids in order, each once.
async fn pages(relay: &Relay, who: &nostr::prelude::Keys, first: &str, key: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut path = first.to_string();
    for _ in 0..50 {
        let (status, v) = api(relay, who, "GET", &path, None).await;
        assert_eq!(status, 200, "{v}");
        for item in v[key].as_array().unwrap() {
            let id = item["id"].as_str().unwrap().to_string();
            assert!(!ids.contains(&id), "{id} listed twice");
            ids.push(id);
        }
        let (Some(t), Some(id)) = (v["next_before"].as_i64(), v["next_before_id"].as_str()) else {
            return ids;
        };
        path = format!("{first}&before={t}&before_id={id}");
    }
    panic!("more than 50 pages");
}

/// Runs and deliveries made in the same second are each listed once
/// across pages (pages are keyed by creation time, then id).
async fn lists_page_by_time_then_id(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let text = format!("{} look", fx.mention(0));
    fx.define("look", &tests::workflow::on_message(&text)).await;
    for i in 0..7 {
        fx.post(&format!("broke {i}")).await;
    }
    let agent = fx.agents[0].clone();
    let listed = tests::workflow::eventually(|| async {
        let ids = pages(&relay, &agent, "/deliveries?limit=2", "deliveries").await;
        (ids.len() == 7).then_some(ids)
    })
    .await;
    assert_eq!(listed.len(), 7);
    let runs = pages(&relay, &fx.owner, "/workflows/look/runs?limit=3", "runs").await;
    assert_eq!(runs.len(), 7, "{runs:?}");
    let (status, v) = api(&relay, &agent, "GET", "/deliveries?before=1&before_id=../x", None).await;
    assert_eq!((status, v["error"].as_str()), (400, Some("malformed")), "{v}");
}

async fn fencing_refusals(backend: Backend) {
    let relay = start(&backend);
    relay.cli(&[
        "community",
        "add",
        "--id",
        "other",
        "--host",
        "other.test",
        "--url",
        "ws://other.test",
    ]);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("go").await;
    let d = claim_when_due(&relay, &fx.agents[0], json!({"lease_seconds": 10})).await;
    let id = d["id"].as_str().unwrap();
    let token = d["claim_token"].as_str().unwrap();
    let path = |op: &str| format!("/deliveries/{id}/{op}");
    let code = |v: &Value| v["error"].as_str().unwrap_or_default().to_string();
    // Stale token.
    for (op, body) in [
        ("renew", json!({"claim_token": "x", "lease_seconds": 5})),
        (
            "operations",
            json!({"claim_token": "x", "name": "n", "effect": "read"}),
        ),
        ("finish", json!({"claim_token": "x", "outcome": "delivered"})),
    ] {
        let (status, v) = api(&relay, &fx.agents[0], "POST", &path(op), Some(&body)).await;
        assert_eq!((status, code(&v).as_str()), (409, "stale_token"), "{op}");
    }
    // Wrong pubkey (another agent, and the owner).
    for who in [&fx.agents[1], &fx.owner] {
        let (status, v) = api(
            &relay,
            who,
            "POST",
            &path("finish"),
            Some(&json!({"claim_token": token, "outcome": "delivered"})),
        )
        .await;
        assert_eq!((status, code(&v).as_str()), (403, "not_target"));
    }
    // Other community: the same id does not exist there.
    let body = json!({"claim_token": token, "outcome": "delivered"}).to_string();
    let (status, v) = tests::http_nip98(
        &relay.http_url(),
        "other.test",
        &fx.agents[0],
        "POST",
        &path("finish"),
        body.as_bytes(),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (404, "not_found"));
    // Other channel: a reply in another channel is refused.
    let mut a = Client::connect(&relay.ws_url()).await;
    a.auth(&fx.agents[0]).await;
    a.publish_ok(&event(&fx.agents[0], 9007, "", &[&["h", "elsewhere"]]))
        .await;
    let wrong_reply = event(&fx.agents[0], 9, "reply", &[&["h", "elsewhere"]]);
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("finish"),
        Some(&json!({"claim_token": token, "outcome": "delivered", "reply": wrong_reply})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "bad_reply"));
    let forged = event(&fx.agents[1], 9, "reply", &[&["h", "ops"]]);
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("finish"),
        Some(&json!({"claim_token": token, "outcome": "delivered", "reply": forged})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "bad_reply"));
    // Lease longer than the row's life on renew.
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("renew"),
        Some(&json!({"claim_token": token, "lease_seconds": 31})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "bad_lease"));
    // Bad bodies.
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("finish"),
        Some(&json!({"claim_token": token, "outcome": "maybe"})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "bad_outcome"));
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("operations"),
        Some(&json!({"claim_token": token, "name": "n", "effect": "delete"})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "bad_effect"));
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("finish"),
        Some(&json!({"nope": 1})),
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (400, "malformed"));
    // Renew works for the holder; the lease then expires and the holder is fenced.
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("renew"),
        Some(&json!({"claim_token": token, "lease_seconds": 1})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &path("finish"),
        Some(&json!({"claim_token": token, "outcome": "delivered"})),
    )
    .await;
    assert!(status == 409, "{v}");
    assert!(
        ["lease_expired", "stale_token"].contains(&code(&v).as_str()),
        "{v}"
    );
}

async fn retry_backoff_and_attempt_cap(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher
        .req("n", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("go").await;
    let agent = &fx.agents[0];
    let mut due_at = Vec::new();
    let mut claimed_early: Option<Value> = None;
    for attempt in 1..=3 {
        let d = match claimed_early.take() {
            Some(d) => d,
            None => claim_when_due(&relay, agent, json!({})).await,
        };
        assert_eq!(d["attempt"], attempt);
        let id = d["id"].as_str().unwrap().to_string();
        let (status, v) = api(
            &relay,
            agent,
            "POST",
            &format!("/deliveries/{id}/finish"),
            Some(&json!({"claim_token": d["claim_token"], "outcome": "retry",
                         "failure_message": format!("upstream busy on attempt {attempt}")})),
        )
        .await;
        assert_eq!(status, 200);
        let row = deliveries(&relay)
            .into_iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap();
        if attempt < 3 {
            assert_eq!(v["status"], "pending");
            // Backoff min(cap=2, base=1 * 2^(attempt-1)): 1 s, then 2 s.
            due_at.push(row["next_attempt_at"].as_i64().unwrap() - row["updated_at"].as_i64().unwrap());
            // Not claimable before it is due. On a loaded machine the
            // backoff may have passed by now (the listing above starts a
            // process): a claim is then right, and its lease's start (the
            // relay's clock) says it came after the row was due.
            let lease = 5;
            let (_, early) = claim(&relay, agent, json!({"lease_seconds": lease})).await;
            if !early["delivery"].is_null() {
                let claimed_at = early["delivery"]["claim_expires_at"].as_i64().unwrap() - lease;
                assert!(
                    claimed_at >= row["next_attempt_at"].as_i64().unwrap(),
                    "claimable before its backoff: {early} {row}"
                );
                claimed_early = Some(early["delivery"].clone());
            }
        } else {
            assert_eq!(v["status"], "failed");
            assert_eq!(row["failure_code"], "attempts_exhausted");
            // The last attempt's own message is kept.
            assert_eq!(row["failure_message"], "upstream busy on attempt 3", "{row}");
        }
    }
    assert_eq!(due_at, vec![1, 2]);
    // A visible notice for the terminal failure.
    let notice = loop {
        let e = watcher.next_event("n").await;
        if !tags_named(&e, "workflow-delivery-failed").is_empty() {
            break e;
        }
    };
    assert_eq!(notice.pubkey.to_hex(), fx.relay_pk);
    assert_eq!(
        tags_named(&notice, "workflow-delivery-failed")[0][2],
        "attempts_exhausted"
    );
}

async fn lapsed_leases_terminal_or_read_only_redelivery(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 3).await;
    fx.define(
        "w",
        &on_message(&format!(
            "{} {} {} go",
            fx.mention(0),
            fx.mention(1),
            fx.mention(2)
        )),
    )
    .await;
    fx.post("go").await;
    // 0: records operations, only reads -> redelivered. 1: records a write -> failed.
    // 2: does not record operations -> failed. Each operation right after its claim.
    let op =
        |d: &Value, effect: &str| json!({"claim_token": d["claim_token"], "name": "tool", "effect": effect});
    let claim_with_op = |i: usize, records: bool, effect: Option<&'static str>| {
        let relay = &relay;
        let agent = fx.agents[i].clone();
        async move {
            let d = claim_when_due(
                relay,
                &agent,
                json!({"lease_seconds": 3, "records_operations": records}),
            )
            .await;
            if let Some(effect) = effect {
                let path = format!("/deliveries/{}/operations", d["id"].as_str().unwrap());
                let (s, v) = api(relay, &agent, "POST", &path, Some(&op(&d, effect))).await;
                assert_eq!((s, v["recorded"].as_bool()), (200, Some(true)), "{v}");
            }
            d
        }
    };
    let d0 = claim_with_op(0, true, Some("read")).await;
    let d1 = claim_with_op(1, true, Some("write")).await;
    let d2 = claim_with_op(2, false, None).await;
    let status_of = |id: &Value| {
        let id = id.as_str().unwrap().to_string();
        let relay = &relay;
        move || {
            let id = id.clone();
            async move {
                deliveries(relay)
                    .into_iter()
                    .find(|r| r["id"] == id.as_str())
                    .map(|r| r["status"].as_str().unwrap().to_string())
            }
        }
    };
    let s1 = eventually(|| {
        let f = status_of(&d1["id"]);
        async move { f().await.filter(|s| s != "claimed") }
    })
    .await;
    let s2 = eventually(|| {
        let f = status_of(&d2["id"]);
        async move { f().await.filter(|s| s != "claimed") }
    })
    .await;
    let s0 = eventually(|| {
        let f = status_of(&d0["id"]);
        async move { f().await.filter(|s| s != "claimed") }
    })
    .await;
    assert_eq!(
        (s0.as_str(), s1.as_str(), s2.as_str()),
        ("pending", "failed", "failed")
    );
    let shown: Value =
        serde_json::from_str(&relay.cli(&["deliveries", "show", d1["id"].as_str().unwrap()])).unwrap();
    assert_eq!(shown["failure_code"], "lease_expired");
    assert_eq!(shown["operations"][0]["effect"], "write");
    // The read-only one is claimable again, as attempt 2.
    let again = claim_when_due(&relay, &fx.agents[0], json!({})).await;
    assert_eq!(
        (again["id"].clone(), again["attempt"].as_i64()),
        (d0["id"].clone(), Some(2))
    );
}

async fn unclaimed_rows_expire(backend: Backend) {
    let cfg = FAST
        .replace("lifetime_secs = 60", "lifetime_secs = 4")
        .replace("max_lease_secs = 30", "max_lease_secs = 3")
        .replace("default_lease_secs = 5", "default_lease_secs = 1");
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: cfg,
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher
        .req("n", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("go").await;
    let row = eventually(|| async { deliveries(&relay).into_iter().next() }).await;
    // Two seconds into its four-second life, a three-second lease would
    // outlive the row: refused, and the row stays pending.
    let created = row["created_at"].as_i64().unwrap() as u64;
    while tests::now() < created + 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, v) = claim(
        &relay,
        &fx.agents[0],
        json!({"delivery_id": row["id"], "lease_seconds": 3}),
    )
    .await;
    assert_eq!(
        (status, v["error"].as_str()),
        (409, Some("lease_exceeds_lifetime")),
        "{v}"
    );
    assert_eq!(deliveries(&relay)[0]["status"], "pending");

    let expired =
        eventually(|| async { deliveries(&relay).into_iter().find(|r| r["status"] == "expired") }).await;
    assert_eq!(expired["id"], row["id"]);
    let notice = loop {
        let e = watcher.next_event("n").await;
        if !tags_named(&e, "workflow-delivery-failed").is_empty() {
            break e;
        }
    };
    assert_eq!(
        tags_named(&notice, "workflow-delivery-failed")[0][1..],
        [row["id"].as_str().unwrap().to_string(), "expired".into()]
    );
    // An expired row is never claimable.
    let (_, v) = claim(&relay, &fx.agents[0], json!({})).await;
    assert!(v["delivery"].is_null());
}

async fn finish_is_idempotent_and_atomic_with_its_reply(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    let trigger = fx.post("go").await;
    let msg = message_for(&mut fx.owner_client, "ops", &trigger).await;
    let agent = fx.agents[0].clone();
    let d = claim_when_due(&relay, &agent, json!({"lease_seconds": 20})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let reply = event(
        &agent,
        9,
        "on it",
        &[&["h", "ops"], &["e", &msg.id.to_hex(), "", "root"]],
    );
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    // A fault after the status update rolls back the reply too.
    let (status, v) = api(
        &relay,
        &agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&body),
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("delivered")), "{v}");
    // Replay of the same finish: same answer, nothing new.
    let (status, v) = api(
        &relay,
        &agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&body),
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("delivered")));
    // A different outcome with the old token is refused.
    let (status, v) = api(
        &relay,
        &agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&json!({"claim_token": d["claim_token"], "outcome": "failed"})),
    )
    .await;
    assert_eq!((status, v["error"].as_str()), (409, Some("stale_token")));
    let replies = fx
        .owner_client
        .req("r", vec![json!({"ids": [reply.id]})])
        .await
        .events();
    assert_eq!(replies.len(), 1);
    let shown: Value = serde_json::from_str(&relay.cli(&["deliveries", "show", &id])).unwrap();
    assert_eq!(shown["reply_event_id"], reply.id.to_hex());

    // Atomicity under a fault between reply and status: neither commits.
    let relay2 = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: FAST.into(),
            env: vec![("RELAY_FAULTS".into(), "finish:after_status=error*1".into())],
        },
    );
    let mut fx2 = Fixture::new(&relay2, "ops", 1).await;
    fx2.define("w", &on_message(&format!("{} go", fx2.mention(0))))
        .await;
    fx2.post("go").await;
    let agent = fx2.agents[0].clone();
    let d = claim_when_due(&relay2, &agent, json!({"lease_seconds": 20})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let reply = event(&agent, 9, "answer", &[&["h", "ops"]]);
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    let (status, _) = api(
        &relay2,
        &agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 503);
    assert!(
        fx2.owner_client
            .req("r", vec![json!({"ids": [reply.id]})])
            .await
            .events()
            .is_empty(),
        "reply committed without status"
    );
    assert_eq!(deliveries(&relay2)[0]["status"], "claimed");
    // The retried finish (same token) commits both.
    let (status, v) = api(
        &relay2,
        &agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&body),
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("delivered")));
    assert_eq!(
        fx2.owner_client
            .req("r2", vec![json!({"ids": [reply.id]})])
            .await
            .events()
            .len(),
        1
    );
}

/// Finishes sent together are committed together (the call writer), but a
/// finish that fails midway (after its reply was written) is undone alone:
/// the others keep their replies and statuses.
/// A reply stored by a finish starts no run, even of a workflow that
/// counts managed agents' messages (`include_agents`), while the same
/// agent's message published with EVENT does (docs/protocol.md,
/// "Deliveries": triggers fire on published events).
async fn a_finish_reply_starts_no_run(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("ask", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    let echo = json!({"name": "echo", "trigger": {"on": "message_posted",
        "filter": {"text_contains": "agent says", "include_agents": true}},
        "steps": [{"id": "note", "action": "send_message", "text": "heard {{trigger.text}}"}]});
    fx.define("echo", &echo).await;
    let trigger = fx.post("go").await;
    message_for(&mut fx.owner_client, "ops", &trigger).await;
    let agent = fx.agents[0].clone();
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let reply = event(&agent, 9, "agent says, by finish", &[&["h", "ops"]]);
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    let id = d["id"].as_str().expect("id");
    tests::workflow::ok(tests::workflow::finish(&relay, &agent, id, &body).await);
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&agent).await;
    let published = event(&agent, 9, "agent says, by EVENT", &[&["h", "ops"]]);
    c.publish_ok(&published).await;
    // The later thing that must happen: the EVENT's run has posted. A run
    // the reply started would be older (made in the finish's transaction)
    // and would have posted first: runs are advanced oldest first.
    let heard = message_for(&mut fx.owner_client, "ops", &published).await;
    assert_eq!(heard.content, "heard agent says, by EVENT");
    let messages = fx
        .owner_client
        .req("all", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    let reply_id = reply.id.to_hex();
    let from_reply: Vec<&Event> = messages
        .iter()
        .filter(|e| {
            tags_named(e, "workflow-cause")
                .first()
                .is_some_and(|t| t[2] == reply_id)
        })
        .collect();
    assert!(
        from_reply.is_empty(),
        "a finish's reply started a run: {from_reply:?}"
    );
    assert!(
        messages.iter().any(|e| e.id == reply.id),
        "the reply is stored in the channel"
    );
}

async fn concurrent_finishes_fail_alone(backend: Backend) {
    const N: usize = 8;
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: FAST.into(),
            env: vec![("RELAY_FAULTS".into(), "finish:after_status=error*1".into())],
        },
    );
    let mut fx = Fixture::new(&relay, "ops", N).await;
    let mentions: Vec<String> = (0..N).map(|i| fx.mention(i)).collect();
    fx.define("w", &on_message(&format!("{} go", mentions.join(" "))))
        .await;
    fx.post("go").await;
    let mut finishes = Vec::new();
    for agent in fx.agents.clone() {
        let d = claim_when_due(&relay, &agent, json!({"lease_seconds": 30})).await;
        let reply = event(&agent, 9, "done", &[&["h", "ops"]]);
        let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
        let id = d["id"].as_str().unwrap().to_string();
        finishes.push((agent, id, body, reply));
    }
    let paths: Vec<String> = finishes
        .iter()
        .map(|(_, id, _, _)| format!("/deliveries/{id}/finish"))
        .collect();
    let answers = futures_util::future::join_all(
        finishes
            .iter()
            .zip(&paths)
            .map(|((agent, _, body, _), path)| api(&relay, agent, "POST", path, Some(body))),
    )
    .await;
    let failed: Vec<usize> = (0..N).filter(|&i| answers[i].0 != 200).collect();
    assert_eq!(failed.len(), 1, "exactly the faulted finish fails: {answers:?}");
    assert_eq!(answers[failed[0]].0, 503);
    for (i, (_, id, _, reply)) in finishes.iter().enumerate() {
        let stored = fx
            .owner_client
            .req(&format!("r{i}"), vec![json!({"ids": [reply.id]})])
            .await
            .events();
        let row = deliveries(&relay)
            .into_iter()
            .find(|r| r["id"] == id.as_str())
            .expect("row");
        if i == failed[0] {
            assert!(stored.is_empty(), "the failed finish left its reply");
            assert_eq!(row["status"], "claimed");
        } else {
            assert_eq!(stored.len(), 1, "finish {i} lost its reply");
            assert_eq!(row["status"], "delivered");
        }
    }
    // The failed one, retried with the same token, commits.
    let (agent, id, body, _) = &finishes[failed[0]];
    let (status, v) = api(
        &relay,
        agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(body),
    )
    .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("delivered")), "{v}");
}

async fn channel_deletion_cancels(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define(
        "w",
        &on_message(&format!("{} {} go", fx.mention(0), fx.mention(1))),
    )
    .await;
    fx.post("go").await;
    let d = claim_when_due(&relay, &fx.agents[0], json!({"lease_seconds": 20})).await;
    eventually(|| async { (deliveries(&relay).len() == 2).then_some(()) }).await;
    let owner = fx.owner.clone();
    fx.owner_client
        .publish_ok(&event(&owner, 9008, "", &[&["h", "ops"]]))
        .await;
    let rows = deliveries(&relay);
    assert!(rows.iter().all(|r| r["status"] == "cancelled"), "{rows:?}");
    let id = d["id"].as_str().unwrap();
    let (status, v) = api(
        &relay,
        &fx.agents[0],
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(&json!({"claim_token": d["claim_token"], "outcome": "delivered"})),
    )
    .await;
    assert_eq!((status, v["error"].as_str()), (410, Some("cancelled")));
    let (status, _) = claim(
        &relay,
        &fx.agents[1],
        json!({"delivery_id": rows.iter().find(|r| r["target_pubkey"] == hex(&fx.agents[1])).unwrap()["id"]}),
    )
    .await;
    assert_eq!(status, 410);
    // Nothing is recreated: the engine keeps running (a barrier in another
    // channel, the deleted one has none), no new rows appear.
    Fixture::new(&relay, "elsewhere", 0).await.barrier(&relay).await;
    assert_eq!(deliveries(&relay).len(), 2);
    let runs = relay.cli(&["runs", "list", "--workflow", "w"]);
    assert!(
        runs.contains("\"status\":\"completed\"") || runs.contains("\"status\":\"cancelled\""),
        "{runs}"
    );
}

async fn disabled_and_deleted_workflows_stop(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let def = fx
        .define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("one").await;
    let d = claim_when_due(&relay, &fx.agents[0], json!({"lease_seconds": 20})).await;
    // Disable: the claimed delivery is cancelled, new messages start nothing.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut off = on_message(&format!("{} go", fx.mention(0)));
    off["enabled"] = json!(false);
    fx.define("w", &off).await;
    let rows = deliveries(&relay);
    assert_eq!(rows[0]["status"], "cancelled");
    assert_eq!(rows[0]["id"], d["id"]);
    // The OK of a message comes after its runs would have started.
    fx.post("two").await;
    assert_eq!(relay.cli(&["runs", "list"]).lines().count(), 1);
    // The old revision stays fetchable by id (runs pin it), but not by other filters.
    assert_eq!(
        fx.owner_client
            .req("d", vec![json!({"ids": [def.id]})])
            .await
            .events()
            .len(),
        1
    );
    assert_eq!(
        fx.owner_client
            .req("d2", vec![json!({"kinds": [30620]})])
            .await
            .events()
            .len(),
        1
    );
    // Re-enable, then delete it with NIP-09.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fx.define("w", &on_message(&format!("{} go", fx.mention(0))))
        .await;
    fx.post("three").await;
    eventually(|| async { (relay.cli(&["runs", "list"]).lines().count() == 2).then_some(()) }).await;
    let addr = format!("30620:{}:w", hex(&fx.owner));
    let owner = fx.owner.clone();
    fx.owner_client
        .publish_ok(&event(&owner, 5, "", &[&["a", &addr]]))
        .await;
    fx.post("four").await;
    assert_eq!(
        relay.cli(&["runs", "list"]).lines().count(),
        2,
        "a deleted workflow fired"
    );
}

async fn definitions_are_validated(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let owner = fx.owner.clone();
    let bad = |d: Value| tests::workflow::definition(&owner, "w", "ops", &d);
    for (def, why) in [
        (json!({"name": "x"}), "missing fields"),
        (
            json!({"name": "", "trigger": {"on": "manual"}, "steps": [{"id": "a", "action": "send_message", "text": "t"}]}),
            "empty name",
        ),
        (
            json!({"name": "x", "trigger": {"on": "schedule", "interval_secs": 30}, "steps": [{"id": "a", "action": "send_message", "text": "t"}]}),
            "interval",
        ),
        (
            json!({"name": "x", "trigger": {"on": "manual"}, "steps": [{"id": "a", "action": "send_message", "text": "{{trigger.nope}}"}]}),
            "template",
        ),
        (
            json!({"name": "x", "trigger": {"on": "manual"}, "steps": [{"id": "a", "action": "shell", "text": "t"}]}),
            "action",
        ),
    ] {
        let (ok, msg) = fx.owner_client.publish(&bad(def)).await;
        assert!(!ok && msg.starts_with("invalid:"), "{why}: {msg}");
    }
    // Only channel members may define workflows.
    let stranger = Keys::generate();
    let mut s = Client::connect(&relay.ws_url()).await;
    let (ok, msg) = s
        .publish(&tests::workflow::definition(
            &stranger,
            "w2",
            "ops",
            &on_message("x"),
        ))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    // A workflow id belongs to its first owner.
    let member = Keys::generate();
    fx.owner_client
        .publish_ok(&event(&owner, 9000, "", &[&["h", "ops"], &["p", &hex(&member)]]))
        .await;
    fx.define("taken", &on_message("x")).await;
    let (ok, msg) = s
        .publish(&tests::workflow::definition(
            &member,
            "taken",
            "ops",
            &on_message("y"),
        ))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    assert!(relay.cli(&["runs", "list"]).is_empty());
    let _ = PublicKey::from_hex(&fx.relay_pk).unwrap();
}

async fn manual_runs_schedules_and_run_listing(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("m", &json!({"name": "manual", "trigger": {"on": "manual"},
        "steps": [{"id": "a", "action": "send_message", "text": format!("{} manual {{{{trigger.body.note}}}}", fx.mention(0))}]})).await;
    let stranger = Keys::generate();
    let (status, v) = api(&relay, &stranger, "POST", "/workflows/m/runs", Some(&json!({}))).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("not_owner")));
    let (status, v) = api(
        &relay,
        &fx.owner,
        "POST",
        "/workflows/nope/runs",
        Some(&json!({})),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = api(
        &relay,
        &fx.owner,
        "POST",
        "/workflows/m/runs",
        Some(&json!({"note": "hi"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let msg = message_of_run(&mut fx.owner_client, "ops", &run_id).await;
    assert!(msg.content.ends_with("manual hi"));
    assert_eq!(tags_named(&msg, "workflow-cause")[0][1], "manual");
    // A manual call on a workflow with another trigger is refused.
    fx.define("hooky", &json!({"name": "h", "trigger": {"on": "webhook"}, "steps": [{"id": "a", "action": "send_message", "text": "x"}]})).await;
    let (status, v) = api(
        &relay,
        &fx.owner,
        "POST",
        "/workflows/hooky/runs",
        Some(&json!({})),
    )
    .await;
    assert_eq!((status, v["error"].as_str()), (409, Some("wrong_trigger")));
    // Runs are listed for their owner only, with status, paged.
    for i in 0..3 {
        let (s, _) = api(
            &relay,
            &fx.owner,
            "POST",
            "/workflows/m/runs",
            Some(&json!({"note": i})),
        )
        .await;
        assert_eq!(s, 200);
    }
    let (status, v) = api(&relay, &fx.owner, "GET", "/workflows/m/runs?limit=2", None).await;
    assert_eq!(status, 200, "{v}");
    let page = v["runs"].as_array().unwrap();
    assert_eq!(page.len(), 2);
    assert!(page[0]["status"].is_string() && page[0]["cause"]["type"] == "manual");
    let all = pages(&relay, &fx.owner, "/workflows/m/runs?limit=2", "runs").await;
    assert_eq!(all.len(), 4, "{all:?}");
    let (status, _) = api(&relay, &stranger, "GET", "/workflows/m/runs", None).await;
    assert_eq!(status, 403);
    // A schedule fires each slot once (interval 60 s: one run now).
    fx.define(
        "tick",
        &json!({"name": "tick", "trigger": {"on": "schedule", "interval_secs": 60},
        "steps": [{"id": "a", "action": "send_message", "text": "tick"}]}),
    )
    .await;
    // A cron schedule in a zone: every minute, Berlin time (its slots are
    // whole minutes whatever the zone's offset).
    fx.define(
        "cron",
        &json!({"name": "cron", "trigger": {"on": "schedule", "cron": "* * * * *", "timezone": "Europe/Berlin"},
        "steps": [{"id": "a", "action": "send_message", "text": "cron"}]}),
    )
    .await;
    // Both fire from the first full slot after they were enabled: wait for the next minute at most.
    for workflow in ["tick", "cron"] {
        let run = eventually_long(|| async {
            relay
                .cli(&["runs", "list", "--workflow", workflow])
                .lines()
                .next()
                .map(str::to_string)
        })
        .await;
        let run: Value = serde_json::from_str(&run).unwrap();
        assert_eq!(run["cause"]["type"], "schedule", "{workflow}");
        let slot: i64 = run["cause"]["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(slot % 60, 0, "{workflow}: a slot is a whole minute");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for workflow in ["tick", "cron"] {
        let runs = relay.cli(&["runs", "list", "--workflow", workflow]);
        // One run per slot: at most the minute that fired and, if the
        // clock crossed another minute meanwhile, that one.
        let slots: Vec<String> = runs
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["cause"]["id"].to_string())
            .collect();
        let mut unique = slots.clone();
        unique.dedup();
        assert_eq!(slots, unique, "{workflow}: a slot fired twice");
    }
    // A cron expression or zone that does not parse is refused at publish.
    let def = json!({"name": "b", "trigger": {"on": "schedule", "cron": "0 9 * * *", "timezone": "Mars/Olympus"},
    "steps": [{"id": "a", "action": "send_message", "text": "x"}]});
    let ev = tests::workflow::definition(&fx.owner, "badcron", &fx.channel, &def);
    let (ok, msg) = fx.owner_client.publish(&ev).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("Mars/Olympus"),
        "{msg}"
    );
}

async fn eventually_long<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..140 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("condition not reached within 70 s");
}

async fn startup_sweep_after_sigkill(backend: Backend) {
    let mut relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define(
        "w",
        &on_message(&format!("{} {} go", fx.mention(0), fx.mention(1))),
    )
    .await;
    fx.post("go").await;
    // Agent 0 claims with a short lease; the relay is then killed.
    let d = claim_when_due(&relay, &fx.agents[0], json!({"lease_seconds": 1})).await;
    eventually(|| async { (deliveries(&relay).len() == 2).then_some(()) }).await;
    relay.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relay.restart();
    // The start-up sweep ends the lapsed lease (no operations recorded: terminal).
    let row = eventually(|| async {
        deliveries(&relay)
            .into_iter()
            .find(|r| r["id"] == d["id"] && r["status"] != "claimed")
    })
    .await;
    assert_eq!(row["status"], "failed");
    assert_eq!(row["failure_code"], "lease_expired");
    // The other row is still pending and claimable; runs interrupted resume.
    let other = claim_when_due(&relay, &fx.agents[1], json!({})).await;
    assert_eq!(other["attempt"], 1);
}
