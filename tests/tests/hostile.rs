//! Hostile clients: each hole found by attacking the relay from outside,
//! with a test named after the bound that now holds it, on both backends
//! (docs/reliability.md, "Hostile clients", lists them with their figures).

use std::time::Duration;

use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};
use serde_json::{json, Value};
use tests::workflow::{
    api, claim_when_due, definition, eventually, finish, on_message, relay_pubkey, Fixture,
};
use tests::{backend_tests, event, event_at, http_raw, now, Backend, Client, Relay, RelayOptions};

backend_tests!(
    nul_in_tag_values_is_refused_content_is_not,
    one_failing_event_never_fails_its_batch,
    one_failing_call_never_fails_its_batch,
    a_second_h_tag_is_refused,
    client_signed_channel_metadata_is_refused,
    finish_replies_meet_event_admission,
    departed_owners_workflows_pause,
    webhook_failures_are_limited_per_hook_and_caller,
    attestations_must_allow_their_own_kind_0,
    gift_wraps_are_p_gated,
    stored_results_are_paged_merged_and_capped,
    non_reading_subscribers_are_bounded_relay_wide,
    templates_cannot_multiply_trigger_data,
    oversized_frames_close_with_1009,
    me_is_rate_limited,
    live_search_filters_are_bounded,
    a_burst_of_large_events_does_not_hold_another_authors_write,
);

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

fn opts(toml: &str) -> RelayOptions {
    RelayOptions {
        config_toml: toml.into(),
        ..Default::default()
    }
}

/// Lifts the event rate limits (these tests publish in bulk).
const FAST: &str = "[limits]\nevents_per_second = 100000\nevents_burst = 100000\n";

async fn nul_in_tag_values_is_refused_content_is_not(backend: Backend) {
    let relay = Relay::start(&backend);
    let k = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&k).await;
    c.publish_ok(&event(&k, 9007, "", &[&["h", "room"]])).await;
    for (kind, tags) in [
        (1u16, vec![vec!["t", "a\u{0}b"]]),
        (30023, vec![vec!["d", "\u{0}"]]),
        (9, vec![vec!["h", "ro\u{0}om"]]),
        (1, vec![vec!["p", &hex(&k)], vec!["x", "ok", "\u{0}"]]),
    ] {
        let tags: Vec<&[&str]> = tags.iter().map(Vec::as_slice).collect();
        let (ok, msg) = c.publish(&event(&k, kind, "x", &tags)).await;
        assert!(!ok, "kind {kind} with U+0000 accepted");
        assert_eq!(msg, "invalid: tag values must not contain U+0000");
    }
    // In content it is only a JSON escape: stored and served back as sent.
    let e = event(&k, 1, "a\u{0}b", &[&["t", "fine"]]);
    c.publish_ok(&e).await;
    let got = c.req("n", vec![json!({"ids": [e.id]})]).await.events();
    assert_eq!(got[0].content, "a\u{0}b");
}

async fn one_failing_event_never_fails_its_batch(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: FAST.into(),
            env: vec![("RELAY_FAULTS".into(), "event:poison=error".into())],
        },
    );
    let (innocent, attacker) = (Keys::generate(), Keys::generate());
    let mut a = Client::connect(&relay.ws_url()).await;
    let mut b = Client::connect(&relay.ws_url()).await;
    let mine: Vec<_> = (0..200)
        .map(|i| event_at(&innocent, 1, &format!("innocent {i}"), &[], now() - i))
        .collect();
    let theirs: Vec<_> = (0..40)
        .map(|i| {
            let text = if i % 2 == 0 {
                "poison".to_string()
            } else {
                format!("fine {i}")
            };
            event_at(&attacker, 1, &text, &[], now() - i)
        })
        .collect();
    // Both pipelined at once, so that the writer's batches mix them.
    let (mine_ok, theirs_ok) = tokio::join!(pipeline(&mut a, mine), pipeline(&mut b, theirs));
    for (text, (ok, msg)) in &mine_ok {
        assert!(ok, "{text}: {msg}");
    }
    for (text, (ok, msg)) in &theirs_ok {
        if text == "poison" {
            assert!(!ok && msg.starts_with("error:"), "{text}: {ok} {msg}");
        } else {
            assert!(ok, "{text}: {msg}");
        }
    }
    assert!(
        relay.log().contains("writing its events one by one"),
        "no batch held a failing event: the test proved nothing"
    );
    let n = a
        .count("c", vec![json!({"authors": [hex(&innocent)]})])
        .await
        .unwrap();
    assert_eq!(n, 200);
    let n = a
        .count("c", vec![json!({"authors": [hex(&attacker)]})])
        .await
        .unwrap();
    assert_eq!(n, 20);
}

