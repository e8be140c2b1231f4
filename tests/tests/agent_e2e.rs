//! End to end with real relay and real agent processes, on every backend:
//! message -> workflow -> wake -> claim -> verify -> handler -> reply.

use std::time::Duration;

use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, SecretKey, Tag};
use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::workflow::{deliveries, on_message, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    echo_agent_replies_end_to_end,
    offline_agent_catches_up_by_polling,
    verification_failures_finish_failed_without_dispatch,
    exec_transient_failure_is_retried,
    acp_handler_records_writes_before_they_run,
    one_channel_never_runs_two_turns_at_once,
    each_delivery_of_a_debounced_turn_has_its_own_outcome,
);

const FAST: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\n";

fn start(backend: &Backend) -> Relay {
    Relay::start_opts(
        backend,
        RelayOptions {
            config_toml: FAST.into(),
            ..Default::default()
        },
    )
}

fn tags_named<'e>(e: &'e Event, name: &str) -> Vec<&'e [String]> {
    e.tags
        .iter()
        .filter(|t| t.kind() == name)
        .map(|t| t.as_slice())
        .collect()
}

async fn wait_row(relay: &Relay, pick: impl Fn(&Value) -> bool, what: &str) -> Value {
    for _ in 0..200 {
        if let Some(r) = deliveries(relay).into_iter().find(|r| pick(r)) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no delivery {what} within 20 s: {:?}", deliveries(relay));
}

/// Waits for a kind 9 by `author` on subscription `sub`.
async fn reply_from(c: &mut Client, sub: &str, author: &Keys) -> Event {
    loop {
        let e = c.next_event(sub).await;
        if e.pubkey == author.public_key() {
            return e;
        }
    }
}

async fn echo_agent_replies_end_to_end(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent_keys = fx.agents[0].clone();
    let agent = AgentProc::start(&relay, &agent_keys, &fx.owner, "type = \"echo\"", "");
    agent.wait_subscribed().await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher
        .req("chan", vec![json!({"kinds": [9], "#h": ["ops"], "limit": 0})])
        .await
        .events();
    fx.define(
        "triage",
        &on_message(&format!("{} please handle: {{{{trigger.text}}}}", fx.mention(0))),
    )
    .await;
    let trigger = fx.post("the build is red").await;
    let reply = reply_from(&mut watcher, "chan", &agent_keys).await;
    assert!(
        reply.content.starts_with("echo: ") && reply.content.contains("please handle: the build is red"),
        "{}",
        reply.content
    );
    // Threaded (NIP-10) under the workflow message.
    let row = wait_row(&relay, |r| r["status"] == "delivered", "delivered").await;
    let msg_id = row["message_event_id"].as_str().unwrap();
    let e_tags = tags_named(&reply, "e");
    assert!(
        e_tags.iter().any(|t| t[1] == msg_id),
        "reply not threaded under the message: {e_tags:?}"
    );
    assert_eq!(row["reply_event_id"], reply.id.to_hex());
    assert_eq!(row["attempt"], 1);
    // Claimed through the wake, with operations recorded.
    let shown: Value =
        serde_json::from_str(&relay.cli(&["deliveries", "show", row["id"].as_str().unwrap()])).unwrap();
    assert_eq!(shown["operations"][0]["effect"], "read");
    // The agent's reply does not trigger the workflow again: a message's
    // runs start in the transaction that stores it, and the reply was
    // stored with the finish, before the row above said so.
    assert_eq!(relay.cli(&["runs", "list"]).lines().count(), 1);
    let _ = trigger;
}

async fn offline_agent_catches_up_by_polling(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("w", &on_message(&format!("{} look", fx.mention(0))))
        .await;
    fx.post("while the agent is away").await;
    wait_row(&relay, |r| r["status"] == "pending", "pending").await;
    // The wake was sent to nobody; the agent comes later and polls.
    let agent_keys = fx.agents[0].clone();
    let _agent = AgentProc::start(
        &relay,
        &agent_keys,
        &fx.owner,
        "type = \"echo\"",
        "poll_interval_secs = 1",
    );
    let row = wait_row(&relay, |r| r["status"] == "delivered", "delivered").await;
    assert!(row["reply_event_id"].is_string());
}

/// A workflow step whose exec handler would leave a mark if it ever ran.
fn marking_handler(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let mark = dir.join("dispatched.log");
    let script = dir.join("mark.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ncat >> {}\necho done\n", mark.display()),
    )
    .unwrap();
    (
        format!(
            "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 10",
            script.display()
        ),
        mark,
    )
}

