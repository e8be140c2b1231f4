//! Relay core over real sockets: NIP-01, 09, 11, 40, 42, 45, 70, p-gating,
//! limits, malformed input, communities, restart durability, shutdown.
//! Every test runs against every backend.

use std::time::Duration;

use nostr::prelude::Keys;
use serde_json::json;
use tests::{backend_tests, event, event_at, now, Backend, Client, Relay, RelayOptions};

backend_tests!(
    publish_and_query_every_filter_field,
    limit_orders_newest_first_ties_by_lowest_id,
    live_events_after_eose_and_close,
    replaceable_and_addressable,
    ephemeral_fanned_out_never_stored,
    deletion_by_e_and_a_stays_deleted,
    nip11_document_and_cors,
    expiration_nip40,
    auth_nip42,
    count_nip45,
    protected_nip70,
    p_gated_kinds,
    limits_are_enforced,
    malformed_input_answers,
    slow_reader_is_disconnected,
    communities_are_isolated,
    acknowledged_events_survive_sigkill,
    graceful_shutdown_closes_sockets,
    sigterm_answers_every_event_it_read,
    pipelined_events_keep_their_rules,
    tag_rows_follow_their_event,
);

/// Many events sent without waiting (they are stored in batches), far more
/// than the relay reads ahead (`max_inflight_events` = 4: the rest wait in
/// the socket): every rule still holds per event, nothing is lost, and
/// answers name each event in order.
async fn pipelined_events_keep_their_rules(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[limits]\nmax_inflight_events = 4\n".into(),
            ..Default::default()
        },
    );
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let deleted = event(&k, 1, "to be deleted", &[]);
    c.publish_ok(&deleted).await;
    c.publish_ok(&event(&k, 5, "", &[&["e", &deleted.id.to_hex()]]))
        .await;
    let fresh: Vec<_> = (0..30)
        .map(|i| event(&k, 1, &format!("p{i}"), &[&["t", "pipe"]]))
        .collect();
    let mut sent = Vec::new();
    for (i, e) in fresh.iter().enumerate() {
        sent.push(e.clone());
        if i == 10 {
            sent.push(fresh[3].clone()); // a repeat within the same burst
            sent.push(deleted.clone()); // deleted by its author: stays deleted
        }
    }
    for e in &sent {
        c.send(json!(["EVENT", e])).await;
    }
    let mut answers: Vec<(String, bool, String)> = Vec::new();
    while answers.len() < sent.len() {
        let v = c.recv().await;
        if v[0] == "OK" {
            answers.push((
                v[1].as_str().unwrap().to_string(),
                v[2] == true,
                v[3].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    // One answer per message, in order.
    assert_eq!(
        answers.iter().map(|a| a.0.clone()).collect::<Vec<_>>(),
        sent.iter().map(|e| e.id.to_hex()).collect::<Vec<_>>()
    );
    let dup = answers
        .iter()
        .filter(|a| a.0 == fresh[3].id.to_hex())
        .collect::<Vec<_>>();
    assert!(dup[0].1 && dup[0].2.is_empty());
    assert!(dup[1].1 && dup[1].2.starts_with("duplicate:"), "{:?}", dup[1]);
    let del = answers.iter().find(|a| a.0 == deleted.id.to_hex()).unwrap();
    assert!(!del.1 && del.2.starts_with("blocked:"), "{del:?}");
    assert_eq!(
        c.req("all", vec![json!({"#t": ["pipe"]})]).await.events().len(),
        30
    );
    assert!(c
        .req("d", vec![json!({"ids": [deleted.id]})])
        .await
        .events()
        .is_empty());
    // Stored ones sent again in a burst (batches checking the store, not
    // the burst itself), the deleted one among them: each answered alone.
    let again: Vec<_> = fresh[..12].iter().chain([&deleted]).cloned().collect();
    for e in &again {
        c.send(json!(["EVENT", e])).await;
    }
    for e in &again {
        let v = loop {
            let v = c.recv().await;
            if v[0] == "OK" {
                break v;
            }
        };
        assert_eq!(v[1].as_str(), Some(e.id.to_hex().as_str()));
        let msg = v[3].as_str().unwrap_or("");
        if e.id == deleted.id {
            assert!(v[2] == false && msg.starts_with("blocked:"), "{v}");
        } else {
            assert!(v[2] == true && msg.starts_with("duplicate:"), "{v}");
        }
    }
}

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

async fn publish_and_query_every_filter_field(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let alice = Keys::generate();
    let bob = Keys::generate();
    let t = now() - 100;
    let e1 = event_at(&alice, 1, "one", &[&["t", "nostr"]], t);
    let e2 = event_at(
        &alice,
        7,
        "+",
        &[&["e", &e1.id.to_hex()], &["p", &hex(&bob)]],
        t + 10,
    );
    let e3 = event_at(&bob, 1, "three", &[&["t", "rust"]], t + 20);
    for e in [&e1, &e2, &e3] {
        c.publish_ok(e).await;
    }
    let ids = |evs: Vec<nostr::prelude::Event>| evs.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(c.req("a", vec![json!({"ids": [e2.id]})]).await.events()),
        vec![e2.id]
    );
    assert_eq!(
        ids(c.req("b", vec![json!({"authors": [hex(&alice)]})]).await.events()),
        vec![e2.id, e1.id]
    );
    assert_eq!(
        ids(c.req("c", vec![json!({"kinds": [1]})]).await.events()),
        vec![e3.id, e1.id]
    );
    assert_eq!(
        ids(c.req("d", vec![json!({"#t": ["rust"]})]).await.events()),
        vec![e3.id]
    );
    assert_eq!(
        ids(c.req("e", vec![json!({"#e": [e1.id]})]).await.events()),
        vec![e2.id]
    );
    assert_eq!(
        ids(c
            .req("f", vec![json!({"#p": [hex(&bob)], "kinds": [7]})])
            .await
            .events()),
        vec![e2.id]
    );
    assert_eq!(
        ids(c
            .req("g", vec![json!({"since": t + 5, "until": t + 15})])
            .await
            .events()),
        vec![e2.id]
    );
    assert_eq!(
        ids(c.req("h", vec![json!({"since": t + 20})]).await.events()),
        vec![e3.id]
    );
    assert_eq!(
        ids(c
            .req(
                "i",
                vec![json!({"#t": ["nostr", "rust"], "authors": [hex(&bob)]})]
            )
            .await
            .events()),
        vec![e3.id]
    );
    // Several filters in one REQ: union, no duplicates, newest first.
    let both = c
        .req(
            "j",
            vec![
                json!({"ids": [e1.id]}),
                json!({"kinds": [1]}),
                json!({"#t": ["rust"]}),
            ],
        )
        .await
        .events();
    assert_eq!(ids(both), vec![e3.id, e1.id]);
    // Nothing matches: just EOSE.
    assert!(c
        .req("k", vec![json!({"authors": [hex(&Keys::generate())]})])
        .await
        .events()
        .is_empty());
}

async fn limit_orders_newest_first_ties_by_lowest_id(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let t = now() - 50;
    let mut same: Vec<nostr::prelude::Event> = (0..4)
        .map(|i| event_at(&k, 1, &format!("tie {i}"), &[], t))
        .collect();
    let newer = event_at(&k, 1, "newer", &[], t + 1);
    let older = event_at(&k, 1, "older", &[], t - 1);
    for e in same.iter().chain([&newer, &older]) {
        c.publish_ok(e).await;
    }
    same.sort_by_key(|e| e.id);
    let got = c
        .req("l", vec![json!({"authors": [hex(&k)], "limit": 3})])
        .await
        .events();
    let want = vec![newer.id, same[0].id, same[1].id];
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), want);
    // limit 0: no stored events, still EOSE, then live events.
    let got = c
        .req("z", vec![json!({"authors": [hex(&k)], "limit": 0})])
        .await
        .events();
    assert!(got.is_empty());
    let live = event(&k, 1, "live", &[]);
    let mut other = Client::connect(&relay.ws_url()).await;
    other.publish_ok(&live).await;
    assert_eq!(c.next_event("z").await.id, live.id);
}

