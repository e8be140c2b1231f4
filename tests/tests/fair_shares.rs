//! Fair shares of the agents' time: a workflow's `concurrency` caps its
//! claimed deliveries, a step's `priority` orders an agent's backlog, the
//! relay's `agent_concurrency` caps one agent's claims, and a finish that
//! frees a slot wakes the agent for the row the cap held back; through
//! the delivery API and with the real agent, on every backend.

use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::workflow::{claim, deliveries, ended, eventually, finish, run_until, start_run, Fixture};
use tests::{backend_tests, event, Backend, Relay, RelayOptions};

backend_tests!(
    a_capped_workflow_and_a_priority_order_an_agents_backlog,
    an_agent_cap_holds_across_workflows,
    a_freed_slot_wakes_the_agent_for_the_next_row,
    definitions_out_of_bounds_are_refused,
);

fn start(backend: &Backend, extra: &str) -> Relay {
    Relay::start_opts(
        backend,
        RelayOptions {
            config_toml: format!("[workflows]\nrun_poll_interval_ms = 200\n{extra}"),
            ..Default::default()
        },
    )
}

/// A manual workflow asking agent 0, with its `concurrency` and the
/// step's `priority` when given.
fn asking(fx: &Fixture, concurrency: Option<u32>, priority: Option<i8>) -> Value {
    let mut step = json!({"id": "ask", "action": "ask_agent", "text": format!("{} look", fx.mention(0))});
    if let Some(p) = priority {
        step["priority"] = json!(p);
    }
    let mut def = json!({"name": "asking", "trigger": {"on": "manual"}, "steps": [step]});
    if let Some(c) = concurrency {
        def["concurrency"] = json!(c);
    }
    def
}

/// Waits until the community holds `n` delivery rows; returns them.
async fn rows(relay: &Relay, n: usize) -> Vec<Value> {
    eventually(|| async {
        let rows = deliveries(relay);
        (rows.len() >= n).then_some(rows)
    })
    .await
}

/// Claims the agent's next row (no name): the delivery, or null.
async fn claim_next(relay: &Relay, fx: &Fixture) -> Value {
    let (status, v) = claim(relay, &fx.agents[0], json!({})).await;
    assert_eq!(status, 200, "{v}");
    v["delivery"].clone()
}

async fn deliver(relay: &Relay, fx: &Fixture, d: &Value) {
    let reply = event(&fx.agents[0], 9, "done", &[&["h", fx.channel.as_str()]]);
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    let (status, v) = finish(relay, &fx.agents[0], d["id"].as_str().unwrap(), &body).await;
    assert_eq!(status, 200, "{v}");
}

async fn a_capped_workflow_and_a_priority_order_an_agents_backlog(backend: Backend) {
    let relay = start(&backend, "");
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("flood", &asking(&fx, Some(1), None)).await;
    fx.define("urgent", &asking(&fx, None, Some(5))).await;
    for i in 0..3 {
        start_run(&relay, &fx.owner, "flood", json!({"i": i})).await;
    }
    rows(&relay, 3).await;
    start_run(&relay, &fx.owner, "urgent", json!({})).await;
    let all = rows(&relay, 4).await;
    let flood: Vec<&str> = all
        .iter()
        .filter(|r| r["workflow_id"] == "flood")
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    // The newest row first: its priority is higher.
    let first = claim_next(&relay, &fx).await;
    assert_eq!(first["workflow_id"], "urgent", "{first}");
    // Then the flood's oldest, and nothing more of it: its cap is 1.
    let second = claim_next(&relay, &fx).await;
    assert_eq!(second["workflow_id"], "flood", "{second}");
    assert!(claim_next(&relay, &fx).await.is_null());
    // Named, a held-back row is not claimable either.
    let other = flood.iter().find(|id| **id != second["id"]).unwrap();
    let (status, v) = claim(&relay, &fx.agents[0], json!({"delivery_id": other})).await;
    assert_eq!((status, &v["delivery"]), (200, &Value::Null), "{v}");
    // Its one claimed row finished, the next one is claimable.
    deliver(&relay, &fx, &second).await;
    let third = claim_next(&relay, &fx).await;
    assert_eq!(third["workflow_id"], "flood", "{third}");
    assert_ne!(third["id"], second["id"]);
    assert!(claim_next(&relay, &fx).await.is_null());
}

async fn an_agent_cap_holds_across_workflows(backend: Backend) {
    let relay = start(&backend, "[deliveries]\nagent_concurrency = 1\n");
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("one", &asking(&fx, None, None)).await;
    fx.define("two", &asking(&fx, None, None)).await;
    start_run(&relay, &fx.owner, "one", json!({})).await;
    start_run(&relay, &fx.owner, "two", json!({})).await;
    rows(&relay, 2).await;
    let first = claim_next(&relay, &fx).await;
    assert!(first.is_object(), "{first}");
    assert!(claim_next(&relay, &fx).await.is_null(), "the agent holds its cap");
    deliver(&relay, &fx, &first).await;
    let second = claim_next(&relay, &fx).await;
    assert_ne!(second["workflow_id"], first["workflow_id"], "{second}");
}

/// The real agent, polling only once an hour: the rows its workflow's
/// cap held back are claimed because each finish wakes it for the next.
async fn a_freed_slot_wakes_the_agent_for_the_next_row(backend: Backend) {
    let relay = start(&backend, "");
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = AgentProc::start(
        &relay,
        &fx.agents[0],
        &fx.owner,
        "type = \"echo\"",
        "poll_interval_secs = 3600",
    );
    agent.wait_subscribed().await;
    fx.define("flood", &asking(&fx, Some(1), None)).await;
    let mut runs = Vec::new();
    for i in 0..3 {
        runs.push(start_run(&relay, &fx.owner, "flood", json!({"i": i})).await);
    }
    for run_id in &runs {
        let run = run_until(&relay, &fx.owner, run_id, 30, ended).await;
        assert_eq!(run["status"], "completed", "{run}");
    }
    let all = deliveries(&relay);
    assert_eq!(all.len(), 3);
    assert!(
        all.iter()
            .all(|r| r["status"] == "delivered" && r["attempt"] == 1),
        "{all:?}"
    );
}

async fn definitions_out_of_bounds_are_refused(backend: Backend) {
    let relay = start(&backend, "");
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    for (def, field) in [
        (asking(&fx, Some(0), None), "concurrency"),
        (asking(&fx, Some(1001), None), "concurrency"),
        (asking(&fx, None, Some(11)), "priority"),
    ] {
        let ev = tests::workflow::definition(&fx.owner, "bad", &fx.channel, &def);
        let (ok, why) = fx.owner_client.publish(&ev).await;
        assert!(!ok && why.starts_with("invalid:") && why.contains(field), "{why}");
    }
}