async fn one_failing_call_never_fails_its_batch(backend: Backend) {
    // One call writer (PostgreSQL has several, each caller's calls on one),
    // so that claims and channel messages share its batches; every claim
    // fails in the database.
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: format!("{FAST}[writer]\ncall_writers = 1\n"),
            env: vec![("RELAY_FAULTS".into(), "claim:error=error".into())],
        },
    );
    let mut fx = Fixture::new(&relay, "calls", 1).await;
    let agent = fx.agents[0].clone();
    let posts: Vec<_> = (0..150)
        .map(|i| event(&fx.owner, 9, &format!("post {i}"), &[&["h", "calls"]]))
        .collect();
    let claims = async {
        let mut answers = Vec::new();
        for _ in 0..3 {
            let calls = (0..10).map(|_| tests::workflow::claim(&relay, &agent, json!({})));
            answers.extend(futures_util::future::join_all(calls).await);
        }
        answers
    };
    let (posted, claimed) = tokio::join!(pipeline(&mut fx.owner_client, posts), claims);
    for (text, (ok, msg)) in &posted {
        assert!(ok, "{text}: {msg}");
    }
    for (status, v) in &claimed {
        assert_eq!(*status, 503, "{v}");
    }
    assert!(
        relay.log().contains("running each call in its own savepoint"),
        "no batch held a failing call: the test proved nothing"
    );
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&fx.owner).await;
    let n = c
        .count("n", vec![json!({"#h": ["calls"], "kinds": [9]})])
        .await
        .unwrap();
    assert_eq!(n, 150);
}

/// Sends every event, then waits for every OK: (content, (accepted, message)).
async fn pipeline(c: &mut Client, evs: Vec<nostr::prelude::Event>) -> Vec<(String, (bool, String))> {
    for e in &evs {
        c.send(json!(["EVENT", e])).await;
    }
    let mut answers = Vec::with_capacity(evs.len());
    for e in &evs {
        answers.push((e.content.clone(), c.wait_ok(&e.id.to_hex()).await));
    }
    answers
}

async fn a_second_h_tag_is_refused(backend: Backend) {
    let relay = Relay::start(&backend);
    let (admin, outsider) = (Keys::generate(), Keys::generate());
    let mut a = Client::connect(&relay.ws_url()).await;
    a.auth(&admin).await;
    a.publish_ok(&event(&admin, 9007, "", &[&["h", "pub"]])).await;
    a.publish_ok(&event(&admin, 9007, "", &[&["h", "priv"], &["private"]]))
        .await;
    let mut o = Client::connect(&relay.ws_url()).await;
    o.auth(&outsider).await;
    o.publish_ok(&event(&outsider, 9021, "", &[&["h", "pub"]])).await;
    o.publish_ok(&event(&outsider, 9, "hello", &[&["h", "pub"]]))
        .await;
    let (ok, msg) = o
        .publish(&event(&outsider, 9, "sneaked", &[&["h", "pub"], &["h", "priv"]]))
        .await;
    assert!(!ok, "accepted an event in two channels");
    assert!(msg.starts_with("invalid: "), "{msg}");
    // The private channel's members see nothing of the outsider.
    let seen = a
        .req("p", vec![json!({"#h": ["priv"], "kinds": [9]})])
        .await
        .events();
    assert!(seen.iter().all(|e| e.pubkey != outsider.public_key()), "{seen:?}");
}

async fn client_signed_channel_metadata_is_refused(backend: Backend) {
    let relay = Relay::start(&backend);
    let relay_pk = relay_pubkey(&relay, &relay.addr.to_string()).await;
    let k = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&k).await;
    c.publish_ok(&event(&k, 9007, "", &[&["h", "real"], &["name", "Real"]]))
        .await;
    for kind in [39000u16, 39001, 39002, 39003, 39009] {
        let forged = event(
            &k,
            kind,
            "",
            &[&["d", "real"], &["name", "Forged"], &["p", &hex(&k), "admin"]],
        );
        let (ok, msg) = c.publish(&forged).await;
        assert!(!ok, "kind {kind} signed by a client was accepted");
        assert!(msg.starts_with("restricted: "), "{msg}");
    }
    let meta = c
        .req("m", vec![json!({"kinds": [39000], "#d": ["real"]})])
        .await
        .events();
    assert_eq!(meta.len(), 1);
    assert_eq!(meta[0].pubkey.to_hex(), relay_pk);
}

/// A kind 9 reply by `agent` in `channel`, with extra tags, at `created_at`.
fn reply(
    agent: &Keys,
    channel: &str,
    content: &str,
    extra: Vec<Tag>,
    created_at: u64,
) -> nostr::prelude::Event {
    let mut tags = vec![Tag::custom("h", [channel])];
    tags.extend(extra);
    EventBuilder::new(Kind::from_u16(9), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(created_at))
        .finalize(agent)
        .expect("sign")
}

