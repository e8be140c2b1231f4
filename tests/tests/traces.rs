//! One trace per run (W3C Trace Context): the run's trace id, the
//! `traceparent` its webhook calls send and its deliveries hand to the
//! agent (the real agent passes it to an `exec` handler), and the spans
//! exported over OTLP to a collector the test runs, on every backend, the
//! same before and after the relay is killed mid-run.

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

/// The spans the collector received so far.
fn spans(collector: &HookServer) -> Vec<Value> {
    let mut out = Vec::new();
    for request in collector.received("/v1/traces") {
        let body = request.json();
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            assert!(
                resource["resource"].to_string().contains("\"relay\""),
                "service name: {resource}"
            );
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                out.extend(scope["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    out
}

/// Waits (20 s) for a span named `name`; returns it.
async fn span_named(collector: &HookServer, name: &str) -> Value {
    for _ in 0..200 {
        if let Some(s) = spans(collector).into_iter().find(|s| s["name"] == name) {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no span {name:?}: {:?}", spans(collector));
}

async fn a_run_is_one_trace_through_its_calls_and_deliveries(backend: Backend) {
    let server = HookServer::start().await;
    server.answer("/call", Answer::json(200, json!({"ok": true})));
    let collector = HookServer::start().await;
    collector.answer("/v1/traces", Answer::json(200, json!({})));
    let config = format!("otlp_endpoint = \"{}\"\n{FAST}", collector.url("/v1/traces"));
    let mut relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: config,
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
    // What this process ended is exported before it dies.
    span_named(&collector, "step call").await;
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
    let sent: Vec<(String, String)> = calls
        .iter()
        .map(|c| parts(c.header("traceparent").expect("traceparent")))
        .collect();
    assert!(sent.iter().all(|(t, _)| *t == trace), "{sent:?}");
    assert_ne!(sent[0].1, sent[1].1);
    // The delivery's span reached the agent's handler, in its environment
    // and on stdin.
    let env = std::fs::read_to_string(seen.with_extension("env")).unwrap();
    let stdin: Value =
        serde_json::from_str(&std::fs::read_to_string(seen.with_extension("stdin")).unwrap()).unwrap();
    assert_eq!(stdin["messages"][0]["traceparent"], json!(env), "{stdin}");
    let (t, span) = parts(&env);
    assert_eq!(t, trace);
    assert!(sent.iter().all(|(_, s)| *s != span));
    // The spans: one trace, the run at its root, each step under it, each
    // call and the delivery under their step, the claim and the finish
    // under the delivery; from both processes.
    let run_span = span_named(&collector, "run traced").await;
    let all: Vec<Value> = spans(&collector)
        .into_iter()
        .filter(|s| s["traceId"] == json!(trace))
        .collect();
    let named = |name: &str| -> Vec<&Value> { all.iter().filter(|s| s["name"] == name).collect() };
    let id = |s: &Value| s["spanId"].as_str().unwrap().to_string();
    let parent = |s: &Value| s["parentSpanId"].as_str().unwrap_or_default().to_string();
    assert_eq!(parent(&run_span), "", "the run is the root");
    for step in ["ask", "call", "pause", "again"] {
        let found = named(&format!("step {step}"));
        assert_eq!(found.len(), 1, "step {step} once: {all:?}");
        assert_eq!(parent(found[0]), id(&run_span), "step {step} under the run");
    }
    let calls: Vec<&Value> = all
        .iter()
        .filter(|s| s["name"].as_str().unwrap().starts_with("call "))
        .collect();
    assert_eq!(calls.len(), 2, "{all:?}");
    for c in &calls {
        assert!(
            sent.iter().any(|(_, s)| *s == id(c)),
            "a call span is the traceparent it sent: {c}"
        );
        let step = named(&format!(
            "step {}",
            c["name"].as_str().unwrap().trim_start_matches("call ")
        ))[0];
        assert_eq!(parent(c), id(step));
    }
    let delivery = all
        .iter()
        .find(|s| s["name"].as_str().unwrap().starts_with("delivery "))
        .expect("the delivery's span");
    assert_eq!(
        id(delivery),
        span,
        "the delivery span is the one the agent was handed"
    );
    assert_eq!(parent(delivery), id(named("step ask")[0]));
    for what in ["claim ", "finish "] {
        let s = all
            .iter()
            .find(|s| s["name"].as_str().unwrap().starts_with(what))
            .expect(what);
        assert_eq!(parent(s), span, "{what} under the delivery");
    }
    // Another run is another trace.
    let other = start_run(&relay, &fx.owner, "traced", json!({})).await;
    let other = run_until(&relay, &fx.owner, &other, 30, |r| r["trace_id"].is_string()).await;
    assert_ne!(other["trace_id"], json!(trace));
}
