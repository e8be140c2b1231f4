//! Workflows v2 over real sockets and HTTP, on every backend: `ask_agent`
//! (the run waits for replies), `if` conditions, `delay` timers, runs that
//! say where each step is (`GET /runs/<id>`, `relay runs show`), and
//! validation at publish.

use std::time::Duration;

use nostr::prelude::{Event, Keys, ToBech32};
use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::relay::Store;
use tests::workflow::{
    claim_when_due, deliveries, ended, finish, get_run, relay_messages, run_until, start_run, Fixture,
};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    ask_if_and_quote_with_a_real_agent,
    any_of_two_agents_takes_the_first_answer,
    a_failed_ask_fails_the_run_or_continues,
    an_ask_times_out_and_no_agent_fails_at_once,
    a_delay_fires_once_across_sigkill_and_two_processes,
    v2_definitions_are_validated_at_publish,
    a_cron_slot_fires_once_with_two_processes,
    all_waits_for_every_reply_even_when_they_finish_at_once,
    finishes_of_two_runs_at_once_all_succeed,
    a_condition_that_grows_without_bound_fails_its_run,
);

const FAST: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n";

fn options() -> RelayOptions {
    RelayOptions {
        config_toml: FAST.into(),
        ..Default::default()
    }
}

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

fn reply(agent: &Keys, channel: &str, text: &str) -> Event {
    event(agent, 9, text, &[&["h", channel]])
}

async fn ask_if_and_quote_with_a_real_agent(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = AgentProc::start(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"", "");
    agent.wait_subscribed().await;
    fx.define(
        "triage",
        &json!({"name": "triage", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} triage: {{{{trigger.body.text}}}}", fx.mention(0))},
            {"id": "page", "action": "send_message", "if": "steps.ask.output.reply.contains('urgent')",
             "text": "Paging on-call: {{steps.ask.output.reply}}"},
            {"id": "calm", "action": "send_message", "if": "!steps.ask.output.reply.contains('urgent')",
             "text": "No page needed"}]}),
    )
    .await;
    let run_id = start_run(&relay, &fx.owner, "triage", json!({"text": "db is down, urgent"})).await;
    let run = run_until(&relay, &fx.owner, &run_id, 30, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let steps = run["steps"].as_array().unwrap();
    let ids: Vec<&str> = steps.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["ask", "page", "calm"]);
    let statuses: Vec<&str> = steps.iter().map(|s| s["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["done", "done", "skipped"], "{run}");
    let ask = &steps[0]["output"];
    assert_eq!(ask["status"], "delivered", "{run}");
    let answer = ask["reply"].as_str().unwrap();
    assert!(
        answer.starts_with("echo: ") && answer.contains("urgent"),
        "{answer}"
    );
    let replies = ask["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 1, "{run}");
    assert_eq!(replies[0]["agent"], hex(&fx.agents[0]));
    assert_eq!(replies[0]["status"], "delivered");
    assert_eq!(replies[0]["text"], answer);
    assert_eq!(steps[2]["output"], json!({"skipped": true}));
    assert_eq!(steps[0]["action"], "ask_agent");
    for s in steps {
        assert!(
            s["started_at"].as_i64().unwrap() <= s["finished_at"].as_i64().unwrap(),
            "{s}"
        );
    }
    // The third message quotes the agent's reply, exactly.
    let msgs = relay_messages(&relay, &fx).await;
    let page: Vec<&Event> = msgs.iter().filter(|m| m.content.starts_with("Paging")).collect();
    assert_eq!(page.len(), 1, "{msgs:?}");
    assert_eq!(page[0].content, format!("Paging on-call: {answer}"));
    assert!(!msgs.iter().any(|m| m.content == "No page needed"));
    // The CLI prints the same run.
    let shown: Value = serde_json::from_str(&relay.cli(&["runs", "show", &run_id])).unwrap();
    assert_eq!(shown["steps"], run["steps"]);
    assert_eq!(shown["status"], run["status"]);
    // Only the owner sees it; an unknown id is 404.
    let stranger = Keys::generate();
    let (status, v) = get_run(&relay, &stranger, &run_id).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("not_owner")), "{v}");
    let (status, v) = get_run(&relay, &fx.owner, "0123456789abcdef").await;
    assert_eq!((status, v["error"].as_str()), (404, Some("unknown_run")), "{v}");
}

