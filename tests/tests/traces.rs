//! One trace per run (W3C Trace Context): the run's trace id, the
//! `traceparent` its webhook calls send and its deliveries hand to the
//! agent (the real agent passes it to an `exec` handler), on every
//! backend, and the same after the relay is killed mid-run.

use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::hooks::{Answer, HookServer};
use tests::workflow::{ended, run_until, start_run, Fixture};
use tests::{backend_tests, Backend, Relay, RelayOptions};

backend_tests!(a_run_is_one_trace_through_its_calls_and_deliveries);

const FAST: &str = "[deliveries]\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\n\
[webhooks]\ncall_grace_secs = 1\n[communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n";

/// The trace id and span id of a `traceparent`, checked for its form.
fn parts(traceparent: &str) -> (String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    assert_eq!((p[0], p[3]), ("00", "01"), "{traceparent}");
    assert!(p[1].len() == 32 && p[2].len() == 16, "{traceparent}");
    (p[1].to_string(), p[2].to_string())
}

async fn a_run_is_one_trace_through_its_calls_and_deliveries(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/call", Answer::json(200, json!({"ok": true})));
    let mut relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: FAST.into(),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let seen = relay.store.dir.path().join("trace");
    let script = relay.store.dir.path().join("trace.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat > {s}.stdin\nprintf '%s' \"$TRACEPARENT\" > {s}.env\necho ok\n",
            s = seen.display()
        ),
    )
    .unwrap();
    let handler = format!(
        "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 10",
        script.display()
    );
    let agent = AgentProc::start(&relay, &fx.agents[0], &fx.owner, &handler, "");
    agent.wait_subscribed().await;
    fx.define(
        "traced",
        &json!({"name": "traced", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} look", fx.mention(0))},
            {"id": "call", "action": "call_webhook", "url": server.url("/call"), "body": {"n": 1}},
            {"id": "pause", "action": "delay", "secs": 2},
            {"id": "again", "action": "call_webhook", "url": server.url("/call"), "body": {"n": 2}}]}),
    )
    .await;
    let run_id = start_run(&relay, &fx.owner, "traced", json!({})).await;
    // Killed while the run sleeps: the trace outlives the process.
    let waiting = run_until(&relay, &fx.owner, &run_id, 30, |r| {
        r["status"] == "waiting" && r["current_step"] == 2
    })
    .await;
    relay.kill();
    relay.restart();
    let run = run_until(&relay, &fx.owner, &run_id, 30, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let trace = run["trace_id"].as_str().expect("a trace id").to_string();
    assert_eq!(waiting["trace_id"], json!(trace));
    assert!(trace.len() == 32 && trace != "0".repeat(32), "{trace}");
    // Both calls, before and after the kill, carry the run's trace, each
    // with its own span.
    let calls = server.received("/call");
    assert_eq!(calls.len(), 2, "{calls:?}");
    let spans: Vec<(String, String)> = calls
        .iter()
        .map(|c| parts(c.header("traceparent").expect("traceparent")))
        .collect();
    assert!(spans.iter().all(|(t, _)| *t == trace), "{spans:?}");
    assert_ne!(spans[0].1, spans[1].1);
    // The delivery's span reached the agent's handler, in its environment
    // and on stdin.
    let env = std::fs::read_to_string(seen.with_extension("env")).unwrap();
    let stdin: Value =
        serde_json::from_str(&std::fs::read_to_string(seen.with_extension("stdin")).unwrap()).unwrap();
    assert_eq!(stdin["messages"][0]["traceparent"], json!(env), "{stdin}");
    let (t, span) = parts(&env);
    assert_eq!(t, trace);
    assert!(spans.iter().all(|(_, s)| *s != span));
    // Another run is another trace.
    let other = start_run(&relay, &fx.owner, "traced", json!({})).await;
    let other = run_until(&relay, &fx.owner, &other, 30, |r| r["trace_id"].is_string()).await;
    assert_ne!(other["trace_id"], json!(trace));
}