async fn finish_replies_meet_event_admission(backend: Backend) {
    // The default bound on future created_at (15 minutes): a reply meets it.
    let relay = Relay::start(&backend);
    let mut fx = Fixture::new(&relay, "desk", 1).await;
    fx.define("w", &on_message(&format!("{} look", fx.mention(0))))
        .await;
    fx.post("go").await;
    let agent = fx.agents[0].clone();
    let d = claim_when_due(&relay, &agent, json!({})).await;
    let id = d["id"].as_str().unwrap().to_string();
    let token = d["claim_token"].as_str().unwrap().to_string();
    let t = now();
    let bad = vec![
        (
            "ten years ahead",
            reply(&agent, "desk", "r", vec![], t + 10 * 365 * 86_400),
        ),
        (
            "2,500 tags",
            reply(
                &agent,
                "desk",
                "r",
                (0..2_500).map(|i| Tag::custom("t", [i.to_string()])).collect(),
                t,
            ),
        ),
        (
            "300 KB content",
            reply(&agent, "desk", &"x".repeat(300 * 1024), vec![], t),
        ),
        (
            "already expired",
            reply(
                &agent,
                "desk",
                "r",
                vec![Tag::custom("expiration", [(t - 60).to_string()])],
                t,
            ),
        ),
        (
            "U+0000",
            reply(&agent, "desk", "r", vec![Tag::custom("t", ["a\u{0}"])], t),
        ),
        (
            "two channels",
            reply(&agent, "desk", "r", vec![Tag::custom("h", ["other"])], t),
        ),
    ];
    for (what, r) in bad {
        let body = json!({"claim_token": token, "outcome": "delivered", "reply": r});
        let (status, v) = finish(&relay, &agent, &id, &body).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert_eq!(v["error"], "bad_reply", "{what}: {v}");
        assert!(
            v["message"].as_str().unwrap().starts_with("invalid: "),
            "{what}: {v}"
        );
    }
    // Nothing of them was stored; the delivery is still the agent's to finish.
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&fx.owner).await;
    let stored = c
        .req("r", vec![json!({"authors": [hex(&agent)], "kinds": [9]})])
        .await
        .events();
    assert!(stored.is_empty(), "{stored:?}");
    let good = reply(&agent, "desk", "done", vec![], t);
    let body = json!({"claim_token": token, "outcome": "delivered", "reply": good});
    let (status, v) = finish(&relay, &agent, &id, &body).await;
    assert_eq!((status, v["status"].as_str()), (200, Some("delivered")), "{v}");
}

async fn departed_owners_workflows_pause(backend: Backend) {
    let relay = Relay::start(&backend);
    let relay_pk = relay_pubkey(&relay, &relay.addr.to_string()).await;
    let (boss, olive) = (Keys::generate(), Keys::generate());
    let mut b = Client::connect(&relay.ws_url()).await;
    b.auth(&boss).await;
    b.publish_ok(&event(&boss, 9007, "", &[&["h", "room"], &["private"]]))
        .await;
    b.publish_ok(&event(&boss, 9000, "", &[&["h", "room"], &["p", &hex(&olive)]]))
        .await;
    let mut o = Client::connect(&relay.ws_url()).await;
    o.auth(&olive).await;
    let on_post = json!({"name": "copy", "trigger": {"on": "message_posted"},
        "steps": [{"id": "s", "action": "send_message", "text": "seen: {{trigger.text}}"}]});
    o.publish_ok(&definition(&olive, "copy", "room", &on_post)).await;
    let hook = json!({"name": "hook", "trigger": {"on": "webhook"},
        "steps": [{"id": "s", "action": "send_message", "text": "hook: {{trigger.body.t}}"}]});
    o.publish_ok(&definition(&olive, "hook", "room", &hook)).await;
    let (status, v) = api(&relay, &olive, "POST", "/workflows/hook/webhook-secret", None).await;
    assert_eq!(status, 200, "{v}");
    let secret = v["secret"].as_str().unwrap().to_string();
    b.publish_ok(&event(&boss, 9, "before", &[&["h", "room"]])).await;
    let runs = |relay: &Relay| relay.cli(&["runs", "list", "--workflow", "copy"]).lines().count();
    eventually(|| async { (runs(&relay) == 1).then_some(()) }).await;
    let (status, _) = api(&relay, &olive, "GET", "/workflows/copy/runs", None).await;
    assert_eq!(status, 200);

    // Olive is removed: her workflows pause, visibly.
    b.publish_ok(&event(&boss, 9001, "", &[&["h", "room"], &["p", &hex(&olive)]]))
        .await;
    let notices = b
        .req(
            "n",
            vec![json!({"#h": ["room"], "kinds": [9], "authors": [relay_pk]})],
        )
        .await
        .events();
    let paused: Vec<String> = notices
        .iter()
        .flat_map(|e| e.tags.iter())
        .filter(|t| t.kind() == "workflow-paused")
        .map(|t| t.as_slice()[1].clone())
        .collect();
    assert!(
        paused.contains(&"copy".to_string()) && paused.contains(&"hook".to_string()),
        "{paused:?}"
    );
    // A message's runs start in the transaction that stores it: its OK is
    // the barrier.
    b.publish_ok(&event(&boss, 9, "a private message after", &[&["h", "room"]]))
        .await;
    assert_eq!(runs(&relay), 1, "a removed owner's workflow ran");
    let (status, v) = api(&relay, &olive, "GET", "/workflows/copy/runs", None).await;
    assert_eq!((status, v["error"].as_str()), (403, Some("not_member")), "{v}");
    let (status, v) = http_raw(
        &relay.http_url(),
        &relay.addr.to_string(),
        "POST",
        "/hooks/hook",
        Some(&format!("Bearer {secret}")),
        br#"{"t":"x"}"#,
    )
    .await;
    assert!(status == 409 || status == 403, "{status} {v}");
    let posted = b
        .req(
            "h",
            vec![json!({"#h": ["room"], "kinds": [9], "authors": [relay_pk]})],
        )
        .await
        .events();
    assert!(
        posted.iter().all(|e| !e.content.starts_with("hook:")),
        "{posted:?}"
    );
}