async fn any_of_two_agents_takes_the_first_answer(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    fx.define(
        "any",
        &json!({"name": "any", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "wait": "any",
             "text": format!("{} {} who is on call?", fx.mention(0), fx.mention(1))},
            {"id": "after", "action": "send_message", "text": "answer: {{steps.ask.output.reply}}"}]}),
    )
    .await;
    let run_id = start_run(&relay, &fx.owner, "any", json!({})).await;
    // While nobody answers, the run and its step wait.
    let run = run_until(&relay, &fx.owner, &run_id, 10, |r| r["status"] == "waiting").await;
    assert_eq!(run["steps"][0]["status"], "waiting", "{run}");
    assert_eq!(run["steps"][1]["status"], "pending", "{run}");
    assert!(run["wake_at"].as_i64().unwrap() > run["steps"][0]["started_at"].as_i64().unwrap());
    let held = claim_when_due(&relay, &fx.agents[0], json!({})).await;
    let second = claim_when_due(&relay, &fx.agents[1], json!({})).await;
    let text = "alice is on call";
    let (status, v) = finish(
        &relay,
        &fx.agents[1],
        second["id"].as_str().unwrap(),
        &json!({"claim_token": second["claim_token"], "outcome": "delivered", "reply": reply(&fx.agents[1], "ops", text)}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let run = run_until(&relay, &fx.owner, &run_id, 10, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let out = &run["steps"][0]["output"];
    assert_eq!(
        (out["status"].as_str(), out["reply"].as_str()),
        (Some("delivered"), Some(text)),
        "{run}"
    );
    let replies = out["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 2, "{run}");
    let by = |pk: &str| replies.iter().find(|r| r["agent"] == pk).unwrap().clone();
    assert_eq!(by(&hex(&fx.agents[1]))["status"], "delivered");
    assert_eq!(by(&hex(&fx.agents[0]))["status"], "cancelled");
    // The other agent's row was cancelled: its holder's finish is refused.
    let (status, v) = finish(
        &relay,
        &fx.agents[0],
        held["id"].as_str().unwrap(),
        &json!({"claim_token": held["claim_token"], "outcome": "delivered", "reply": reply(&fx.agents[0], "ops", "me!")}),
    )
    .await;
    assert_eq!((status, v["error"].as_str()), (410, Some("cancelled")), "{v}");
    let row = deliveries(&relay)
        .into_iter()
        .find(|r| r["id"] == held["id"])
        .unwrap();
    assert_eq!(row["failure_code"], "step_done", "{row}");
    let msgs = relay_messages(&relay, &fx).await;
    assert_eq!(
        msgs.iter()
            .filter(|m| m.content == format!("answer: {text}"))
            .count(),
        1
    );
    // The reply that was refused is not stored.
    let mut c = Client::connect(&relay.ws_url()).await;
    let late = c
        .req(
            "late",
            vec![json!({"kinds": [9], "authors": [hex(&fx.agents[0])]})],
        )
        .await
        .events();
    assert!(late.is_empty(), "{late:?}");
}

async fn a_failed_ask_fails_the_run_or_continues(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    for (id, on_failure) in [("strict", "fail"), ("lenient", "continue")] {
        fx.define(
            id,
            &json!({"name": id, "trigger": {"on": "manual"}, "steps": [
                {"id": "ask", "action": "ask_agent", "on_failure": on_failure, "text": format!("{} check", fx.mention(0))},
                {"id": "after", "action": "send_message", "text": format!("{id} went on: {{{{steps.ask.output.status}}}}")}]}),
        )
        .await;
    }
    let strict = start_run(&relay, &fx.owner, "strict", json!({})).await;
    let lenient = start_run(&relay, &fx.owner, "lenient", json!({})).await;
    for _ in 0..2 {
        let d = claim_when_due(&relay, &fx.agents[0], json!({})).await;
        let (status, v) = finish(
            &relay,
            &fx.agents[0],
            d["id"].as_str().unwrap(),
            &json!({"claim_token": d["claim_token"], "outcome": "failed", "failure_code": "tool_broke",
                    "failure_message": "boom"}),
        )
        .await;
        assert_eq!((status, v["status"].as_str()), (200, Some("failed")), "{v}");
    }
    let run = run_until(&relay, &fx.owner, &strict, 10, ended).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "agent_failed", "{run}");
    assert_eq!(run["error"]["step"], "ask", "{run}");
    assert!(
        run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed tool_broke"),
        "{run}"
    );
    assert_eq!(run["steps"][0]["status"], "failed", "{run}");
    assert_eq!(run["steps"][0]["output"]["status"], "failed", "{run}");
    assert_eq!(run["steps"][1]["status"], "pending", "{run}");
    let run = run_until(&relay, &fx.owner, &lenient, 10, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["error"], Value::Null, "{run}");
    assert_eq!(run["steps"][0]["status"], "failed", "{run}");
    assert_eq!(run["steps"][0]["error"]["code"], "agent_failed", "{run}");
    assert_eq!(run["steps"][1]["status"], "done", "{run}");
    let msgs = relay_messages(&relay, &fx).await;
    assert!(
        msgs.iter().any(|m| m.content == "lenient went on: failed"),
        "{msgs:?}"
    );
    assert!(
        !msgs.iter().any(|m| m.content.starts_with("strict went on")),
        "{msgs:?}"
    );
}

async fn an_ask_times_out_and_no_agent_fails_at_once(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let person = Keys::generate().public_key().to_bech32().unwrap();
    fx.define(
        "slow",
        &json!({"name": "slow", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "timeout_secs": 60, "on_failure": "continue",
             "text": format!("{} anyone?", fx.mention(0))},
            {"id": "after", "action": "send_message", "text": "ask ended {{steps.ask.output.status}}"}]}),
    )
    .await;
    fx.define(
        "nobody",
        &json!({"name": "nobody", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("nostr:{person} are you an agent?")}]}),
    )
    .await;
    let slow = start_run(&relay, &fx.owner, "slow", json!({})).await;
    // No managed agent among the recipients: the step fails at once.
    let nobody = start_run(&relay, &fx.owner, "nobody", json!({})).await;
    let run = run_until(&relay, &fx.owner, &nobody, 10, ended).await;
    assert_eq!(
        (run["status"].as_str(), run["error"]["code"].as_str()),
        (Some("failed"), Some("no_agent")),
        "{run}"
    );
    // The agent claims and holds the row, renewing nothing: the step's
    // timeout ends the wait, and the row is cancelled.
    let d = claim_when_due(&relay, &fx.agents[0], json!({"lease_seconds": 120})).await;
    let run = run_until(&relay, &fx.owner, &slow, 5, |r| r["status"] == "waiting").await;
    let started = run["steps"][0]["started_at"].as_i64().unwrap();
    assert_eq!(run["wake_at"].as_i64(), Some(started + 60), "{run}");
    let run = run_until(&relay, &fx.owner, &slow, 90, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let ask = &run["steps"][0];
    assert_eq!(
        (ask["status"].as_str(), ask["error"]["code"].as_str()),
        (Some("failed"), Some("step_timeout")),
        "{run}"
    );
    assert_eq!(ask["output"]["status"], "timed_out", "{run}");
    assert!(ask["finished_at"].as_i64().unwrap() >= started + 60, "{run}");
    let row = deliveries(&relay)
        .into_iter()
        .find(|r| r["id"] == d["id"])
        .unwrap();
    assert_eq!(
        (row["status"].as_str(), row["failure_code"].as_str()),
        (Some("cancelled"), Some("step_timeout"))
    );
    let msgs = relay_messages(&relay, &fx).await;
    assert_eq!(
        msgs.iter().filter(|m| m.content == "ask ended timed_out").count(),
        1
    );
    let (status, _) = finish(
        &relay,
        &fx.agents[0],
        d["id"].as_str().unwrap(),
        &json!({"claim_token": d["claim_token"], "outcome": "delivered"}),
    )
    .await;
    assert_eq!(status, 410);
}