async fn live_events_after_eose_and_close(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut sub = Client::connect(&relay.ws_url()).await;
    let mut publisher = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    assert!(sub
        .req("s", vec![json!({"kinds": [1], "authors": [hex(&k)]})])
        .await
        .events()
        .is_empty());
    let e = event(&k, 1, "hello", &[]);
    publisher.publish_ok(&e).await;
    assert_eq!(sub.next_event("s").await.id, e.id);
    // A non-matching event is not delivered.
    publisher.publish_ok(&event(&k, 2, "other kind", &[])).await;
    sub.expect_silence(Duration::from_millis(300)).await;
    // After CLOSE nothing more arrives.
    sub.send(json!(["CLOSE", "s"])).await;
    sub.expect_silence(Duration::from_millis(200)).await;
    publisher.publish_ok(&event(&k, 1, "after close", &[])).await;
    sub.expect_silence(Duration::from_millis(300)).await;
    // Each event reaches a live subscriber once, even with two matching filters.
    let stored = sub
        .req("t", vec![json!({"kinds": [1]}), json!({"authors": [hex(&k)]})])
        .await
        .events();
    assert_eq!(stored.len(), 3, "hello, other kind and after close, each once");
    let e = event(&k, 1, "once", &[]);
    publisher.publish_ok(&e).await;
    assert_eq!(sub.next_event("t").await.id, e.id);
    sub.expect_silence(Duration::from_millis(300)).await;
}