/// Failed webhook calls are limited per hook and caller: a wrong-secret
/// flood locks out its own address from the hook it hits, not that
/// hook's other callers, nor the same address's calls to another hook
/// (behind a proxy every caller shares one address); behind a trusted
/// proxy, the address it forwards is the caller.
async fn webhook_failures_are_limited_per_hook_and_caller(backend: Backend) {
    let relay = Relay::start_opts(&backend, opts("[limits]\ntrusted_proxies = [\"127.0.0.3\"]\n"));
    let mut fx = Fixture::new(&relay, "hooks", 0).await;
    let mut secrets = Vec::new();
    for id in ["h", "h2"] {
        let hook = json!({"name": id, "trigger": {"on": "webhook"},
            "steps": [{"id": "s", "action": "send_message", "text": "hook"}]});
        fx.define(id, &hook).await;
        let path = format!("/workflows/{id}/webhook-secret");
        let (status, v) = api(&relay, &fx.owner, "POST", &path, None).await;
        assert_eq!(status, 200, "{v}");
        secrets.push(v["secret"].as_str().unwrap().to_string());
    }
    let from = |addr: &str| {
        reqwest::Client::builder()
            .local_address(Some(addr.parse().unwrap()))
            .build()
            .unwrap()
    };
    let host = relay.addr.to_string();
    let call =
        |client: reqwest::Client, hook: &'static str, secret: String, forwarded: Option<&'static str>| {
            let url = format!("{}/hooks/{hook}", relay.http_url());
            let host = host.clone();
            async move {
                let mut r = client
                    .post(&url)
                    .header("Host", host)
                    .header("Authorization", format!("Bearer {secret}"))
                    .body("{}");
                if let Some(f) = forwarded {
                    r = r.header("X-Forwarded-For", f);
                }
                r.send().await.unwrap().status().as_u16()
            }
        };
    let flood = |client: reqwest::Client, forwarded: Option<&'static str>| {
        let call = &call;
        async move {
            let mut limited = 0;
            for _ in 0..300 {
                match call(client.clone(), "h", "wrong".into(), forwarded).await {
                    401 => {}
                    429 => limited += 1,
                    s => panic!("flood answered {s}"),
                }
            }
            limited
        }
    };
    // A wrong-secret flood at hook h from 127.0.0.2.
    let limited = flood(from("127.0.0.2"), None).await;
    eprintln!("direct flood: {limited} of 300 failures answered 429");
    assert!(limited >= 250, "only {limited} of 300 failures limited");
    // The same address's call to another hook, and h's caller from
    // another address, go through.
    assert_eq!(call(from("127.0.0.2"), "h2", secrets[1].clone(), None).await, 200);
    assert_eq!(call(from("127.0.0.1"), "h", secrets[0].clone(), None).await, 200);
    // Through the trusted proxy: the flood names a victim first, but only
    // the address the proxy appended counts.
    let proxy = from("127.0.0.3");
    let limited = flood(proxy.clone(), Some("198.51.100.7, 203.0.113.9")).await;
    eprintln!("flood through a trusted proxy: {limited} of 300 failures answered 429");
    assert!(limited >= 250, "only {limited} of 300 failures limited");
    let real = call(proxy.clone(), "h", secrets[0].clone(), Some("198.51.100.7")).await;
    assert_eq!(real, 200, "the real caller behind the proxy is locked out");
    let again = call(proxy, "h", "wrong".into(), Some("203.0.113.9")).await;
    assert_eq!(again, 429, "the flooder behind the proxy is not limited");
}