async fn verification_failures_finish_failed_without_dispatch(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent_keys = fx.agents[0].clone();
    let mention = fx.mention(0);
    fx.define("w", &on_message(&format!("{mention} go {{{{trigger.text}}}}")))
        .await;
    // Five runs, five rows for the agent, crafted one way each while it is offline.
    for i in 0..5 {
        fx.post(&format!("case {i}")).await;
    }
    for _ in 0..100 {
        if deliveries(&relay).len() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = deliveries(&relay);
    assert_eq!(rows.len(), 5);
    let store = &relay.store;
    let by_text = |needle: &str| -> Value {
        rows.iter()
            .find(|r| {
                let ctx = store.sql(&format!(
                    "SELECT trigger_context FROM workflow_agent_deliveries WHERE id = '{}'",
                    r["id"].as_str().unwrap()
                ));
                ctx.contains(needle)
            })
            .unwrap()
            .clone()
    };
    let id = |r: &Value| r["id"].as_str().unwrap().to_string();
    let (render, cause, binding, definition, wake) = (
        by_text("case 0"),
        by_text("case 1"),
        by_text("case 2"),
        by_text("case 3"),
        by_text("case 4"),
    );
    let set = |r: &Value, assignment: String| {
        store.sql(&format!(
            "UPDATE workflow_agent_deliveries SET {assignment} WHERE id = '{}'",
            id(r)
        ));
    };
    // The snapshot no longer renders to the message.
    let ctx = store.sql(&format!(
        "SELECT trigger_context FROM workflow_agent_deliveries WHERE id = '{}'",
        id(&render)
    ));
    set(
        &render,
        format!("trigger_context = '{}'", ctx.replace("case 0", "case zero")),
    );
    // The snapshot names another cause.
    let ctx = store.sql(&format!(
        "SELECT trigger_context FROM workflow_agent_deliveries WHERE id = '{}'",
        id(&cause)
    ));
    let mut v: Value = serde_json::from_str(&ctx).unwrap();
    v["cause"]["id"] = json!("ab".repeat(32));
    set(&cause, format!("trigger_context = '{v}'"));
    // The row names another run than its message.
    set(&binding, "run_id = 'forged-run'".into());
    // The row names the message itself as its definition.
    set(
        &definition,
        format!(
            "definition_event_id = {}",
            store.blob(definition["message_event_id"].as_str().unwrap())
        ),
    );
    // This one is not due for a few seconds, and gets a forged (but relay-signed) wake.
    let due = tests::now() + 4;
    set(&wake, format!("next_attempt_at = {due}"));
    // A definition by a member who is not the agent's owner.
    let member = Keys::generate();
    let owner = fx.owner.clone();
    fx.owner_client
        .publish_ok(&event(
            &owner,
            9000,
            "",
            &[&["h", "ops"], &["p", &member.public_key().to_hex()]],
        ))
        .await;
    let mut mc = Client::connect(&relay.ws_url()).await;
    mc.publish_ok(&tests::workflow::definition(
        &member,
        "theirs",
        "ops",
        &json!({"name": "t", "trigger": {"on": "manual"},
        "steps": [{"id": "s", "action": "send_message", "text": format!("{mention} from a stranger")}]}),
    ))
    .await;
    let (s, v) = tests::workflow::api(
        &relay,
        &member,
        "POST",
        "/workflows/theirs/runs",
        Some(&json!({})),
    )
    .await;
    assert_eq!(s, 200, "{v}");

    let (handler, mark) = marking_handler(relay.store.dir.path());
    let agent = AgentProc::start(&relay, &agent_keys, &fx.owner, &handler, "poll_interval_secs = 1");
    agent.wait_subscribed().await;
    // The forged wake: relay-signed (the test reads the community key), other run.
    let sk = store.sql("SELECT secret_key_hex FROM communities WHERE id = 'default'");
    let relay_keys = Keys::new(SecretKey::from_hex(sk.trim()).unwrap());
    let tags = protocol::workflow::wake_tags(
        &agent_keys.public_key(),
        "ops",
        &id(&wake),
        wake["definition_event_id"].as_str().unwrap(),
        "not-the-run",
        "notify",
        wake["message_event_id"].as_str().unwrap(),
    );
    let forged = EventBuilder::new(Kind::from_u16(24620), "")
        .tags(tags)
        .finalize(&relay_keys)
        .unwrap();
    // h-tagged events need a member author: let the relay key in, to publish the forgery.
    let relay_pk = relay_keys.public_key().to_hex();
    fx.owner_client
        .publish_ok(&event(&owner, 9000, "", &[&["h", "ops"], &["p", &relay_pk]]))
        .await;
    let mut c = Client::connect(&relay.ws_url()).await;
    c.publish_ok(&forged).await;

    let expect = [
        (id(&render), "render_mismatch"),
        (id(&cause), "cause_mismatch"),
        (id(&binding), "message_binding_mismatch"),
        (id(&definition), "definition_unverifiable"),
        (id(&wake), "wake_binding_mismatch"),
    ];
    for (row_id, code) in expect {
        let r = wait_row(
            &relay,
            |r| r["id"] == row_id.as_str() && r["status"] == "failed",
            code,
        )
        .await;
        assert_eq!(r["failure_code"], code, "{r}");
    }
    let stranger_row = wait_row(
        &relay,
        |r| r["workflow_id"] == "theirs" && r["status"] == "failed",
        "owner_not_allowed",
    )
    .await;
    assert_eq!(stranger_row["failure_code"], "owner_not_allowed");
    // Nothing was dispatched, and each failure is visible in the channel.
    assert!(
        !mark.exists(),
        "a handler ran for an unverified delivery: {:?}",
        std::fs::read_to_string(&mark)
    );
    let notices = c
        .req("n", vec![json!({"kinds": [9], "#h": ["ops"]})])
        .await
        .events();
    let codes: Vec<String> = notices
        .iter()
        .flat_map(|e| tags_named(e, "workflow-delivery-failed"))
        .map(|t| t[2].clone())
        .collect();
    for code in [
        "render_mismatch",
        "cause_mismatch",
        "message_binding_mismatch",
        "definition_unverifiable",
        "wake_binding_mismatch",
        "owner_not_allowed",
    ] {
        assert!(codes.iter().any(|c| c == code), "no notice for {code}: {codes:?}");
    }
}

async fn exec_transient_failure_is_retried(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let dir = relay.store.dir.path();
    let counter = dir.join("attempts");
    let script = dir.join("flaky.sh");
    std::fs::write(&script, format!(
        "#!/bin/sh\ncat > /dev/null\nif [ ! -e {c} ]; then touch {c}; echo 'not yet' >&2; exit 75; fi\necho 'worked on the second try'\n",
        c = counter.display()
    )).unwrap();
    let handler = format!(
        "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 10",
        script.display()
    );
    let agent_keys = fx.agents[0].clone();
    let agent = AgentProc::start(&relay, &agent_keys, &fx.owner, &handler, "");
    agent.wait_subscribed().await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher
        .req("chan", vec![json!({"kinds": [9], "#h": ["ops"], "limit": 0})])
        .await
        .events();
    fx.define("w", &on_message(&format!("{} flaky", fx.mention(0))))
        .await;
    fx.post("go").await;
    let reply = reply_from(&mut watcher, "chan", &agent_keys).await;
    assert_eq!(reply.content, "worked on the second try");
    let row = wait_row(&relay, |r| r["status"] == "delivered", "delivered").await;
    assert_eq!(row["attempt"], 2, "retried once: {row}");
    let shown: Value =
        serde_json::from_str(&relay.cli(&["deliveries", "show", row["id"].as_str().unwrap()])).unwrap();
    let attempts: Vec<i64> = shown["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(
        attempts,
        vec![1, 2],
        "each attempt recorded its write before running: {shown}"
    );
    assert!(shown["operations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["effect"] == "write"));
}

async fn acp_handler_records_writes_before_they_run(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let side_effects = relay.store.dir.path().join("acp-side-effects.log");
    let acp = tests::workspace_bin("acp_test_agent");
    let handler = format!(
        "type = \"acp\"\ncommand = [\"env\", \"ACP_TEST_SIDE_EFFECT_FILE={}\", \"{}\"]\ntimeout_secs = 20",
        side_effects.display(),
        acp.display()
    );
    let agent_keys = fx.agents[0].clone();
    let agent = AgentProc::start(&relay, &agent_keys, &fx.owner, &handler, "");
    agent.wait_subscribed().await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher
        .req("chan", vec![json!({"kinds": [9], "#h": ["ops"], "limit": 0})])
        .await
        .events();
    fx.define(
        "w",
        &on_message(&format!("{} summarize {{{{trigger.text}}}}", fx.mention(0))),
    )
    .await;
    fx.post("the incident").await;
    let reply = reply_from(&mut watcher, "chan", &agent_keys).await;
    assert!(
        reply.content.starts_with("acp says: ") && reply.content.ends_with("summarize the incident"),
        "{}",
        reply.content
    );
    let row = wait_row(&relay, |r| r["status"] == "delivered", "delivered").await;
    // The write tool call was recorded (as a write) before permission was granted and it ran.
    let shown: Value =
        serde_json::from_str(&relay.cli(&["deliveries", "show", row["id"].as_str().unwrap()])).unwrap();
    let ops = shown["operations"].as_array().unwrap();
    assert!(
        ops.iter()
            .any(|o| o["name"] == "write side effect" && o["effect"] == "write"),
        "{shown}"
    );
    let written = std::fs::read_to_string(&side_effects).expect("the ACP agent's write ran");
    assert!(written.contains("summarize the incident"));
}

async fn one_channel_never_runs_two_turns_at_once(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let dir = relay.store.dir.path();
    let log = dir.join("turns.log");
    let script = dir.join("slow.sh");
    std::fs::write(&script, format!(
        "#!/bin/sh\ncat > /dev/null\necho \"start $(date +%s%N)\" >> {l}\nsleep 0.4\necho \"end $(date +%s%N)\" >> {l}\necho ok\n",
        l = log.display()
    )).unwrap();
    let handler = format!(
        "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 10",
        script.display()
    );
    let agent_keys = fx.agents[0].clone();
    let agent = AgentProc::start(
        &relay,
        &agent_keys,
        &fx.owner,
        &handler,
        "debounce_ms = 0\nmax_concurrent_channels = 4",
    );
    agent.wait_subscribed().await;
    fx.define("w", &on_message(&format!("{} next", fx.mention(0))))
        .await;
    for i in 0..5 {
        fx.post(&format!("m{i}")).await;
    }
    for _ in 0..200 {
        let rows = deliveries(&relay);
        if rows.len() == 5 && rows.iter().all(|r| r["status"] == "delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = deliveries(&relay);
    assert!(
        rows.len() == 5 && rows.iter().all(|r| r["status"] == "delivered"),
        "{rows:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let mut last_end = 0u128;
    let mut turns = 0;
    let mut open = false;
    for line in text.lines() {
        let (what, t) = line.split_once(' ').unwrap();
        let t: u128 = t.parse().unwrap();
        match what {
            "start" => {
                assert!(
                    !open && t >= last_end,
                    "two turns of one channel overlapped:\n{text}"
                );
                open = true;
                turns += 1;
            }
            _ => {
                open = false;
                last_end = t;
            }
        }
    }
    assert!(turns >= 1 && !open);
    let _ = Tag::custom("x", ["y"]);
}

async fn each_delivery_of_a_debounced_turn_has_its_own_outcome(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let turns = relay.store.dir.path().join("turns.log");
    let handler = format!(
        "type = \"exec\"\ncommand = [\"{}\", \"{}\"]\ntimeout_secs = 10",
        tests::workspace_bin("exec_results").display(),
        turns.display()
    );
    let agent_keys = fx.agents[0].clone();
    // A long debounce: the three deliveries of the channel make one turn.
    let agent = AgentProc::start(&relay, &agent_keys, &fx.owner, &handler, "debounce_ms = 2000");
    agent.wait_subscribed().await;
    fx.define(
        "hook",
        &on_message(&format!("{} deliver {{{{trigger.text}}}}", fx.mention(0))),
    )
    .await;
    for text in ["one", "the flaky one", "three"] {
        fx.post(text).await;
    }
    let ended = |r: &Value| r["status"] == "delivered" || r["status"] == "failed";
    let mut rows = Vec::new();
    for _ in 0..200 {
        rows = deliveries(&relay);
        if rows.len() == 3 && rows.iter().all(ended) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&turns).unwrap(),
        "3\n",
        "one turn of three deliveries"
    );
    // One failure failed no other, and kept its own code and message.
    let failed: Vec<&Value> = rows.iter().filter(|r| r["status"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{rows:?}");
    assert_eq!(failed[0]["failure_code"], "webhook_refused", "{rows:?}");
    let message = failed[0]["failure_message"].as_str().unwrap();
    assert!(
        message.starts_with("the flaky webhook said no to: ") && message.ends_with("deliver the flaky one"),
        "{message}"
    );
    assert_eq!(
        rows.iter().filter(|r| r["status"] == "delivered").count(),
        2,
        "{rows:?}"
    );
    // Each delivered one has its own reply, threaded under its own message.
    let mut c = Client::connect(&relay.ws_url()).await;
    let replies = c
        .req(
            "r",
            vec![json!({"kinds": [9], "authors": [agent_keys.public_key().to_hex()]})],
        )
        .await
        .events();
    assert_eq!(replies.len(), 2, "{replies:?}");
    for r in rows.iter().filter(|r| r["status"] == "delivered") {
        let reply = replies
            .iter()
            .find(|e| e.id.to_hex() == r["reply_event_id"].as_str().unwrap())
            .expect("the row's reply is stored");
        let threaded = tags_named(reply, "e");
        assert_eq!(
            threaded[0][1],
            r["message_event_id"].as_str().unwrap(),
            "{reply:?}"
        );
        assert!(reply.content.starts_with("ok: "), "{}", reply.content);
    }
    let texts: std::collections::BTreeSet<&str> = replies
        .iter()
        .map(|e| e.content.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(texts.into_iter().collect::<Vec<_>>(), ["one", "three"]);
}