async fn replaceable_and_addressable(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let t = now() - 100;
    let v1 = event_at(&k, 0, "{\"name\":\"v1\"}", &[], t);
    let v2 = event_at(&k, 0, "{\"name\":\"v2\"}", &[], t + 10);
    c.publish_ok(&v1).await;
    c.publish_ok(&v2).await;
    let (ok, msg) = c
        .publish(&event_at(&k, 0, "{\"name\":\"old\"}", &[], t + 5))
        .await;
    assert!(!ok && msg.starts_with("duplicate:"), "{msg}");
    let got = c
        .req("r", vec![json!({"kinds": [0], "authors": [hex(&k)]})])
        .await
        .events();
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![v2.id]);
    // Same created_at: the lowest id is kept whichever arrives first.
    let a = event_at(&k, 10002, "a", &[], t);
    let b = event_at(&k, 10002, "b", &[], t);
    let (low, high) = if a.id < b.id { (a, b) } else { (b, a) };
    c.publish_ok(&high).await;
    c.publish_ok(&low).await;
    let (ok, msg) = c.publish(&high).await;
    assert!(!ok && msg.starts_with("duplicate:"), "{msg}");
    let got = c
        .req("t", vec![json!({"kinds": [10002], "authors": [hex(&k)]})])
        .await
        .events();
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![low.id]);
    // Addressable: one per d tag.
    let x1 = event_at(&k, 30023, "x1", &[&["d", "x"]], t);
    let y1 = event_at(&k, 30023, "y1", &[&["d", "y"]], t);
    let x2 = event_at(&k, 30023, "x2", &[&["d", "x"]], t + 1);
    for e in [&x1, &y1, &x2] {
        c.publish_ok(e).await;
    }
    let got = c
        .req("a", vec![json!({"kinds": [30023], "authors": [hex(&k)]})])
        .await
        .events();
    let mut got_ids: Vec<_> = got.iter().map(|e| e.id).collect();
    got_ids.sort();
    let mut want = vec![x2.id, y1.id];
    want.sort();
    assert_eq!(got_ids, want);
    let got = c
        .req("d", vec![json!({"kinds": [30023], "#d": ["x"]})])
        .await
        .events();
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![x2.id]);
}

async fn ephemeral_fanned_out_never_stored(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut sub = Client::connect(&relay.ws_url()).await;
    let mut publisher = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    assert!(sub
        .req("e", vec![json!({"kinds": [20001]})])
        .await
        .events()
        .is_empty());
    let e = event(&k, 20001, "ephemeral", &[]);
    publisher.publish_ok(&e).await;
    assert_eq!(sub.next_event("e").await.id, e.id);
    assert!(publisher
        .req("q", vec![json!({"kinds": [20001]})])
        .await
        .events()
        .is_empty());
    assert!(publisher
        .req("q2", vec![json!({"ids": [e.id]})])
        .await
        .events()
        .is_empty());
}

async fn deletion_by_e_and_a_stays_deleted(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let mallory = Keys::generate();
    let t = now() - 100;
    let note = event_at(&k, 1, "to delete", &[], t);
    let keep = event_at(&k, 1, "keep", &[], t);
    c.publish_ok(&note).await;
    c.publish_ok(&keep).await;
    // Someone else's deletion request deletes nothing.
    c.publish_ok(&event(&mallory, 5, "", &[&["e", &note.id.to_hex()]]))
        .await;
    assert_eq!(
        c.req("a", vec![json!({"ids": [note.id]})]).await.events().len(),
        1
    );
    let del = event(&k, 5, "bye", &[&["e", &note.id.to_hex()]]);
    c.publish_ok(&del).await;
    assert!(c
        .req("b", vec![json!({"ids": [note.id]})])
        .await
        .events()
        .is_empty());
    assert_eq!(
        c.req("c", vec![json!({"ids": [keep.id]})]).await.events().len(),
        1
    );
    // The deletion request itself is stored and served.
    assert_eq!(
        c.req("d", vec![json!({"kinds": [5], "authors": [hex(&k)]})])
            .await
            .events()
            .len(),
        1
    );
    // Re-submitting the deleted event does not bring it back.
    let (ok, msg) = c.publish(&note).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert!(c
        .req("e", vec![json!({"ids": [note.id]})])
        .await
        .events()
        .is_empty());
    // By address: versions up to the deletion's created_at are gone, later ones allowed.
    let art = event_at(&k, 30023, "article", &[&["d", "post"]], t);
    c.publish_ok(&art).await;
    let addr = format!("30023:{}:post", hex(&k));
    c.publish_ok(&event_at(&k, 5, "", &[&["a", &addr]], t + 10)).await;
    assert!(c
        .req("f", vec![json!({"kinds": [30023], "authors": [hex(&k)]})])
        .await
        .events()
        .is_empty());
    let (ok, _) = c
        .publish(&event_at(&k, 30023, "article again", &[&["d", "post"]], t + 5))
        .await;
    assert!(!ok, "a version older than the deletion stays deleted");
    let newer = event_at(&k, 30023, "article v3", &[&["d", "post"]], t + 20);
    c.publish_ok(&newer).await;
    assert_eq!(
        c.req("g", vec![json!({"kinds": [30023], "authors": [hex(&k)]})])
            .await
            .events()[0]
            .id,
        newer.id
    );
}

async fn nip11_document_and_cors(backend: Backend) {
    let relay = Relay::start(&backend);
    let http = reqwest::Client::new();
    let resp = http
        .get(relay.http_url())
        .header("Accept", "application/nostr+json")
        .header("Origin", "https://example.org")
        .send()
        .await
        .expect("nip11");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["access-control-allow-origin"], "*");
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/nostr+json"));
    let doc: serde_json::Value = resp.json().await.expect("json");
    let pk = doc["self"].as_str().expect("self");
    assert_eq!(pk.len(), 64);
    assert_eq!(doc["pubkey"], pk);
    for nip in [1, 9, 11, 40, 42, 45, 70] {
        assert!(
            doc["supported_nips"].as_array().unwrap().contains(&json!(nip)),
            "NIP-{nip}"
        );
    }
    assert!(doc["software"].is_string() && doc["version"].is_string());
    let lim = &doc["limitation"];
    for key in [
        "max_message_length",
        "max_subscriptions",
        "max_filters",
        "max_limit",
        "max_event_tags",
        "max_event_bytes",
        "max_tag_value_bytes",
        "events_per_second",
        "max_outbound_bytes",
    ] {
        assert!(lim[key].as_u64().is_some(), "limitation.{key} missing: {lim}");
    }
    // Preflight.
    let pre = http
        .request(reqwest::Method::OPTIONS, relay.http_url())
        .header("Origin", "https://example.org")
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .expect("preflight");
    assert!(pre.status().is_success());
    assert_eq!(pre.headers()["access-control-allow-origin"], "*");
}