async fn attestations_must_allow_their_own_kind_0(backend: Backend) {
    let relay = Relay::start(&backend);
    let (owner, agent) = (Keys::generate(), Keys::generate());
    let mut c = Client::connect(&relay.ws_url()).await;
    for cond in ["kind=1", "created_at<1000"] {
        let tag = protocol::nip_oa::sign(&owner, &agent.public_key(), cond).unwrap();
        let k0 = EventBuilder::new(Kind::Metadata, "{}")
            .tags([tag])
            .finalize(&agent)
            .unwrap();
        let (ok, msg) = c.publish(&k0).await;
        assert!(!ok, "{cond}: registered");
        assert!(
            msg.starts_with("invalid: NIP-OA attestation: the conditions do not allow"),
            "{msg}"
        );
    }
    let (status, me) = api(&relay, &agent, "GET", "/me", None).await;
    assert_eq!(status, 200);
    assert!(me["agent_owner"].is_null(), "{me}");
    let tag = protocol::nip_oa::sign(&owner, &agent.public_key(), "kind=0").unwrap();
    let k0 = EventBuilder::new(Kind::Metadata, "{}")
        .tags([tag])
        .finalize(&agent)
        .unwrap();
    c.publish_ok(&k0).await;
    let (_, me) = api(&relay, &agent, "GET", "/me", None).await;
    assert_eq!(me["agent_owner"], hex(&owner));
}

async fn gift_wraps_are_p_gated(backend: Backend) {
    let relay = Relay::start(&backend);
    let (alice, bob, carol) = (Keys::generate(), Keys::generate(), Keys::generate());
    let mut anon = Client::connect(&relay.ws_url()).await;
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&carol).await;
    c.req("live", vec![json!({"authors": [hex(&alice)], "limit": 0})])
        .await
        .events();
    let wrap = event(&alice, 1059, "sealed", &[&["p", &hex(&bob)]]);
    anon.publish_ok(&wrap).await;
    c.expect_silence(Duration::from_millis(500)).await;
    let closed = anon.req("a", vec![json!({"kinds": [1059]})]).await.closed();
    assert!(closed.starts_with("auth-required: "), "{closed}");
    let closed = c
        .req("b", vec![json!({"kinds": [1059], "#p": [hex(&bob)]})])
        .await
        .closed();
    assert!(closed.starts_with("restricted: "), "{closed}");
    assert!(c
        .req("c", vec![json!({"kinds": [1059]})])
        .await
        .events()
        .is_empty());
    assert!(anon
        .req("d", vec![json!({"authors": [hex(&alice)]})])
        .await
        .events()
        .is_empty());
    assert_eq!(
        anon.count("e", vec![json!({"authors": [hex(&alice)]})])
            .await
            .unwrap(),
        0
    );
    let mut b = Client::connect(&relay.ws_url()).await;
    b.auth(&bob).await;
    let got = b
        .req("f", vec![json!({"kinds": [1059], "#p": [hex(&bob)]})])
        .await
        .events();
    assert_eq!(got.len(), 1);
}