async fn a_delay_fires_once_across_sigkill_and_two_processes(backend: Backend) {
    let store = Store::new(&backend);
    let mut a = Relay::start_with(store.clone(), options());
    let mut fx = Fixture::new(&a, "ops", 0).await;
    fx.define(
        "later",
        &json!({"name": "later", "trigger": {"on": "manual"}, "steps": [
            {"id": "wait", "action": "delay", "secs": 3},
            {"id": "after", "action": "send_message", "text": "after the delay {{steps.wait.output.until}}"}]}),
    )
    .await;
    let run_id = start_run(&a, &fx.owner, "later", json!({})).await;
    let run = run_until(&a, &fx.owner, &run_id, 5, |r| r["status"] == "waiting").await;
    let started = run["steps"][0]["started_at"].as_i64().unwrap();
    assert_eq!(run["wake_at"].as_i64(), Some(started + 3));
    // The process dies while the run waits; it and a second process come
    // back after the timer passed: the step ends once.
    a.kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let b = Relay::start_with(store.clone(), options());
    a.restart();
    let run = run_until(&b, &fx.owner, &run_id, 15, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["output"], json!({"until": started + 3}), "{run}");
    // A step's message commits with the run's advance, and an ended run is
    // never advanced again: its messages are final now.
    let msgs = relay_messages(&a, &fx).await;
    let after: Vec<&Event> = msgs
        .iter()
        .filter(|m| m.content.starts_with("after the delay"))
        .collect();
    assert_eq!(after.len(), 1, "{msgs:?}");
    assert_eq!(after[0].content, format!("after the delay {}", started + 3));
}

