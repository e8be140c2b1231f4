//! `ask_agent` answers with a shape (`output`): checked at finish, sent
//! back for revision with the errors quoted, typed for the steps after;
//! with the real agent (exec handler) and through the delivery API, on
//! every backend.

use nostr::prelude::{Event, Keys};
use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::workflow::{
    claim_when_due, deliveries, ended, finish, relay_messages, run_until, start_run, Fixture,
};
use tests::{backend_tests, event, Backend, Relay, RelayOptions};

backend_tests!(
    an_answer_that_fits_gives_typed_fields,
    an_answer_that_does_not_fit_is_revised_by_the_agent,
    answers_that_never_fit_fail_the_step_at_the_cap,
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

/// A manual workflow: ask agent 0 for a triage with a shape, then page
/// only when the typed severity says so, quoting the typed fields.
fn triage(fx: &Fixture, revise: u8) -> Value {
    json!({"name": "triage", "trigger": {"on": "manual"}, "steps": [
        {"id": "triage", "action": "ask_agent", "revise": revise,
         "text": format!("{} triage: {{{{trigger.body.text}}}}", fx.mention(0)),
         "output": {"type": "object", "required": ["severity", "score"], "properties": {
             "severity": {"type": "string", "enum": ["low", "high"]},
             "score": {"type": "integer"},
             "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}}},
        {"id": "page", "action": "send_message", "if": "steps.triage.output.severity == 'high' && steps.triage.output.score > 5",
         "text": "Paging: {{steps.triage.output.severity}} ({{steps.triage.output.score}})"}]})
}

/// An exec handler script: prints `first` on the step's own message and
/// `revised` on a revision, and keeps what it was given on stdin.
fn script(relay: &Relay, first: &str, revised: &str) -> String {
    let dir = relay.store.dir.path();
    let path = dir.join("answer.sh");
    let seen = dir.join("seen");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ninput=$(cat)\nprintf '%s\\n' \"$input\" >> {seen}\n\
             case \"$input\" in *'\"revision\":0'*) printf '%b\\n' '{first}' ;; *) printf '%b\\n' '{revised}' ;; esac\n",
            seen = seen.display()
        ),
    )
    .unwrap();
    format!(
        "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 10",
        path.display()
    )
}

/// What the handler was given, one JSON a turn.
fn seen(relay: &Relay) -> Vec<Value> {
    let text = std::fs::read_to_string(relay.store.dir.path().join("seen")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("stdin json"))
        .collect()
}

async fn an_answer_that_fits_gives_typed_fields(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let handler = script(
        &relay,
        r#"```json\n{"severity": "high", "score": 7, "note": "x"}\n```"#,
        "{}",
    );
    let agent = AgentProc::start(&relay, &fx.agents[0], &fx.owner, &handler, "");
    agent.wait_subscribed().await;
    fx.define("triage", &triage(&fx, 2)).await;
    let run_id = start_run(&relay, &fx.owner, "triage", json!({"text": "db down"})).await;
    let run = run_until(&relay, &fx.owner, &run_id, 30, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let output = &run["steps"][0]["output"];
    assert_eq!(
        (&output["severity"], &output["score"]),
        (&json!("high"), &json!(7)),
        "{run}"
    );
    assert!(
        output.get("note").is_none(),
        "only the schema's properties: {output}"
    );
    assert_eq!(run["steps"][1]["status"], "done", "{run}");
    let msgs = relay_messages(&relay, &fx).await;
    assert!(msgs.iter().any(|m| m.content == "Paging: high (7)"), "{msgs:?}");
    // The agent was handed the shape with the delivery.
    let input = &seen(&relay)[0]["messages"][0];
    assert_eq!(input["revision"], 0);
    assert_eq!(
        input["output"]["properties"]["severity"]["enum"],
        json!(["low", "high"])
    );
    let row = &deliveries(&relay)[0];
    assert_eq!(
        (&row["status"], &row["attempt"]),
        (&json!("delivered"), &json!(1)),
        "{row}"
    );
}

async fn an_answer_that_does_not_fit_is_revised_by_the_agent(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let handler = script(
        &relay,
        r#"{"severity": "urgent", "score": 9}"#,
        r#"{"severity": "high", "score": 9}"#,
    );
    let agent = AgentProc::start(&relay, &fx.agents[0], &fx.owner, &handler, "");
    agent.wait_subscribed().await;
    fx.define("triage", &triage(&fx, 2)).await;
    let run_id = start_run(&relay, &fx.owner, "triage", json!({"text": "db down"})).await;
    let run = run_until(&relay, &fx.owner, &run_id, 30, ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["steps"][0]["output"]["severity"], "high", "{run}");
    assert_eq!(run["steps"][1]["status"], "done", "{run}");
    // One revision message: the step's text, then the error quoted.
    let msgs = relay_messages(&relay, &fx).await;
    let revisions: Vec<&Event> = msgs
        .iter()
        .filter(|m| m.content.contains("Revision 1 of 2"))
        .collect();
    assert_eq!(revisions.len(), 1, "{msgs:?}");
    let revision = revisions[0];
    assert!(revision.content.starts_with("nostr:") && revision.content.contains("triage: db down\n\n---\n"));
    assert!(revision.content.contains("/severity"), "{}", revision.content);
    let tag = |name: &str| -> Vec<String> {
        revision
            .tags
            .iter()
            .filter(|t| t.kind() == name)
            .filter_map(|t| t.content().map(String::from))
            .collect()
    };
    assert_eq!(tag("workflow-revision"), ["1"]);
    assert_eq!(tag("workflow-run"), std::slice::from_ref(&run_id));
    // The row: revised once, its first attempt ended output_invalid.
    let row = deliveries(&relay).into_iter().next().unwrap();
    assert_eq!(
        (&row["status"], &row["attempt"]),
        (&json!("delivered"), &json!(2)),
        "{row}"
    );
    assert_eq!(row["message_event_id"], revision.id.to_hex(), "{row}");
    let shown: Value =
        serde_json::from_str(&relay.cli(&["deliveries", "show", row["id"].as_str().unwrap()])).unwrap();
    assert_eq!(shown["attempts"][0]["outcome"], "output_invalid", "{shown}");
    assert_eq!(shown["attempts"][1]["outcome"], "delivered", "{shown}");
    // The refused answer stays visible in the thread, the revision replies to it.
    let refused_answer = relay_messages_by(&relay, &fx, &fx.agents[0]).await;
    let first = refused_answer
        .iter()
        .find(|e| e.content.contains("urgent"))
        .expect("refused answer kept");
    assert!(tag("e").contains(&first.id.to_hex()), "{:?}", revision.tags);
    // The handler saw the revision with the errors, and the shape again.
    let turns = seen(&relay);
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert_eq!(turns[1]["messages"][0]["revision"], 1);
    assert!(turns[1]["messages"][0]["text"]
        .as_str()
        .unwrap()
        .contains("/severity"));
}

/// The kind 9s `author` posted in the fixture's channel.
async fn relay_messages_by(relay: &Relay, fx: &Fixture, author: &Keys) -> Vec<Event> {
    let mut c = tests::Client::connect(&relay.ws_url()).await;
    c.req(
        "m",
        vec![json!({"kinds": [9], "#h": [fx.channel], "authors": [author.public_key().to_hex()]})],
    )
    .await
    .events()
}

async fn answers_that_never_fit_fail_the_step_at_the_cap(backend: Backend) {
    let relay = start(&backend);
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("triage", &triage(&fx, 1)).await;
    let run_id = start_run(&relay, &fx.owner, "triage", json!({"text": "db down"})).await;
    let agent = fx.agents[0].clone();
    let answer = |text: &str| event(&agent, 9, text, &[&["h", "ops"]]);
    // The step's message: a reply that is not JSON is refused, committed.
    let d = claim_when_due(&relay, &agent, json!({})).await;
    assert_eq!(d["revision"], 0);
    assert_eq!(d["output"]["required"], json!(["severity", "score"]));
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": answer("looks bad")});
    let id = d["id"].as_str().unwrap();
    let (status, v) = finish(&relay, &agent, id, &body).await;
    assert_eq!(
        (status, v["error"].as_str()),
        (422, Some("output_invalid")),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("not JSON"), "{v}");
    // The same finish again gets the same refusal, and changes nothing.
    let (status, v) = finish(&relay, &agent, id, &body).await;
    assert_eq!(
        (status, v["error"].as_str()),
        (422, Some("output_invalid")),
        "{v}"
    );
    // Revision 1 (the last): claimable once the step posted it.
    let d = claim_when_due(&relay, &agent, json!({})).await;
    assert_eq!((d["id"].as_str(), &d["revision"]), (Some(id), &json!(1)), "{d}");
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered",
                      "reply": answer(r#"{"severity": "low"}"#)});
    let (status, v) = finish(&relay, &agent, id, &body).await;
    assert_eq!(
        (status, v["error"].as_str()),
        (422, Some("output_invalid")),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("score"), "{v}");
    // No revision left: the row fails output_invalid, and the step with it.
    let run = run_until(&relay, &fx.owner, &run_id, 30, ended).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "agent_failed", "{run}");
    let row = deliveries(&relay).into_iter().next().unwrap();
    assert_eq!(
        (&row["status"], &row["failure_code"]),
        (&json!("failed"), &json!("output_invalid")),
        "{row}"
    );
    let msgs = relay_messages(&relay, &fx).await;
    assert!(
        msgs.iter()
            .any(|m| m.content.contains("could not be delivered") && m.content.ends_with("output_invalid")),
        "the failure notice: {msgs:?}"
    );
    assert_eq!(
        msgs.iter().filter(|m| m.content.contains("Revision ")).count(),
        1,
        "{msgs:?}"
    );
}