async fn stored_results_are_paged_merged_and_capped(backend: Backend) {
    // A 64 KiB queue: every REQ below takes many pages.
    let relay = Relay::start_opts(
        &backend,
        opts(&format!(
            "{FAST}max_outbound_bytes = 65536\nmax_req_bytes = 450000\n"
        )),
    );
    let (a, b) = (Keys::generate(), Keys::generate());
    let mut c = Client::connect(&relay.ws_url()).await;
    let t0 = now() - 10_000;
    let pad = "p".repeat(1000);
    // Ties on created_at (two events a second) test the id order too.
    let mut sent = Vec::new();
    for i in 0..300u64 {
        let e = event_at(&a, 1, &format!("a{i} {pad}"), &[], t0 + i / 2);
        c.send(json!(["EVENT", e])).await;
        sent.push(e);
    }
    for i in 0..100u64 {
        let e = event_at(&b, 1, &format!("b{i} {pad}"), &[], t0 + i * 3);
        c.send(json!(["EVENT", e])).await;
        sent.push(e);
    }
    for e in &sent {
        assert!(c.wait_ok(&e.id.to_hex()).await.0);
    }
    let in_req_order = |evs: &[nostr::prelude::Event]| {
        evs.windows(2).all(|w| {
            (std::cmp::Reverse(w[0].created_at), w[0].id) < (std::cmp::Reverse(w[1].created_at), w[1].id)
        })
    };
    let all_a = c
        .req("a", vec![json!({"authors": [hex(&a)], "limit": 300})])
        .await
        .events();
    assert_eq!(all_a.len(), 300);
    assert!(in_req_order(&all_a));
    // Two filters: merged in REQ order; overlapping ones give each event once.
    let two = c
        .req(
            "m",
            vec![
                json!({"authors": [hex(&a)], "limit": 200}),
                json!({"authors": [hex(&b)], "limit": 50}),
            ],
        )
        .await
        .events();
    assert_eq!(two.len(), 250);
    assert!(in_req_order(&two));
    let overlap = c
        .req(
            "o",
            vec![
                json!({"authors": [hex(&b)]}),
                json!({"kinds": [1], "authors": [hex(&b)], "limit": 30}),
            ],
        )
        .await
        .events();
    assert_eq!(overlap.len(), 100);
    assert!(in_req_order(&overlap));
    // max_req_bytes: 450,000 bytes of the ~1.4 KB frames (of 400), then
    // EOSE; the subscription stays open for live events.
    let everything = c.req("cap", vec![json!({"kinds": [1]})]).await.events();
    let frames: usize = everything
        .iter()
        .map(|e| e.as_json().len() + "[\"EVENT\",\"cap\",]".len())
        .sum();
    assert!(
        (300..400).contains(&everything.len()) && frames <= 450_000 && frames + 1500 > 450_000,
        "{} events, {frames} bytes, for a 450,000-byte cap",
        everything.len()
    );
    assert!(in_req_order(&everything));
    let info: Value = reqwest::Client::new()
        .get(relay.http_url())
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["limitation"]["max_req_bytes"], 450_000, "{info}");
    let late = event(&a, 1, "late", &[]);
    let mut p = Client::connect(&relay.ws_url()).await;
    p.publish_ok(&late).await;
    assert_eq!(c.next_event("cap").await.id, late.id);
}

async fn non_reading_subscribers_are_bounded_relay_wide(backend: Backend) {
    // 2 MiB for every queue together; each connection's own bound (8 MiB)
    // is larger than everything published.
    let relay = Relay::start_opts(
        &backend,
        opts(&format!("{FAST}max_outbound_bytes_total = 2097152\n")),
    );
    let k = Keys::generate();
    let mut stalled = Vec::new();
    for i in 0..10 {
        let mut s = Client::connect_small_receive_buffer(&relay.ws_url()).await;
        s.send(json!(["REQ", format!("s{i}"), {"kinds": [1], "limit": 0}]))
            .await;
        stalled.push(s);
    }
    let mut reader = Client::connect(&relay.ws_url()).await;
    reader
        .req("r", vec![json!({"kinds": [1], "limit": 0})])
        .await
        .events();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut p = Client::connect(&relay.ws_url()).await;
    let body = "z".repeat(50 * 1024);
    let events: Vec<_> = (0..100)
        .map(|i| event(&k, 1, &format!("{i} {body}"), &[]))
        .collect();
    // The reader reads as it goes, and gets everything, in order.
    let publish = async {
        for e in &events {
            p.publish_ok(e).await;
        }
    };
    let read = async {
        for e in &events {
            assert_eq!(reader.next_event("r").await.id, e.id);
        }
    };
    tokio::join!(publish, read);
    // The ten that never read were dropped (5 MB published, 2 MiB budget).
    eventually(|| async {
        let n = relay.log().matches("slow reader disconnected").count();
        (n >= 10).then_some(())
    })
    .await;
    drop(stalled);
}