async fn v2_definitions_are_validated_at_publish(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let fx = Fixture::new(&relay, "ops", 1).await;
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&fx.owner).await;
    let ask = json!({"id": "ask", "action": "ask_agent", "text": format!("{} hi", fx.mention(0))});
    for (steps, want) in [
        (
            json!([{"id": "a", "action": "send_message", "text": "x", "if": "steps.b.output.text == ''"},
                   {"id": "b", "action": "send_message", "text": "y"}]),
            "invalid: step a: if: steps.b names no earlier step (line 1, column 6)",
        ),
        (
            json!([ask.clone(), {"id": "b", "action": "send_message", "text": "y", "if": "steps.ask.output.reply > 3"}]),
            "invalid: step b: if: > does not apply to (string, int) (line 1, column 24)",
        ),
        (
            json!([{"id": "a", "action": "send_message", "text": "x",
                    "if": "[trigger.text].map(x, x + x).map(x, x + x).map(x, x + x).size() > 0"}]),
            "invalid: step a: if: at most 2 comprehensions may be chained",
        ),
        (
            json!([{"id": "d", "action": "delay", "secs": 0}]),
            "invalid: step d: secs:",
        ),
        (
            json!([{"id": "ask", "action": "ask_agent", "text": "hi", "wait": "some"}]),
            "invalid: step ask: wait:",
        ),
        (
            json!([{"id": "ask", "action": "ask_agent", "text": "nobody named"}]),
            "invalid: step ask: text: must mention",
        ),
        (
            json!([{"id": "ask", "action": "ask_agent", "text": format!("{} hi", fx.mention(0)), "timeout_secs": 10}]),
            "invalid: step ask: timeout_secs:",
        ),
        (
            json!([{"id": "ask", "action": "ask_agent", "text": format!("{} hi", fx.mention(0)), "on_failure": "shrug"}]),
            "invalid: step ask: on_failure:",
        ),
        (
            json!([ask.clone(), {"id": "b", "action": "send_message", "text": "{{steps.b.output.text}}"}]),
            "invalid: step b: text: {{steps.b.output.text}} names step b, which is not an earlier step",
        ),
    ] {
        let def = json!({"name": "bad", "trigger": {"on": "manual"}, "steps": steps});
        let ev = tests::workflow::definition(&fx.owner, "bad", "ops", &def);
        let (ok, msg) = c.publish(&ev).await;
        assert!(!ok && msg.starts_with(want), "{want}: {msg}");
    }
}