async fn expiration_nip40(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let past = (now() - 10).to_string();
    let (ok, msg) = c
        .publish(&event(&k, 1, "expired", &[&["expiration", &past]]))
        .await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let soon = (now() + 2).to_string();
    let e = event(&k, 1, "short lived", &[&["expiration", &soon]]);
    c.publish_ok(&e).await;
    assert_eq!(c.req("a", vec![json!({"ids": [e.id]})]).await.events().len(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(c.req("b", vec![json!({"ids": [e.id]})]).await.events().is_empty());
    assert_eq!(c.count("c", vec![json!({"ids": [e.id]})]).await.unwrap(), 0);
}

async fn auth_nip42(backend: Backend) {
    let relay = Relay::start(&backend);
    let k = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    // Wrong challenge.
    let bad = tests::client::auth_event(&k, "not-the-challenge", &relay.ws_url());
    c.send(json!(["AUTH", bad])).await;
    let (ok, msg) = c.wait_ok(&bad.id.to_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Wrong relay URL.
    let (ok, msg) = c.auth_as(&k, "ws://evil.example.com").await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Too old.
    let challenge = c.challenge.clone();
    let old = {
        use nostr::prelude::{EventBuilder, FinalizeEvent, Kind, Tag, Timestamp};
        EventBuilder::new(Kind::Authentication, "")
            .tags([
                Tag::custom("relay", [relay.ws_url()]),
                Tag::custom("challenge", [challenge]),
            ])
            .custom_created_at(Timestamp::from_secs(now() - 3600))
            .finalize(&k)
            .unwrap()
    };
    c.send(json!(["AUTH", old])).await;
    let (ok, msg) = c.wait_ok(&old.id.to_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Another connection's challenge is not this one's.
    let other = Client::connect(&relay.ws_url()).await;
    assert_ne!(other.challenge, c.challenge);
    let stolen = tests::client::auth_event(&k, &other.challenge, &relay.ws_url());
    c.send(json!(["AUTH", stolen])).await;
    assert!(!c.wait_ok(&stolen.id.to_hex()).await.0);
    // Right one; a trailing slash is fine.
    let (ok, msg) = c.auth_as(&k, &format!("{}/", relay.ws_url())).await;
    assert!(ok, "{msg}");
    // A bad signature is refused.
    let mut forged =
        serde_json::to_value(tests::client::auth_event(&k, &c.challenge, &relay.ws_url())).unwrap();
    forged["sig"] = json!("00".repeat(64));
    c.send(json!(["AUTH", forged])).await;
    let (ok, msg) = c.wait_ok(forged["id"].as_str().unwrap()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
}

async fn count_nip45(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    for i in 0..5 {
        c.publish_ok(&event(&k, 1, &format!("n{i}"), &[&["t", "count"]]))
            .await;
    }
    c.publish_ok(&event(&k, 7, "+", &[&["t", "count"]])).await;
    assert_eq!(
        c.count("c1", vec![json!({"authors": [hex(&k)]})]).await.unwrap(),
        6
    );
    assert_eq!(
        c.count("c2", vec![json!({"kinds": [1], "authors": [hex(&k)]})])
            .await
            .unwrap(),
        5
    );
    // Several filters count distinct events.
    assert_eq!(
        c.count(
            "c3",
            vec![
                json!({"kinds": [1], "authors": [hex(&k)]}),
                json!({"#t": ["count"]})
            ]
        )
        .await
        .unwrap(),
        6
    );
    assert_eq!(
        c.count("c4", vec![json!({"authors": [hex(&Keys::generate())]})])
            .await
            .unwrap(),
        0
    );
}

async fn protected_nip70(backend: Backend) {
    let relay = Relay::start(&backend);
    let k = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    let e = event(&k, 1, "protected", &[&["-"]]);
    let (ok, msg) = c.publish(&e).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    c.auth(&Keys::generate()).await;
    let (ok, msg) = c.publish(&e).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let mut author = Client::connect(&relay.ws_url()).await;
    author.auth(&k).await;
    author.publish_ok(&e).await;
    assert_eq!(c.req("p", vec![json!({"ids": [e.id]})]).await.events().len(), 1);
}

async fn p_gated_kinds(backend: Backend) {
    // 24620 (ephemeral) and 1059 (stored) are both gated here.
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "p_gated_kinds = [24620, 1059]\n".into(),
            ..Default::default()
        },
    );
    let target = Keys::generate();
    let other = Keys::generate();
    let sender = Keys::generate();
    let mut anon = Client::connect(&relay.ws_url()).await;
    let mut wrong = Client::connect(&relay.ws_url()).await;
    wrong.auth(&other).await;
    let mut right = Client::connect(&relay.ws_url()).await;
    right.auth(&target).await;
    // Asking for a gated kind without auth, or for someone else's #p.
    let msg = anon.req("g", vec![json!({"kinds": [24620]})]).await.closed();
    assert!(msg.starts_with("auth-required:"), "{msg}");
    let msg = wrong
        .req("g", vec![json!({"kinds": [24620], "#p": [hex(&target)]})])
        .await
        .closed();
    assert!(msg.starts_with("restricted:"), "{msg}");
    let msg = anon.count("g", vec![json!({"kinds": [1059]})]).await.unwrap_err();
    assert!(msg.starts_with("auth-required:"), "{msg}");
    // Kind-less filters are allowed but never carry a gated event to the wrong reader.
    anon.req("all", vec![json!({"authors": [hex(&sender)]})])
        .await
        .events();
    wrong
        .req("all", vec![json!({"authors": [hex(&sender)]})])
        .await
        .events();
    wrong
        .req("mine", vec![json!({"kinds": [24620, 1059]})])
        .await
        .events();
    right
        .req("mine", vec![json!({"kinds": [24620], "#p": [hex(&target)]})])
        .await
        .events();
    let mut publisher = Client::connect(&relay.ws_url()).await;
    let wake = event(&sender, 24620, "", &[&["p", &hex(&target)]]);
    publisher.publish_ok(&wake).await;
    assert_eq!(right.next_event("mine").await.id, wake.id);
    anon.expect_silence(Duration::from_millis(400)).await;
    wrong.expect_silence(Duration::from_millis(200)).await;
    // A stored gated event: invisible to every way of asking but the target's.
    let sealed = event(&sender, 1059, "sealed", &[&["p", &hex(&target)]]);
    publisher.publish_ok(&sealed).await;
    anon.expect_silence(Duration::from_millis(300)).await;
    wrong.expect_silence(Duration::from_millis(200)).await;
    for (c, name) in [(&mut anon, "anon"), (&mut wrong, "wrong")] {
        assert!(
            c.req("q1", vec![json!({"ids": [sealed.id]})])
                .await
                .events()
                .is_empty(),
            "{name} by id"
        );
        assert!(
            c.req("q2", vec![json!({})]).await.events().is_empty(),
            "{name} empty filter"
        );
        assert!(
            c.req("q3", vec![json!({"#p": [hex(&target)]})])
                .await
                .events()
                .is_empty(),
            "{name} by #p"
        );
        assert_eq!(
            c.count("q4", vec![json!({"authors": [hex(&sender)]})])
                .await
                .unwrap(),
            0,
            "{name} count"
        );
    }
    assert_eq!(
        right
            .req("q", vec![json!({"ids": [sealed.id]})])
            .await
            .events()
            .len(),
        1
    );
    assert_eq!(
        right
            .count("q", vec![json!({"authors": [hex(&sender)]})])
            .await
            .unwrap(),
        1
    );
    // A regular event from the same author still flows to the kind-less filters.
    let note = event(&sender, 1, "public", &[]);
    publisher.publish_ok(&note).await;
    assert_eq!(anon.next_event("all").await.id, note.id);
    assert_eq!(wrong.next_event("all").await.id, note.id);
}

async fn limits_are_enforced(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[limits]\nmax_message_bytes = 4096\nmax_event_bytes = 2048\nmax_tags_per_event = 5\nmax_tag_value_bytes = 64\nmax_subscriptions = 2\nmax_filters = 2\nmax_limit = 3\nevents_per_second = 5\nevents_burst = 5\nmax_filter_values = 4\n".into(),
            ..Default::default()
        },
    );
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let expect = |(ok, msg): (bool, String), prefix: &str| {
        assert!(
            !ok && msg.starts_with(prefix),
            "expected {prefix} got ok={ok} {msg}"
        );
    };
    // Event size, tags, tag value size.
    expect(c.publish(&event(&k, 1, &"x".repeat(2100), &[])).await, "invalid:");
    let many: Vec<Vec<String>> = (0..6).map(|i| vec!["t".to_string(), format!("{i}")]).collect();
    let many_refs: Vec<Vec<&str>> = many
        .iter()
        .map(|t| t.iter().map(String::as_str).collect())
        .collect();
    let many_slices: Vec<&[&str]> = many_refs.iter().map(Vec::as_slice).collect();
    expect(c.publish(&event(&k, 1, "tags", &many_slices)).await, "invalid:");
    expect(
        c.publish(&event(&k, 1, "long tag", &[&["t", &"v".repeat(65)]]))
            .await,
        "invalid:",
    );
    // Message size: above max_message_bytes is answered, the connection survives.
    let big = event(&k, 1, &"y".repeat(5000), &[]);
    expect(c.publish(&big).await, "invalid:");
    // Filters per REQ, values per filter, subscriptions per connection.
    let msg = c.req("f", vec![json!({}), json!({}), json!({})]).await.closed();
    assert!(msg.starts_with("invalid:"), "{msg}");
    let msg = c.req("v", vec![json!({"kinds": [1, 2, 3, 4, 5]})]).await.closed();
    assert!(msg.starts_with("invalid:"), "{msg}");
    c.req("s1", vec![json!({"kinds": [1]})]).await.events();
    c.req("s2", vec![json!({"kinds": [1]})]).await.events();
    let msg = c.req("s3", vec![json!({"kinds": [1]})]).await.closed();
    assert!(msg.starts_with("blocked:"), "{msg}");
    // Replacing an open subscription is not a new one.
    c.req("s2", vec![json!({"kinds": [2]})]).await.events();
    c.send(json!(["CLOSE", "s1"])).await;
    c.send(json!(["CLOSE", "s2"])).await;
    // Rate: the burst passes, then rate-limited (refill the bucket first:
    // the rejected events above took tokens too).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut limited = 0;
    for i in 0..12 {
        let (ok, msg) = c.publish(&event(&k, 1, &format!("r{i}"), &[])).await;
        if !ok {
            assert!(msg.starts_with("rate-limited:"), "{msg}");
            limited += 1;
        }
    }
    assert!(limited >= 5, "only {limited} of 12 rate limited");
    // limit is clamped to max_limit.
    let got = c
        .req("lim", vec![json!({"authors": [hex(&k)], "limit": 100})])
        .await
        .events();
    assert_eq!(got.len(), 3);
    // A frame above twice max_message_bytes closes the connection with 1009.
    c.send_raw(format!("[\"EVENT\",{}]", "z".repeat(9000))).await;
    let frame = c
        .closed_by_relay(Duration::from_secs(5))
        .await
        .expect("connection closed");
    if let Some(f) = frame {
        assert_eq!(u16::from(f.code), 1009);
    }
    // Other clients are unaffected.
    let mut d = Client::connect(&relay.ws_url()).await;
    assert_eq!(
        d.req("ok", vec![json!({"authors": [hex(&k)]})])
            .await
            .events()
            .len(),
        3
    );
}

async fn malformed_input_answers(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    for bad in [
        "not json",
        "{}",
        "[]",
        "[42]",
        "[\"HELLO\",1]",
        "[\"CLOSE\"]",
        "[\"REQ\"]",
    ] {
        c.send_raw(bad).await;
        let v = c.recv().await;
        assert_eq!(v[0], "NOTICE", "{bad} -> {v}");
        assert!(v[1].as_str().unwrap().starts_with("invalid:"), "{v}");
    }
    // A REQ with a bad filter names the subscription.
    c.send(json!(["REQ", "badf", {"kinds": "one"}])).await;
    let v = c.recv().await;
    assert_eq!(v, json!(["CLOSED", "badf", v[2]]));
    assert!(v[2].as_str().unwrap().starts_with("invalid:"));
    // Bad id and bad signature name the event.
    let good = event(&k, 1, "good", &[]);
    let mut bad_id = serde_json::to_value(&good).unwrap();
    bad_id["content"] = json!("tampered");
    c.send(json!(["EVENT", bad_id])).await;
    let (ok, msg) = c.wait_ok(&good.id.to_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let mut bad_sig = serde_json::to_value(&good).unwrap();
    bad_sig["sig"] = json!("ab".repeat(64));
    c.send(json!(["EVENT", bad_sig])).await;
    let (ok, msg) = c.wait_ok(&good.id.to_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Malformed event body with a readable id.
    c.send(json!(["EVENT", {"id": good.id.to_hex(), "kind": "x"}]))
        .await;
    let (ok, msg) = c.wait_ok(&good.id.to_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Far future created_at (`max_future_secs`, 15 minutes by default; a
    // larger bound lifts it).
    let future = event_at(&k, 1, "future", &[], now() + 3600);
    let (ok, msg) = c.publish(&future).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let by_default = Relay::start(&backend);
    let mut plain = Client::connect(&by_default.ws_url()).await;
    let ten_years = event_at(&k, 1, "ten years", &[], now() + 10 * 365 * 86_400);
    let (ok, msg) = plain.publish(&ten_years).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    plain.publish_ok(&event_at(&k, 1, "soon", &[], now() + 600)).await;
    let unbounded = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[limits]\nmax_future_secs = 9223372036854775807\n".into(),
            ..Default::default()
        },
    );
    let mut open = Client::connect(&unbounded.ws_url()).await;
    open.publish_ok(&event_at(&k, 1, "next year", &[], now() + 366 * 86_400))
        .await;
    // The connection survived all of it.
    c.publish_ok(&good).await;
    let (ok, msg) = c.publish(&good).await;
    assert!(ok && msg.starts_with("duplicate:"), "{msg}");
    assert_eq!(
        c.req("after", vec![json!({"ids": [good.id]})])
            .await
            .events()
            .len(),
        1
    );
}

async fn slow_reader_is_disconnected(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml:
                "[limits]\nmax_outbound_bytes = 65536\nevents_per_second = 100000\nevents_burst = 100000\n"
                    .into(),
            ..Default::default()
        },
    );
    // A client with a tiny receive buffer that subscribes and then never reads.
    let mut slow = Client::connect_small_receive_buffer(&relay.ws_url()).await;
    slow.send(json!(["REQ", "all", {"kinds": [1]}])).await;
    let mut fast = Client::connect(&relay.ws_url()).await;
    fast.req("all", vec![json!({"kinds": [1]})]).await.events();
    let mut publisher = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let filler = "f".repeat(8000);
    // Enough to fill the relay's socket send buffer (at most 4 MiB here) and
    // then the slow reader's 64 KiB queue.
    let mut last = None;
    for i in 0..800 {
        let e = event(&k, 1, &format!("{i}{filler}"), &[]);
        publisher.publish_ok(&e).await;
        last = Some(e.id);
        // The fast reader keeps up and sees every event.
        assert_eq!(fast.next_event("all").await.id, e.id);
    }
    assert!(last.is_some());
    // The slow reader was cut off: reading now ends before all 400 events arrive.
    let mut received = 0;
    loop {
        match slow.try_recv(Duration::from_secs(3)).await {
            Some(v) if v[0] == "EVENT" => received += 1,
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        received < 800,
        "slow reader got all {received} events; it should have been disconnected"
    );
    assert!(
        relay.log().contains("slow reader disconnected"),
        "relay did not log the disconnect"
    );
}

async fn communities_are_isolated(backend: Backend) {
    let relay = Relay::start(&backend);
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
    let listed = relay.cli(&["community", "list"]);
    assert!(listed.lines().any(|l| l.starts_with("other\t")), "{listed}");
    assert!(listed.lines().any(|l| l.starts_with("default\t")), "{listed}");
    let mut a = Client::connect(&relay.ws_url()).await;
    let mut b = Client::connect_host(&relay.ws_url(), Some("other.test"))
        .await
        .expect("other community");
    let k = Keys::generate();
    let e = event(&k, 1, "same event, two communities", &[]);
    a.publish_ok(&e).await;
    // Not visible in the other community, even by id.
    assert!(b.req("x", vec![json!({"ids": [e.id]})]).await.events().is_empty());
    assert_eq!(b.count("x", vec![json!({"ids": [e.id]})]).await.unwrap(), 0);
    // The same event sent to the other community is stored there separately.
    b.publish_ok(&e).await;
    assert_eq!(b.req("y", vec![json!({"ids": [e.id]})]).await.events().len(), 1);
    // Live events do not cross either.
    a.req("live", vec![json!({"authors": [hex(&k)], "limit": 0})])
        .await
        .events();
    let only_b = event(&k, 1, "only in other", &[]);
    b.publish_ok(&only_b).await;
    a.expect_silence(Duration::from_millis(400)).await;
    // Each community has its own key, and NIP-11 says so.
    let http = reqwest::Client::new();
    let info = |host: &'static str| {
        http.get(relay.http_url())
            .header("Host", host)
            .header("Accept", "application/nostr+json")
            .send()
    };
    let da: serde_json::Value = info("127.0.0.1").await.unwrap().json().await.unwrap();
    let db: serde_json::Value = info("other.test").await.unwrap().json().await.unwrap();
    assert_ne!(da["self"], db["self"]);
    // Unknown hosts fail closed: HTTP 404 and no WebSocket.
    let r = info("unknown.test").await.unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unknown_host");
    assert!(Client::connect_host(&relay.ws_url(), Some("unknown.test"))
        .await
        .is_err());
    // The dashboard's page and files too: 404 for an unknown host, served
    // to a known one.
    for path in ["/ui", "/ui/", "/ui/app.js", "/ui/app.css"] {
        let url = format!("{}{path}", relay.http_url());
        let r = http
            .get(&url)
            .header("Host", "unknown.test")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "unknown_host", "{path}");
        let r = http.get(&url).header("Host", "other.test").send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // AUTH in the other community must name the other community's URL.
    let (ok, _) = b.auth_as(&k, &relay.ws_url()).await;
    assert!(!ok);
    let (ok, msg) = b.auth_as(&k, "ws://other.test").await;
    assert!(ok, "{msg}");
}

async fn acknowledged_events_survive_sigkill(backend: Backend) {
    let mut relay = Relay::start(&backend);
    let k = Keys::generate();
    let mut acked = Vec::new();
    {
        let mut c = Client::connect(&relay.ws_url()).await;
        for i in 0..40 {
            let e = event(&k, 1, &format!("durable {i}"), &[]);
            c.send(json!(["EVENT", e])).await;
            acked.push(e);
        }
        for e in &acked {
            let (ok, msg) = c.wait_ok(&e.id.to_hex()).await;
            assert!(ok, "{msg}");
        }
        // Kill immediately after the last OK, with the connection still open.
        relay.kill();
    }
    relay.restart();
    let mut c = Client::connect(&relay.ws_url()).await;
    let got = c
        .req("all", vec![json!({"authors": [hex(&k)], "limit": 1000})])
        .await
        .events();
    assert_eq!(got.len(), acked.len(), "acknowledged events lost after SIGKILL");
}

async fn graceful_shutdown_closes_sockets(backend: Backend) {
    let mut relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    c.req("s", vec![json!({"kinds": [1]})]).await.events();
    let status = relay.terminate();
    assert!(status.success(), "relay exited with {status}");
    let frame = c
        .closed_by_relay(Duration::from_secs(5))
        .await
        .expect("socket closed on shutdown");
    let f = frame.expect("a close frame was sent");
    assert_eq!(u16::from(f.code), 1001);
}

/// SIGTERM while a client streams events: the relay reads nothing more,
/// answers every event it had read, then closes and exits 0. What is
/// stored afterwards is exactly what was answered `OK true`: nothing
/// stored without its OK (the client would send it again), nothing
/// acknowledged and lost.
async fn sigterm_answers_every_event_it_read(backend: Backend) {
    let options = RelayOptions {
        config_toml: "[limits]\nevents_per_second = 100000\nevents_burst = 100000\n".into(),
        ..Default::default()
    };
    let mut relay = Relay::start_opts(&backend, options);
    let k = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    let sent: Vec<_> = (0..400)
        .map(|i| event(&k, 1, &format!("drain {i}"), &[]))
        .collect();
    for e in &sent {
        c.send(json!(["EVENT", e])).await;
    }
    let mut answered = std::collections::BTreeSet::new();
    // The relay is mid-stream once its first answer comes.
    loop {
        let v = c.recv().await;
        if v[0] == "OK" {
            assert_eq!(v[2], true, "{v}");
            answered.insert(v[1].as_str().unwrap().to_string());
            break;
        }
    }
    let status = relay.terminate();
    assert!(status.success(), "relay exited with {status}");
    while let Some(v) = c.try_recv(Duration::from_secs(5)).await {
        if v[0] == "OK" {
            assert_eq!(v[2], true, "{v}");
            answered.insert(v[1].as_str().unwrap().to_string());
        }
    }
    relay.restart();
    let mut c = Client::connect(&relay.ws_url()).await;
    let stored: std::collections::BTreeSet<String> = c
        .req("all", vec![json!({"authors": [hex(&k)], "limit": 1000})])
        .await
        .events()
        .iter()
        .map(|e| e.id.to_hex())
        .collect();
    assert_eq!(
        stored.difference(&answered).count(),
        0,
        "stored without an OK ({} answered, {} stored of {})",
        answered.len(),
        stored.len(),
        sent.len()
    );
    assert_eq!(stored, answered, "answered OK true but not stored");
}

/// The tag index never outlives its event: rows written one event at a time
/// and in batches, then every way an event leaves the store (NIP-09 by id and
/// by address, replacement, NIP-40 expiry) takes its tag rows along, and no
/// tag row points at a missing event. On PostgreSQL a trigger does this (a
/// foreign key cost 40% of ingest), on SQLite a cascading foreign key.
async fn tag_rows_follow_their_event(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "expiry_sweep_interval_secs = 1\n".into(),
            ..Default::default()
        },
    );
    let store = &relay.store;
    let tag_rows = |id: &nostr::prelude::EventId| {
        store.sql(&format!(
            "SELECT count(*) FROM event_tags WHERE event_id = {}",
            store.blob(&id.to_hex())
        ))
    };
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let bob = hex(&Keys::generate());
    let t = now() - 100;
    let tags: &[&[&str]] = &[&["t", "follow"], &["p", &bob]];

    let by_id = event_at(&k, 1, "deleted by id", tags, t);
    let keep = event_at(&k, 1, "kept", tags, t);
    let art = event_at(
        &k,
        30023,
        "deleted by address",
        &[&["d", "gone"], &["t", "follow"]],
        t,
    );
    let list_v1 = event_at(
        &k,
        10002,
        "v1",
        &[&["r", "wss://one.example"], &["t", "follow"]],
        t,
    );
    let list_v2 = event_at(&k, 10002, "v2", &[&["r", "wss://two.example"]], t + 1);
    // Expires in 5 s: its tag rows are looked at as soon as it is stored
    // (on a loaded machine the burst below can take longer than that).
    let soon = (now() + 5).to_string();
    let expiring = event(&k, 1, "expiring", &[&["t", "follow"], &["expiration", &soon]]);
    c.publish_ok(&expiring).await;
    assert_ne!(tag_rows(&expiring.id), "0", "indexed on arrival: expiring");
    for e in [&by_id, &keep, &art, &list_v1] {
        c.publish_ok(e).await;
    }
    // A burst: stored by the batch writer, tag rows in their own statement.
    let burst: Vec<_> = (0..20)
        .map(|i| event_at(&k, 1, &format!("burst {i}"), tags, t + 2))
        .collect();
    c.publish_all_ok(&burst).await;
    for e in [&by_id, &keep, &art, &list_v1].into_iter().chain(&burst) {
        assert_ne!(tag_rows(&e.id), "0", "indexed on arrival: {}", e.content);
    }

    c.publish_ok(&event(&k, 5, "", &[&["e", &by_id.id.to_hex()]]))
        .await;
    let addr = format!("30023:{}:gone", hex(&k));
    c.publish_ok(&event_at(&k, 5, "", &[&["a", &addr]], t + 10)).await;
    c.publish_ok(&list_v2).await;
    for e in [&by_id, &art, &list_v1] {
        assert_eq!(tag_rows(&e.id), "0", "tags left behind: {}", e.content);
    }
    // The sweep deletes the expired event (not only hides it).
    let row = format!(
        "SELECT count(*) FROM events WHERE id = {}",
        store.blob(&expiring.id.to_hex())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.sql(&row) != "0" {
        assert!(std::time::Instant::now() < deadline, "expired event never swept");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(tag_rows(&expiring.id), "0", "tags of a swept event left behind");

    assert_eq!(tag_rows(&keep.id), "2");
    assert_ne!(tag_rows(&list_v2.id), "0");
    assert_eq!(
        store.sql(
            "SELECT count(*) FROM event_tags t WHERE NOT EXISTS (SELECT 1 FROM events e \
             WHERE e.community_id = t.community_id AND e.id = t.event_id)"
        ),
        "0",
        "a tag row points at a missing event"
    );
    let got = c.req("f", vec![json!({"#t": ["follow"]})]).await.events();
    assert_eq!(got.len(), 1 + burst.len());
}