async fn templates_cannot_multiply_trigger_data(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut fx = Fixture::new(&relay, "amp", 0).await;
    let def = json!({"name": "amp", "trigger": {"on": "webhook"}, "steps": [
        {"id": "a", "action": "send_message", "text": "{{trigger.body.x}}".repeat(64)},
        {"id": "b", "action": "send_message", "text": "{{steps.a.output.text}}".repeat(64)}]});
    fx.define("amp", &def).await;
    let (_, v) = api(&relay, &fx.owner, "POST", "/workflows/amp/webhook-secret", None).await;
    let secret = v["secret"].as_str().unwrap().to_string();
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher.auth(&fx.owner).await;
    watcher
        .req("w", vec![json!({"#h": ["amp"], "limit": 0})])
        .await
        .events();
    let host = relay.addr.to_string();
    // 8 KB of body: step a alone would be 512 KB. 1 KB: step a is 64 KB
    // (stored), step b 4 MB.
    for (size, stored_steps) in [(8 * 1024, 0usize), (1024, 1)] {
        let body = json!({"x": "y".repeat(size)}).to_string();
        let (status, v) = http_raw(
            &relay.http_url(),
            &host,
            "POST",
            "/hooks/amp",
            Some(&format!("Bearer {secret}")),
            body.as_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let run_id = v["run_id"].as_str().unwrap().to_string();
        let run: Value = eventually(|| async {
            let run: Value = serde_json::from_str(&relay.cli(&["runs", "show", &run_id])).unwrap();
            (run["status"] != "running").then_some(run)
        })
        .await;
        assert_eq!(run["status"], "failed", "{run}");
        assert_eq!(run["error"]["code"], "message_too_large", "{run}");
        let steps = run["steps"].as_array().unwrap();
        let done = steps.iter().filter(|s| s["status"] == "done").count();
        assert_eq!(done, stored_steps, "{run}");
        assert_eq!(steps[stored_steps]["status"], "failed", "{run}");
        assert_eq!(run["error"]["step"], steps[stored_steps]["id"], "{run}");
    }
    // What was stored is within max_event_bytes, and the watcher was not
    // disconnected: it still gets live events.
    let stored = watcher
        .req("s", vec![json!({"#h": ["amp"], "kinds": [9]})])
        .await
        .events();
    assert!(stored.iter().all(|e| e.as_json().len() <= 128 * 1024));
    fx.post("still here").await;
    while watcher.next_event("w").await.content != "still here" {}
}

async fn oversized_frames_close_with_1009(backend: Backend) {
    let relay = Relay::start_opts(&backend, opts("[limits]\nmax_message_bytes = 4096\n"));
    for round in 0..10 {
        let mut c = Client::connect(&relay.ws_url()).await;
        c.send_raw(format!("[\"EVENT\",{}]", "z".repeat(1 << 20))).await;
        let frame = c.closed_by_relay(Duration::from_secs(5)).await.expect("closed");
        let code = frame.map(|f| u16::from(f.code));
        assert_eq!(code, Some(1009), "round {round}");
    }
}

async fn me_is_rate_limited(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        opts("[limits]\napi_requests_per_second = 1\napi_burst = 3\n"),
    );
    let k = Keys::generate();
    let mut limited = 0;
    for _ in 0..8 {
        let (status, _) = api(&relay, &k, "GET", "/me", None).await;
        if status == 429 {
            limited += 1;
        }
    }
    assert!(limited >= 4, "only {limited} of 8 limited");
}

/// Live delivery of `n` large events (of `phase`) from `publisher` to
/// `watcher`'s subscription `feed`: each event's time from its send to
/// its arrival, sorted.
async fn live_delays(
    publisher: &mut Client,
    watcher: &mut Client,
    k: &Keys,
    phase: &str,
    n: usize,
) -> Vec<Duration> {
    // About 120 KB of distinct words: work for every search that looks.
    let words: Vec<String> = (0..12_000).map(|i| format!("w{i:05}")).collect();
    let content = words.join(" ");
    let mut delays = Vec::with_capacity(n);
    for i in 0..n {
        // Each event new: a duplicate is acknowledged, never fanned out.
        let ev = event(k, 1, &format!("{phase} {i} {content}"), &[]);
        let sent = std::time::Instant::now();
        publisher.publish_ok(&ev).await;
        loop {
            let got = watcher.next_event("feed").await;
            if got.id == ev.id {
                break;
            }
        }
        delays.push(sent.elapsed());
    }
    delays.sort();
    delays
}

