//! The dashboard (`/ui`) in headless Chromium, signed in through an
//! injected NIP-07 signer: an owner sees a run's timeline after a real
//! agent answered and retries a failed delivery until it is delivered; an
//! admin sees the community and bans a pubkey; a stranger sees nothing
//! but the sign-in; a run reads as a timeline (the agent's reply as a
//! message, a webhook's request and answer, why a step was skipped, an
//! error in words). Every page passes axe-core's WCAG 2 A/AA rules with
//! no serious or critical violation. Each page is photographed
//! (docs/screenshots with UPDATE_SCREENSHOTS=1).

use std::time::Duration;

use nostr::prelude::{Keys, ToBech32};
use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::browser::Browser;
use tests::hooks::{Answer, HookServer};
use tests::workflow::{api, claim_when_due, finish, rpc, run_until, start_run, Fixture};
use tests::{event, Backend, Relay, RelayOptions};

const FAST: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\nschedule_poll_interval_ms = 200\n";

fn ask(fx: &Fixture, agent: usize, text: &str) -> Value {
    json!({"name": text, "trigger": {"on": "manual"}, "steps": [
        {"id": "ask", "action": "ask_agent", "text": format!("{} {text}", fx.mention(agent))},
        {"id": "say", "action": "send_message", "text": "agent said: {{steps.ask.output.reply}}"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_for_an_owner_an_admin_and_a_stranger() {
    if !tests::browser::available() || !tests::node::available() {
        eprintln!("skipped: no chromium/chromedriver or node here (CI installs them)");
        return;
    }
    let admin = Keys::generate();
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            config_toml: format!(
                "name = \"Ops relay\"\n{FAST}[communities.default]\nadmins = [\"{}\"]\n",
                admin.public_key().to_hex()
            ),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    // Agent 0 is a real agent process; agent 1 is played by the test.
    let real = AgentProc::start(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"", "");
    real.wait_subscribed().await;
    fx.define("triage", &ask(&fx, 0, "is the build green?")).await;
    fx.define("flaky", &ask(&fx, 1, "restart the runner")).await;
    let answered = start_run(&relay, &fx.owner, "triage", json!({})).await;
    let run = run_until(&relay, &fx.owner, &answered, 20, tests::workflow::ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    let flaky_run = start_run(&relay, &fx.owner, "flaky", json!({})).await;
    let d = claim_when_due(&relay, &fx.agents[1], json!({})).await;
    let failed_id = d["id"].as_str().unwrap().to_string();
    let body = json!({"claim_token": d["claim_token"], "outcome": "failed", "failure_code": "runner_offline",
                      "failure_message": "the CI runner did not answer"});
    assert_eq!(finish(&relay, &fx.agents[1], &failed_id, &body).await.0, 200);
    run_until(&relay, &fx.owner, &flaky_run, 20, |r| r["status"] == "failed").await;
    let ui = format!("{}/ui", relay.http_url());

    // The owner: overview, workflows, the answered run's timeline.
    let mut b = Browser::start().await;
    b.sign_in_as(&ui, &fx.owner).await;
    b.wait_for("#who[data-role=owner]").await;
    b.wait_text("#d-delivered .n", "1").await;
    b.wait_text("#d-failed .n", "1").await;
    // Signing in fetched the overview twice in a second (the sign-in's
    // check, then the page): neither was refused.
    assert_eq!(b.page_errors().await, Vec::<String>::new());
    b.screenshot("overview").await;
    b.show("#/workflows").await;
    b.wait_for("tr[data-workflow=triage]").await;
    b.wait_for("tr[data-workflow=flaky]").await;
    b.screenshot("workflows").await;
    b.show(&format!("#/run/{answered}")).await;
    b.wait_for("#steps li[data-step=ask] [data-status=done]").await;
    b.wait_for("#steps li[data-step=say] [data-status=done]").await;
    // Each ended step says how long it took.
    b.wait_text("#steps li[data-step=ask] .took", "took ").await;
    // The page reads the message and the agent's reply over the relay's
    // WebSocket (NIP-42 signed by the same signer).
    b.wait_text("#messages", "echo: ").await;
    b.screenshot("run").await;

    // Retry the failed delivery from the page; the agent answers; the page
    // shows it delivered without a reload.
    b.show("#/deliveries?status=failed").await;
    b.wait_for(&format!("tr[data-delivery='{failed_id}'] [data-status=failed]"))
        .await;
    b.screenshot("deliveries").await;
    // From the keyboard: the confirmation takes the focus on Cancel, and
    // Escape closes it without acting.
    b.click(&format!("#retry-{failed_id}")).await;
    b.wait_for("#confirm:not([hidden])").await;
    let focused = b
        .client
        .execute("return document.activeElement.id;", vec![])
        .await
        .unwrap();
    assert_eq!(focused, json!("confirm-no"));
    b.client
        .active_element()
        .await
        .unwrap()
        .send_keys("\u{e00c}")
        .await
        .unwrap();
    b.wait_for("#confirm[hidden]").await;
    b.wait_for(&format!("tr[data-delivery='{failed_id}'] [data-status=failed]"))
        .await;
    b.click(&format!("#retry-{failed_id}")).await;
    b.click("#confirm-yes").await;
    b.show(&format!("#/delivery/{failed_id}")).await;
    b.wait_for("#delivery-status [data-status=pending]").await;
    let d = claim_when_due(&relay, &fx.agents[1], json!({})).await;
    assert_eq!(d["id"], failed_id.as_str());
    let reply = event(&fx.agents[1], 9, "runner restarted", &[&["h", "ops"]]);
    let body = json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply});
    assert_eq!(finish(&relay, &fx.agents[1], &failed_id, &body).await.0, 200);
    b.wait_for("#delivery-status [data-status=delivered]").await;
    b.wait_text("#attempts", "runner_offline").await;
    b.screenshot("delivery").await;
    audit(&b, "a delivery").await;
    let run = run_until(&relay, &fx.owner, &flaky_run, 20, tests::workflow::ended).await;
    assert_eq!(
        run["status"], "completed",
        "the retried delivery let its run go on: {run}"
    );
    // The relay's notice names the owner.
    b.show("#/").await;
    b.wait_text(
        "#notices",
        &format!("retried by {}", fx.owner.public_key().to_hex()),
    )
    .await;
    // An approval waits on its run's page: the request's text and who may
    // decide; the owner approves from the page (a reaction signed through
    // NIP-07) and the run goes on.
    fx.define(
        "gate",
        &json!({"name": "gate", "trigger": {"on": "manual"}, "steps": [
            {"id": "ok", "action": "request_approval", "text": "ship the release?"},
            {"id": "after", "action": "send_message", "text": "shipped"}]}),
    )
    .await;
    let gated = start_run(&relay, &fx.owner, "gate", json!({})).await;
    run_until(&relay, &fx.owner, &gated, 20, |r| r["status"] == "waiting").await;
    b.show(&format!("#/run/{gated}")).await;
    b.wait_text(".approval blockquote", "ship the release?").await;
    let owner_npub = fx.owner.public_key().to_bech32().unwrap();
    b.wait_text(".approval", &owner_npub[..14]).await;
    b.screenshot("approval").await;
    audit(&b, "an approval").await;
    b.click("#approve").await;
    b.wait_for("#run-status [data-status=completed]").await;
    let run = run_until(&relay, &fx.owner, &gated, 20, tests::workflow::ended).await;
    assert_eq!(run["steps"][0]["output"]["decision"], "approved", "{run}");
    assert_eq!(
        run["steps"][0]["output"]["by"],
        fx.owner.public_key().to_hex().as_str()
    );
    assert_eq!(b.page_errors().await, Vec::<String>::new());
    b.close().await;

    // The admin: the community's agents and channels; a ban.
    let mut b = Browser::start().await;
    b.sign_in_as(&ui, &admin).await;
    b.wait_for("#who[data-role=admin]").await;
    // People by their kind 0 name, else by npub: agent 0's profile is
    // published now, the owner has none.
    let mut c = tests::Client::connect(&relay.ws_url()).await;
    c.auth(&fx.agents[0]).await;
    const PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let bot = format!(r#"{{"name":"Build Bot","picture":"{PNG}"}}"#);
    c.publish_ok(&event(&fx.agents[0], 0, &bot, &[])).await;
    let mut c1 = tests::Client::connect(&relay.ws_url()).await;
    c1.auth(&fx.agents[1]).await;
    let runner = r#"{"name":"runner","picture":"https://pictures.example/runner.png"}"#;
    c1.publish_ok(&event(&fx.agents[1], 0, runner, &[])).await;
    // Agent 0 takes mentions in ops (its owner said so); agent 1's are off.
    let on = json!([fx.agents[0].public_key().to_hex(), true, "ops"]);
    tests::workflow::ok(tests::workflow::rpc(&relay, &fx.owner, "setmentions", on).await);
    b.show("#/agents").await;
    b.wait_text("main table", "Build Bot").await;
    // A picture carried in the profile is shown; one elsewhere is not
    // fetched: the name's initial instead.
    let (a0, a1) = (
        fx.agents[0].public_key().to_hex(),
        fx.agents[1].public_key().to_hex(),
    );
    let img = b
        .wait_for(&format!("tr[data-agent='{a0}'] td:first-child img.avatar"))
        .await;
    assert_eq!(img.attr("src").await.unwrap().as_deref(), Some(PNG));
    b.wait_text(&format!("tr[data-agent='{a1}'] td:first-child .avatar"), "R")
        .await;
    b.wait_text(&format!("tr[data-agent='{a0}'] td:nth-child(6)"), "ops")
        .await;
    b.wait_text(&format!("tr[data-agent='{a1}'] td:nth-child(6)"), "off")
        .await;
    let external = b
        .client
        .execute(
            "return document.querySelectorAll('img:not([src^=\"data:\"])').length;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(external, json!(0));
    let npub = fx.owner.public_key().to_bech32().unwrap();
    b.wait_text("main table", &npub[..14]).await;
    b.screenshot("agents").await;
    assert_eq!(b.page_errors().await, Vec::<String>::new());
    b.show("#/channels").await;
    b.wait_text("main table", "ops").await;
    b.screenshot("channels").await;
    b.show("#/bans").await;
    let spammer = Keys::generate().public_key().to_hex();
    b.wait_for("#ban-pubkey").await.send_keys(&spammer).await.unwrap();
    b.wait_for("#ban-reason").await.send_keys("spam").await.unwrap();
    b.click("#ban").await;
    b.click("#confirm-yes").await;
    b.wait_text("#banned", &spammer).await;
    b.wait_text("#flash", "Done: ban").await;
    b.screenshot("bans").await;
    audit(&b, "the bans").await;
    let listed = rpc(&relay, &admin, "listbannedpubkeys", json!([])).await;
    assert_eq!(listed.1["result"][0]["pubkey"], spammer.as_str(), "{listed:?}");
    // Readable at a phone's width: nothing wider than the screen.
    b.client.set_window_size(390, 844).await.unwrap();
    b.show("#/").await;
    assert_fits_the_screen(&b, "the overview").await;
    b.screenshot("overview-phone").await;
    audit(&b, "the overview at a phone's width").await;
    b.close().await;

    // A stranger: the sign-in, and nothing of the community.
    let stranger = Keys::generate();
    let mut b = Browser::start().await;
    b.sign_in_as(&ui, &stranger).await;
    b.wait_text("#signin-error", "does not manage this community")
        .await;
    let shown = b
        .client
        .execute(
            "return [document.getElementById('nav').hidden, document.querySelectorAll('main table').length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(shown, json!([true, 0]));
    b.screenshot("signin-stranger").await;
    audit(&b, "the sign-in").await;
    b.close().await;
    let (status, v) = api(&relay, &stranger, "GET", "/overview", None).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("restricted")), "{v}");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// `relayctl` signed with `keys` against `relay`: (success, stdout then stderr).
fn relayctl(relay: &Relay, keys: &Keys, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(tests::workspace_bin("relayctl"))
        .args(args)
        .env("RELAYCTL_KEY", keys.secret_key().to_secret_hex())
        .env("RELAYCTL_URL", relay.http_url())
        .output()
        .expect("run relayctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text + &String::from_utf8_lossy(&out.stderr))
}

/// Nothing on the page is wider than the window (at a phone's width).
async fn assert_fits_the_screen(b: &Browser, page: &str) {
    let fits = b
        .client
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(fits, json!(true), "{page} overflows a phone's width");
}

/// No serious or critical accessibility violation on the page as drawn.
async fn audit(b: &Browser, page: &str) {
    let found = b.accessibility().await;
    assert_eq!(found, Vec::<String>::new(), "axe-core on {page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reads_as_a_timeline() {
    if !tests::browser::available() || !tests::node::available() {
        eprintln!("skipped: no chromium/chromedriver or node here (CI installs them)");
        return;
    }
    let hook = HookServer::start().await;
    hook.answer(
        "/ticket",
        Answer::json(200, json!({"ticket": 42, "queue": "ops"})),
    );
    hook.answer("/down", Answer::json(503, json!({"error": "maintenance"})));
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            config_toml: format!("{FAST}[communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n"),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    let agent = AgentProc::start(&relay, &fx.agents[0], &fx.owner, "type = \"echo\"", "");
    agent.wait_subscribed().await;
    let base = format!("http://{}", hook.addr);
    fx.define(
        "ticket",
        &json!({"name": "ticket", "trigger": {"on": "manual"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} summarize the outage", fx.mention(0))},
            {"id": "file", "action": "call_webhook", "url": format!("{base}/ticket"),
             "body": {"summary": "{{steps.ask.output.reply}}"}},
            {"id": "page", "action": "send_message", "text": "paging: no ticket",
             "if": "steps.file.output.status != 200 && trigger.text != ''"}]}),
    )
    .await;
    fx.define(
        "broken",
        &json!({"name": "broken", "trigger": {"on": "manual"}, "steps": [
            {"id": "file", "action": "call_webhook", "url": format!("{base}/down")}]}),
    )
    .await;
    let ok = start_run(&relay, &fx.owner, "ticket", json!({})).await;
    let run = run_until(&relay, &fx.owner, &ok, 20, tests::workflow::ended).await;
    assert_eq!(run["status"], "completed", "{run}");
    // The API says why the step was skipped, and what the call was.
    let (_, shown) = tests::workflow::get_run(&relay, &fx.owner, &ok).await;
    assert_eq!(
        shown["steps"][2]["skipped"],
        json!({"condition": "steps.file.output.status != 200 && trigger.text != ''",
               "inputs": [{"path": "steps.file.output.status", "value": 200},
                          {"path": "trigger.text", "value": null}]}),
        "{shown}"
    );
    let call = &shown["steps"][1]["call"];
    assert_eq!(
        (&call["phase"], &call["method"], &call["status"]),
        (&json!("answered"), &json!("POST"), &json!(200)),
        "{shown}"
    );
    assert_eq!(call["url"], format!("{base}/ticket"));
    assert!(call["request"].as_str().unwrap().contains("echo: "), "{call}");
    let bad = start_run(&relay, &fx.owner, "broken", json!({})).await;
    let run = run_until(&relay, &fx.owner, &bad, 20, tests::workflow::ended).await;
    assert_eq!(run["error"]["code"], "http_503", "{run}");
    // relayctl says the same.
    let (ok_, out) = relayctl(&relay, &fx.owner, &["runs", "show", &ok]);
    assert!(ok_, "{out}");
    assert!(
        out.contains(
            "skipped page: `steps.file.output.status != 200 && trigger.text != ''` was false; \
             it read steps.file.output.status = 200, trigger.text = absent"
        ),
        "{out}"
    );
    assert!(out.contains(&format!("call file: POST {base}/ticket (")), "{out}");
    assert!(out.contains("HTTP 200, 27 B"), "{out}");
    let (_, out) = relayctl(&relay, &fx.owner, &["workflow", "show", "broken"]);
    assert!(
        out.contains("0% of the last 1 completed (1 failed, 0 cancelled)"),
        "{out}"
    );

    let mut b = Browser::start().await;
    b.sign_in_as(&format!("{}/ui", relay.http_url()), &fx.owner).await;
    b.wait_for("#who[data-role=owner]").await;
    // The recorder behind every `page_errors` check sees what a console
    // would: an uncaught exception (one thrown by a script the test
    // injects reaches the page as "Script error.": the browser hides the
    // text of what it did not load itself), console.error, a CSP refusal.
    b.client
        .execute(
            "setTimeout(() => { throw new Error('probe one'); });\
             console.error('probe two');\
             const s = document.createElement('script');\
             s.src = 'https://elsewhere.example/x.js';\
             document.body.append(s);",
            vec![],
        )
        .await
        .unwrap();
    for _ in 0..100 {
        if b.page_errors().await.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let probes = b.page_errors().await.join("\n");
    for needle in [
        "Script error",
        "probe two",
        "CSP refused https://elsewhere.example",
    ] {
        assert!(probes.contains(needle), "{needle} not recorded: {probes}");
    }
    b.clear_page_errors().await;
    audit(&b, "the overview").await;
    b.show(&format!("#/run/{ok}")).await;
    // The agent's answer as a message, under its npub.
    b.wait_text("#steps li[data-step=ask] .replies blockquote", "echo: ")
        .await;
    let npub = fx.agents[0].public_key().to_bech32().unwrap();
    b.wait_text("#steps li[data-step=ask] .replies", &npub[..14])
        .await;
    // The webhook's request and answer.
    b.wait_text("#steps li[data-step=file] .call", &format!("POST {base}/ticket"))
        .await;
    b.wait_text("#steps li[data-step=file] .answer", "HTTP 200").await;
    // Why the last step was skipped: its condition and what it read.
    b.wait_text("#steps li[data-step=page] .skip", "was false for this run")
        .await;
    b.wait_text(
        "#steps li[data-step=page] .inputs [data-path='steps.file.output.status']",
        "= 200",
    )
    .await;
    audit(&b, "a completed run").await;
    b.screenshot("run-timeline").await;
    b.show(&format!("#/run/{bad}")).await;
    b.wait_text(
        "#steps li[data-step=file] .error",
        "The webhook answered HTTP 503.",
    )
    .await;
    b.wait_text("#steps li[data-step=file] .answer", "HTTP 503").await;
    audit(&b, "a failed run").await;
    b.screenshot("run-failed").await;
    // A workflow drawn as its steps and conditions, with how its runs end.
    let (_, w) = api(&relay, &fx.owner, "GET", "/workflows/broken", None).await;
    assert_eq!(
        (
            &w["stats"]["ended"],
            &w["stats"]["failed"],
            &w["stats"]["success_rate"]
        ),
        (&json!(1), &json!(1), &json!(0.0)),
        "{w}"
    );
    b.show("#/workflow/ticket").await;
    b.wait_text("#stats #st-rate", "100%").await;
    b.wait_for("#stats [data-part=completed]").await;
    b.wait_text("#flow .trigger", "manual").await;
    b.wait_text(
        "#flow li[data-step=page] .cond",
        "if steps.file.output.status != 200",
    )
    .await;
    b.wait_text("#flow li[data-step=file] .what", &format!("POST {base}/ticket"))
        .await;
    audit(&b, "a workflow").await;
    b.screenshot("workflow").await;
    // The failed run rerun from its step once the server is fixed: the
    // page opens the rerun, which completes; the origin links to it.
    hook.answer("/down", Answer::json(200, json!({"ticket": 1})));
    b.show(&format!("#/run/{bad}")).await;
    b.wait_text("#rerun-run", "Rerun from file").await;
    b.click("#rerun-run").await;
    b.wait_text("#confirm-text", "from step file").await;
    b.click("#confirm-yes").await;
    b.wait_text("main dl", "rerun of").await;
    b.wait_text("#run-status", "completed").await;
    let (_, origin) = tests::workflow::get_run(&relay, &fx.owner, &bad).await;
    let rerun = origin["rerun_by"].as_str().expect("rerun_by").to_string();
    b.wait_text("main h1", &rerun).await;
    audit(&b, "a rerun").await;
    b.show(&format!("#/run/{bad}")).await;
    b.wait_text("#rerun-by", &rerun).await;
    // Its trace id, as the API says.
    b.wait_text("#trace-id", origin["trace_id"].as_str().expect("trace_id"))
        .await;
    // The channel: the conversation, each workflow message with the state
    // of the delivery it carried, the agent's reply with what it answered.
    b.show("#/channels").await;
    b.click("tr[data-channel=ops] a").await;
    b.wait_text("#chat", "summarize the outage").await;
    let asked = shown["steps"][0]["output"]["event_id"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = shown["steps"][0]["output"]["replies"][0]["event_id"]
        .as_str()
        .unwrap()
        .to_string();
    b.wait_for(&format!(
        "#chat li[data-event='{asked}'] .carried [data-status=delivered]"
    ))
    .await;
    b.wait_text(
        &format!("#chat li[data-event='{reply}'] .answers"),
        "answers delivery",
    )
    .await;
    audit(&b, "a channel").await;
    b.screenshot("channel").await;
    for page in ["#/workflows", "#/deliveries", "#/agents", "#/channels"] {
        b.show(page).await;
        audit(&b, page).await;
    }
    // At a phone's width nothing is wider than the screen (wide tables and
    // bodies scroll inside their own boxes).
    b.client.set_window_size(390, 844).await.unwrap();
    for page in [
        format!("#/run/{ok}"),
        format!("#/run/{bad}"),
        "#/workflow/ticket".to_string(),
        "#/channel/ops".to_string(),
        "#/deliveries".to_string(),
    ] {
        b.show(&page).await;
        assert_fits_the_screen(&b, &page).await;
    }
    b.show(&format!("#/run/{ok}")).await;
    b.screenshot("run-phone").await;
    assert_eq!(b.page_errors().await, Vec::<String>::new());
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_change_what_the_page_shows() {
    if !tests::browser::available() {
        eprintln!("skipped: no chromium/chromedriver here (CI installs them)");
        return;
    }
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            config_toml: FAST.to_string(),
            ..Default::default()
        },
    );
    let mut fx = Fixture::new(&relay, "ops", 1).await;
    fx.define("flaky", &ask(&fx, 0, "restart the runner")).await;
    fx.define(
        "gate",
        &json!({"name": "gate", "trigger": {"on": "manual"}, "steps": [
            {"id": "ok", "action": "request_approval", "text": "ship?"}]}),
    )
    .await;
    // Three deliveries failed by their agent (the test plays it).
    let mut failed = Vec::new();
    for _ in 0..3 {
        let run = start_run(&relay, &fx.owner, "flaky", json!({})).await;
        let d = claim_when_due(&relay, &fx.agents[0], json!({})).await;
        let id = d["id"].as_str().unwrap().to_string();
        let body = json!({"claim_token": d["claim_token"], "outcome": "failed", "failure_code": "offline"});
        assert_eq!(finish(&relay, &fx.agents[0], &id, &body).await.0, 200);
        run_until(&relay, &fx.owner, &run, 20, |r| r["status"] == "failed").await;
        failed.push(id);
    }
    let gated = [
        start_run(&relay, &fx.owner, "gate", json!({})).await,
        start_run(&relay, &fx.owner, "gate", json!({})).await,
    ];
    for run in &gated {
        run_until(&relay, &fx.owner, run, 20, |r| r["status"] == "waiting").await;
    }
    let count = |status: &'static str| {
        let (relay, owner) = (&relay, &fx.owner);
        async move {
            let (_, v) = rpc(relay, owner, "listdeliveries", json!([{"status": status}])).await;
            v["result"].as_array().map_or(0, Vec::len)
        }
    };

    let mut b = Browser::start().await;
    b.sign_in_as(&format!("{}/ui", relay.http_url()), &fx.owner).await;
    b.wait_for("#who[data-role=owner]").await;
    // Retry every failed delivery the filter shows: a count, a confirmation.
    b.show("#/deliveries?status=failed").await;
    b.wait_text("#bulk-retry", "(3)").await;
    b.screenshot("deliveries-bulk").await;
    b.click("#bulk-retry").await;
    b.wait_text("#confirm-text", "Retry the 3 failed").await;
    b.click("#confirm-yes").await;
    b.wait_text("#flash", "Done: 3 of 3 changed").await;
    assert_eq!((count("failed").await, count("pending").await), (0, 3));
    // Then cancel them all.
    b.show("#/deliveries?status=pending").await;
    b.wait_text("#bulk-cancel", "(3)").await;
    b.click("#bulk-cancel").await;
    b.click("#confirm-yes").await;
    b.wait_text("#flash", "Done: 3 of 3 changed").await;
    assert_eq!((count("pending").await, count("cancelled").await), (0, 3));
    // Cancel a workflow's open runs.
    b.show("#/workflow/gate").await;
    b.wait_text("#bulk-cancel-runs", "(2)").await;
    b.click("#bulk-cancel-runs").await;
    b.click("#confirm-yes").await;
    b.wait_text("#flash", "Done: 2 of 2 changed").await;
    for run in &gated {
        let r = run_until(&relay, &fx.owner, run, 20, tests::workflow::ended).await;
        assert_eq!(r["status"], "cancelled", "{r}");
    }
    assert_eq!(b.page_errors().await, Vec::<String>::new());
    b.close().await;

    // The methods themselves: an id that cannot change is refused with its
    // single call's error, the rest change; a stranger changes nothing.
    let (_, v) = rpc(
        &relay,
        &fx.owner,
        "retrydeliveries",
        json!([[failed[0], "nosuchdelivery", failed[1]]]),
    )
    .await;
    let changed: Vec<&str> = v["result"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(changed, [failed[0].as_str(), failed[1].as_str()], "{v}");
    assert_eq!(v["result"]["refused"][0]["id"], "nosuchdelivery", "{v}");
    let (status, v) = rpc(
        &relay,
        &Keys::generate(),
        "canceldeliveries",
        json!([[failed[0]]]),
    )
    .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(count("pending").await, 2);

    // relayctl: a filter shows what it selects, and changes it with --yes.
    let relayctl = |args: &[&str]| relayctl(&relay, &fx.owner, args);
    let (ok, out) = relayctl(&["deliveries", "cancel", "--status", "pending"]);
    assert!(
        ok && out.contains("2 deliveries selected; nothing cancelled"),
        "{out}"
    );
    assert_eq!(count("pending").await, 2);
    let (ok, out) = relayctl(&["deliveries", "cancel", "--status", "pending", "--yes"]);
    assert!(ok && out.contains("2 of 2 cancelled"), "{out}");
    assert_eq!(count("pending").await, 0);
    let (ok, out) = relayctl(&["deliveries", "retry", &failed[0], &failed[2]]);
    assert!(ok && out.contains("2 of 2 retried"), "{out}");
    let (ok, out) = relayctl(&["deliveries", "retry", &failed[0], &failed[1]]);
    assert!(!ok && out.contains(&format!("refused {}", failed[0])), "{out}");
    assert_eq!(count("pending").await, 3);
}