/// The schedule passes a relay process completed (its
/// `relay_schedule_passes_total`, every community).
async fn schedule_passes(relay: &Relay) -> f64 {
    relay
        .metric_lines("relay_schedule_passes_total")
        .await
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn a_cron_slot_fires_once_with_two_processes(backend: Backend) {
    let store = Store::new(&backend);
    let with_metrics = || RelayOptions {
        config_toml: format!("metrics_listen = \"127.0.0.1:0\"\n{FAST}"),
        ..Default::default()
    };
    let a = Relay::start_with(store.clone(), with_metrics());
    let b = Relay::start_with(store.clone(), with_metrics());
    let mut fx = Fixture::new(&a, "ops", 0).await;
    fx.define(
        "minutely",
        &json!({"name": "minutely", "trigger": {"on": "schedule", "cron": "* * * * *", "timezone": "America/New_York"},
                "steps": [{"id": "tick", "action": "send_message", "text": "tick"}]}),
    )
    .await;
    // The first full minute after publishing fires (at most 60 s away).
    let mut runs = Vec::new();
    for _ in 0..750 {
        runs = a
            .cli(&["runs", "list", "--workflow", "minutely"])
            .lines()
            .map(str::to_string)
            .collect();
        if !runs.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!runs.is_empty(), "no slot fired within 75 s");
    let first: Value = serde_json::from_str(&runs[runs.len() - 1]).unwrap();
    let slot = first["cause"]["id"].as_str().unwrap().to_string();
    // Both processes go on looking at the schedule: once each has
    // completed two more passes (so one began after the run was seen),
    // there is still one run and one message for that slot.
    let seen = [schedule_passes(&a).await, schedule_passes(&b).await];
    for _ in 0..200 {
        let now = [schedule_passes(&a).await, schedule_passes(&b).await];
        if now[0] >= seen[0] + 2.0 && now[1] >= seen[1] + 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = [schedule_passes(&a).await, schedule_passes(&b).await];
    assert!(
        now[0] >= seen[0] + 2.0 && now[1] >= seen[1] + 2.0,
        "schedule passes since the run was seen: {seen:?} -> {now:?}"
    );
    let slots: Vec<String> = b
        .cli(&["runs", "list", "--workflow", "minutely"])
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["cause"]["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(slots.iter().filter(|s| **s == slot).count(), 1, "{slots:?}");
    let msgs = relay_messages(&b, &fx).await;
    let ticks = msgs.iter().filter(|m| m.content == "tick").count();
    assert_eq!(ticks, slots.len(), "one message per run: {slots:?}");
}

async fn all_waits_for_every_reply_even_when_they_finish_at_once(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 3).await;
    let mentions: Vec<String> = (0..3).map(|i| fx.mention(i)).collect();
    fx.define(
        "all",
        &json!({"name": "all", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} report", mentions.join(" "))},
            {"id": "after", "action": "send_message", "text": "{{steps.ask.output.status}}"}]}),
    )
    .await;
    for round in 0..3 {
        let run_id = start_run(&relay, &fx.owner, "all", json!({"round": round})).await;
        let mut claimed = Vec::new();
        for a in &fx.agents {
            claimed.push(claim_when_due(&relay, a, json!({})).await);
        }
        let finish_one = |i: usize| {
            let (agent, d) = (fx.agents[i].clone(), claimed[i].clone());
            let relay = &relay;
            async move {
                let body = json!({"claim_token": d["claim_token"], "outcome": "delivered",
                                  "reply": reply(&agent, "ops", &format!("agent {i} round {round}"))});
                finish(relay, &agent, d["id"].as_str().unwrap(), &body).await
            }
        };
        // One answer: the run still waits. Then the last two at once: the
        // run wakes (neither may take the other for still open).
        let a = finish_one(0).await;
        assert_eq!(a.0, 200, "{a:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, run) = get_run(&relay, &fx.owner, &run_id).await;
        assert_eq!(run["status"], "waiting", "{run}");
        let (b, c) = tokio::join!(finish_one(1), finish_one(2));
        assert_eq!((b.0, c.0), (200, 200), "{b:?} {c:?}");
        let run = run_until(&relay, &fx.owner, &run_id, 10, ended).await;
        assert_eq!(run["status"], "completed", "{run}");
        let replies = run["steps"][0]["output"]["replies"].as_array().unwrap();
        assert_eq!(replies.len(), 3, "{run}");
        assert!(replies.iter().all(|r| r["status"] == "delivered"), "{run}");
    }
}

async fn finishes_of_two_runs_at_once_all_succeed(backend: Backend) {
    // Every agent answers both runs at once: with several call writers
    // side by side (PostgreSQL), no finish may wait on another writer's
    // batch for a run (a cycle there failed finishes after 1 s).
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 8).await;
    let mentions: Vec<String> = (0..8).map(|i| fx.mention(i)).collect();
    fx.define(
        "both",
        &json!({"name": "both", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} report", mentions.join(" "))}]}),
    )
    .await;
    for round in 0..3 {
        let runs = [
            start_run(&relay, &fx.owner, "both", json!({"r": round, "n": 1})).await,
            start_run(&relay, &fx.owner, "both", json!({"r": round, "n": 2})).await,
        ];
        let mut claimed = Vec::new();
        for a in &fx.agents {
            for _ in 0..2 {
                claimed.push((a.clone(), claim_when_due(&relay, a, json!({})).await));
            }
        }
        // Opposite orders for half of the agents.
        claimed.sort_by_key(|(a, d)| {
            (d["run_id"].as_str().unwrap() == runs[0]) ^ (a.public_key().to_hex() < hex(&fx.agents[4]))
        });
        let finishes = claimed.iter().map(|(agent, d)| {
            let body = json!({"claim_token": d["claim_token"], "outcome": "delivered",
                              "reply": reply(agent, "ops", "done")});
            let relay = &relay;
            async move { finish(relay, agent, d["id"].as_str().unwrap(), &body).await }
        });
        let answers = futures_util::future::join_all(finishes).await;
        assert!(answers.iter().all(|(status, _)| *status == 200), "{answers:?}");
        for run_id in &runs {
            let run = run_until(&relay, &fx.owner, run_id, 10, ended).await;
            assert_eq!(run["status"], "completed", "{run}");
        }
    }
}

/// A condition whose values grow with the run's data (a string doubled
/// per link of a chain) is refused as it runs, once its evaluation passes
/// its budget: the run fails visibly with `condition_error: too large`,
/// and the relay goes on serving. The same definition with a small body
/// completes.
async fn a_condition_that_grows_without_bound_fails_its_run(backend: Backend) {
    let relay = Relay::start_opts(&backend, options());
    let mut fx = Fixture::new(&relay, "ops", 0).await;
    let grow = "[trigger.body.s].map(x, x + x + x + x + x + x + x + x)\
                .map(x, x + x + x + x + x + x + x + x).size() > 0";
    let def = json!({"name": "grow", "trigger": {"on": "manual"}, "steps": [
        {"id": "a", "action": "send_message", "text": "grew", "if": grow}]});
    fx.define("grow", &def).await;
    let small = start_run(&relay, &fx.owner, "grow", json!({"s": "ab"})).await;
    let run = run_until(&relay, &fx.owner, &small, 10, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let started = std::time::Instant::now();
    let large = start_run(&relay, &fx.owner, "grow", json!({"s": "a".repeat(512 * 1024)})).await;
    let run = run_until(&relay, &fx.owner, &large, 10, ended).await;
    eprintln!(
        "a 512 KiB body through the growing condition: failed after {:?}",
        started.elapsed()
    );
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "condition_error", "{run}");
    let message = run["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("too large"), "{run}");
    // The relay still answers.
    fx.post("still here").await;
}