/// Live NIP-50 search filters are bounded per connection and relay-wide:
/// two connections asking for 2,048 of them get 8 each (the rest refused
/// with CLOSED and a reason), each event's words are read once however
/// many searches look, and another subscriber's live delivery is printed
/// with and without the attack.
async fn live_search_filters_are_bounded(backend: Backend) {
    let relay = Relay::start_opts(&backend, opts(&format!("{FAST}max_live_search_filters = 12\n")));
    let k = Keys::generate();
    let mut publisher = Client::connect(&relay.ws_url()).await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    let filter = json!({"kinds": [1], "authors": [hex(&k)], "limit": 0});
    watcher.req("feed", vec![filter]).await.events();
    let alone = live_delays(&mut publisher, &mut watcher, &k, "alone", 20).await;

    // Two attackers, 64 REQs of 16 search filters each, 16 words a search.
    let mut attackers = [
        Client::connect(&relay.ws_url()).await,
        Client::connect(&relay.ws_url()).await,
    ];
    let mut held = Vec::new();
    for (a, c) in attackers.iter_mut().enumerate() {
        let mut reasons = std::collections::BTreeSet::new();
        let (mut live, mut refused) = (0, 0);
        for r in 0..64 {
            let filters: Vec<Value> = (0..16)
                .map(|f| {
                    let words: Vec<String> = (0..16).map(|w| format!("z{a}x{r}x{f}x{w}")).collect();
                    json!({"kinds": [1], "search": words.join(" "), "limit": 0})
                })
                .collect();
            match c.req(&format!("s{r}"), filters).await {
                tests::client::ReqResult::Events(_) => live += 1,
                tests::client::ReqResult::Closed(why) => {
                    refused += 1;
                    reasons.insert(why.split(':').next().unwrap_or_default().to_string());
                }
            }
        }
        eprintln!("attacker {a}: {live} REQs live, {refused} refused ({reasons:?})");
        held.push(live);
        assert_eq!(refused + live, 64);
        assert!(
            refused >= 63,
            "attacker {a}: {live} REQs of 16 search filters held"
        );
    }
    // A REQ of 8 search filters fits one connection's share, and the relay's
    // share (12) runs out at the second connection.
    let eight: Vec<Value> = (0..8)
        .map(|f| json!({"kinds": [1], "search": format!("y{f}"), "limit": 0}))
        .collect();
    let first = attackers[0].req("eight", eight.clone()).await;
    assert!(
        matches!(first, tests::client::ReqResult::Events(_)),
        "8 search filters refused"
    );
    match attackers[1].req("eight", eight.clone()).await {
        tests::client::ReqResult::Closed(why) => assert!(why.starts_with("rate-limited:"), "{why}"),
        tests::client::ReqResult::Events(_) => panic!("the relay's share was passed"),
    }
    // Closing a subscription gives its share back.
    attackers[0].send(json!(["CLOSE", "eight"])).await;
    let mut given_back = false;
    for _ in 0..50 {
        if let tests::client::ReqResult::Events(_) = attackers[1].req("eight", eight.clone()).await {
            given_back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(given_back, "a closed subscription kept its share");

    let attacked = live_delays(&mut publisher, &mut watcher, &k, "attacked", 20).await;
    let p99 = |d: &[Duration]| d[d.len() - 1];
    eprintln!(
        "live delivery of a 120 KB event to another subscriber, worst of 20: {:?} alone, {:?} under the attack ({:.2}x)",
        p99(&alone),
        p99(&attacked),
        p99(&attacked).as_secs_f64() / p99(&alone).as_secs_f64()
    );
}

/// A burst of large, many-word events (each costs the full-text index its
/// words) from one author, then one small event from another: the
/// writer's batches are bounded by bytes and take authors in turn, so the
/// other author's event is answered before the burst is through. Prints
/// the burst's length and the other event's wait.
async fn a_burst_of_large_events_does_not_hold_another_authors_write(backend: Backend) {
    let relay = Relay::start_opts(&backend, opts(FAST));
    let (heavy, light) = (Keys::generate(), Keys::generate());
    let mut burst = Client::connect(&relay.ws_url()).await;
    let mut other = Client::connect(&relay.ws_url()).await;
    // About 100 KB of 20,000 distinct words each: heavy to index.
    let words: Vec<String> = (0..20_000).map(|i| format!("{i:04x}")).collect();
    let content = words.join(" ");
    const N: usize = 120;
    let events: Vec<_> = (0..N)
        .map(|i| event(&heavy, 1, &format!("{i} {content}"), &[]))
        .collect();
    let started = std::time::Instant::now();
    for ev in &events {
        burst.send(json!(["EVENT", ev])).await;
    }
    // The burst's first answer: its events are being written.
    let (ok, msg) = burst.wait_ok(&events[0].id.to_hex()).await;
    assert!(ok, "{msg}");
    let small = event(&light, 1, "a small note", &[]);
    let sent = std::time::Instant::now();
    other.publish_ok(&small).await;
    let waited = sent.elapsed();
    // What the burst was answered so far (what has arrived, read without
    // waiting): not its last event.
    let last = events[N - 1].id.to_hex();
    let mut answered = 1;
    let mut through = false;
    while let Some(v) = burst.try_recv(Duration::ZERO).await {
        if v[0] == "OK" {
            through |= v[1] == last;
            answered += 1;
        }
    }
    if !through {
        let (ok, msg) = burst.wait_ok(&last).await;
        assert!(ok, "{msg}");
    }
    eprintln!(
        "{N} events of 100 KB from one author took {:?}; another author's event sent after the first \
         was answered waited {waited:?}, when {answered} of the burst's were answered",
        started.elapsed()
    );
    assert!(!through, "the burst was through before the other author's event");
}
