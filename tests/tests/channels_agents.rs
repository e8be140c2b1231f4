//! Channels (NIP-29 subset), managed agents (NIP-OA) and NIP-98 HTTP auth,
//! over real sockets, on every backend.

use std::time::Duration;

use nostr::prelude::{Event, Keys};
use serde_json::json;
use tests::{backend_tests, event, http_nip98, http_raw, Backend, Client, Relay, RelayOptions};

backend_tests!(
    channel_life_cycle,
    closed_channel_join_requests,
    channel_creation_policy,
    private_channel_privacy,
    agent_registration_is_immutable,
    nip98_failures_are_named,
    shared_authors_across_writers,
);

fn hex(k: &Keys) -> String {
    k.public_key().to_hex()
}

async fn relay_pubkey(relay: &Relay) -> String {
    let resp = reqwest::Client::new()
        .get(relay.http_url())
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .unwrap();
    let doc: serde_json::Value = resp.json().await.unwrap();
    doc["self"].as_str().unwrap().to_string()
}

/// A client authenticated as `keys`.
async fn authed(relay: &Relay, keys: &Keys) -> Client {
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(keys).await;
    c
}

fn tag_values(e: &Event, name: &str) -> Vec<String> {
    e.tags
        .iter()
        .filter(|t| t.kind() == name)
        .filter_map(|t| t.content().map(str::to_string))
        .collect()
}

async fn metadata(c: &mut Client, relay_pk: &str, kind: u16, channel: &str) -> Event {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let sub = format!("meta{}", N.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
    let got = c
        .req(
            &sub,
            vec![json!({"kinds": [kind], "authors": [relay_pk], "#d": [channel]})],
        )
        .await
        .events();
    c.send(json!(["CLOSE", sub])).await;
    assert_eq!(got.len(), 1, "one current {kind} for {channel}: {got:?}");
    got.into_iter().next().unwrap()
}

async fn channel_life_cycle(backend: Backend) {
    let relay = Relay::start(&backend);
    let relay_pk = relay_pubkey(&relay).await;
    let alice = Keys::generate();
    let bob = Keys::generate();
    let mut a = authed(&relay, &alice).await;
    let mut b = Client::connect(&relay.ws_url()).await;

    a.publish_ok(&event(
        &alice,
        9007,
        "",
        &[&["h", "general"], &["name", "General"]],
    ))
    .await;
    let (ok, msg) = a.publish(&event(&alice, 9007, "", &[&["h", "general"]])).await;
    assert!(!ok && msg.starts_with("duplicate:"), "{msg}");
    // Relay-signed metadata, admins and members.
    let meta = metadata(&mut a, &relay_pk, 39000, "general").await;
    assert_eq!(tag_values(&meta, "name"), vec!["General"]);
    assert!(meta.tags.iter().any(|t| t.kind() == "public") && meta.tags.iter().any(|t| t.kind() == "open"));
    assert_eq!(
        tag_values(&metadata(&mut a, &relay_pk, 39001, "general").await, "p"),
        vec![hex(&alice)]
    );
    assert_eq!(
        tag_values(&metadata(&mut a, &relay_pk, 39002, "general").await, "p"),
        vec![hex(&alice)]
    );

    // A non-member cannot write; after joining (open channel) they can.
    let (ok, msg) = b.publish(&event(&bob, 9, "hi", &[&["h", "general"]])).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let (ok, msg) = b
        .publish(&event(&bob, 1, "any h-tagged kind", &[&["h", "general"]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    b.publish_ok(&event(&bob, 9021, "", &[&["h", "general"]])).await;
    let msg9 = event(&bob, 9, "hi", &[&["h", "general"]]);
    b.publish_ok(&msg9).await;
    let mut members = tag_values(&metadata(&mut a, &relay_pk, 39002, "general").await, "p");
    members.sort();
    let mut want = vec![hex(&alice), hex(&bob)];
    want.sort();
    assert_eq!(members, want);
    // Unknown channel.
    let (ok, msg) = b.publish(&event(&bob, 9, "x", &[&["h", "nowhere"]])).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");

    // Only admins moderate and edit.
    let (ok, msg) = b
        .publish(&event(&bob, 9002, "", &[&["h", "general"], &["name", "Mine"]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let (ok, msg) = b
        .publish(&event(&bob, 9001, "", &[&["h", "general"], &["p", &hex(&alice)]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    a.publish_ok(&event(
        &alice,
        9002,
        "",
        &[&["h", "general"], &["name", "Town square"], &["about", "all"]],
    ))
    .await;
    let meta = metadata(&mut a, &relay_pk, 39000, "general").await;
    assert_eq!(tag_values(&meta, "name"), vec!["Town square"]);
    assert_eq!(tag_values(&meta, "about"), vec!["all"]);

    // Removal revokes writing; a put-user restores it, with a role.
    a.publish_ok(&event(&alice, 9001, "", &[&["h", "general"], &["p", &hex(&bob)]]))
        .await;
    let (ok, msg) = b
        .publish(&event(&bob, 9, "still here?", &[&["h", "general"]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    a.publish_ok(&event(
        &alice,
        9000,
        "",
        &[&["h", "general"], &["p", &hex(&bob), "admin"]],
    ))
    .await;
    let mut admins = tag_values(&metadata(&mut a, &relay_pk, 39001, "general").await, "p");
    admins.sort();
    assert_eq!(admins, want);
    b.publish_ok(&event(&bob, 9, "back", &[&["h", "general"]])).await;
    // Leaving.
    b.publish_ok(&event(&bob, 9022, "", &[&["h", "general"]])).await;
    let (ok, _) = b.publish(&event(&bob, 9, "gone", &[&["h", "general"]])).await;
    assert!(!ok);
    assert_eq!(
        tag_values(&metadata(&mut a, &relay_pk, 39002, "general").await, "p"),
        vec![hex(&alice)]
    );

    // Deleting the channel makes its events unreadable, every way.
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher.req("w", vec![json!({"kinds": [9]})]).await.events();
    assert!(!a
        .req("h", vec![json!({"#h": ["general"]})])
        .await
        .events()
        .is_empty());
    let (ok, msg) = b.publish(&event(&bob, 9008, "", &[&["h", "general"]])).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    a.publish_ok(&event(&alice, 9008, "", &[&["h", "general"]])).await;
    assert!(a
        .req("h2", vec![json!({"#h": ["general"]})])
        .await
        .events()
        .is_empty());
    assert!(a
        .req("id", vec![json!({"ids": [msg9.id]})])
        .await
        .events()
        .is_empty());
    assert!(a
        .req(
            "m",
            vec![json!({"kinds": [39000, 39001, 39002], "#d": ["general"]})]
        )
        .await
        .events()
        .is_empty());
    assert_eq!(a.count("c", vec![json!({"kinds": [9]})]).await.unwrap(), 0);
    let (ok, msg) = a
        .publish(&event(&alice, 9, "into the void", &[&["h", "general"]]))
        .await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, msg) = a.publish(&event(&alice, 9007, "", &[&["h", "general"]])).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    watcher.expect_silence(Duration::from_millis(300)).await;
}

async fn closed_channel_join_requests(backend: Backend) {
    let relay = Relay::start(&backend);
    let alice = Keys::generate();
    let carol = Keys::generate();
    let mut a = authed(&relay, &alice).await;
    let mut c = Client::connect(&relay.ws_url()).await;
    a.publish_ok(&event(&alice, 9007, "", &[&["h", "staff"], &["closed"]]))
        .await;
    // The join request is held: not a member yet.
    c.publish_ok(&event(&carol, 9021, "", &[&["h", "staff"]])).await;
    let (ok, msg) = c
        .publish(&event(&carol, 9, "let me in", &[&["h", "staff"]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    // An admin accepts it.
    a.publish_ok(&event(&alice, 9000, "", &[&["h", "staff"], &["p", &hex(&carol)]]))
        .await;
    c.publish_ok(&event(&carol, 9, "thanks", &[&["h", "staff"]]))
        .await;
    // Opening the channel lets joins through directly.
    a.publish_ok(&event(&alice, 9002, "", &[&["h", "staff"], &["open"]]))
        .await;
    let dave = Keys::generate();
    c.publish_ok(&event(&dave, 9021, "", &[&["h", "staff"]])).await;
    c.publish_ok(&event(&dave, 9, "direct", &[&["h", "staff"]])).await;
}

async fn channel_creation_policy(backend: Backend) {
    let boss = Keys::generate();
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: format!(
                "[communities.default.channels]\ncreate = \"allowlist\"\ncreators = [\"{}\"]\n",
                hex(&boss)
            ),
            ..Default::default()
        },
    );
    let someone = Keys::generate();
    let mut anon = Client::connect(&relay.ws_url()).await;
    let (ok, msg) = anon.publish(&event(&someone, 9007, "", &[&["h", "x"]])).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    let mut s = authed(&relay, &someone).await;
    let (ok, msg) = s.publish(&event(&someone, 9007, "", &[&["h", "x"]])).await;
    assert!(
        !ok && msg.starts_with("restricted:"),
        "not on the allowlist: {msg}"
    );
    // Authenticated as someone else than the author.
    let (ok, msg) = s.publish(&event(&boss, 9007, "", &[&["h", "x"]])).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let mut b = authed(&relay, &boss).await;
    b.publish_ok(&event(&boss, 9007, "", &[&["h", "x"]])).await;
    // Without an h tag there is nothing to create.
    let (ok, msg) = b.publish(&event(&boss, 9007, "", &[])).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
}

async fn private_channel_privacy(backend: Backend) {
    let relay = Relay::start(&backend);
    let alice = Keys::generate();
    let bob = Keys::generate();
    let eve = Keys::generate();
    let mut a = authed(&relay, &alice).await;
    a.publish_ok(&event(
        &alice,
        9007,
        "",
        &[&["h", "secret"], &["private"], &["closed"]],
    ))
    .await;
    a.publish_ok(&event(&alice, 9000, "", &[&["h", "secret"], &["p", &hex(&bob)]]))
        .await;
    let mut b = authed(&relay, &bob).await;
    let mut e = authed(&relay, &eve).await;
    let mut anon = Client::connect(&relay.ws_url()).await;
    for c in [&mut b, &mut e, &mut anon] {
        c.req("live", vec![json!({"kinds": [9]}), json!({"#h": ["secret"]})])
            .await
            .events();
    }
    let m = event(&alice, 9, "eyes only", &[&["h", "secret"]]);
    a.publish_ok(&m).await;
    // Live: the member sees it, nobody else.
    assert_eq!(b.next_event("live").await.id, m.id);
    e.expect_silence(Duration::from_millis(300)).await;
    anon.expect_silence(Duration::from_millis(200)).await;
    // Stored: every way of asking.
    for (c, who) in [(&mut e, "non-member"), (&mut anon, "anonymous")] {
        assert!(
            c.req("q1", vec![json!({"ids": [m.id]})])
                .await
                .events()
                .is_empty(),
            "{who} by id"
        );
        assert!(
            c.req("q2", vec![json!({"#h": ["secret"]})])
                .await
                .events()
                .is_empty(),
            "{who} by #h"
        );
        assert!(
            c.req("q3", vec![json!({})]).await.events().is_empty(),
            "{who} empty filter"
        );
        assert!(
            c.req(
                "q4",
                vec![json!({"kinds": [39000, 39001, 39002], "#d": ["secret"]})]
            )
            .await
            .events()
            .is_empty(),
            "{who} metadata"
        );
        assert_eq!(
            c.count("q5", vec![json!({"authors": [hex(&alice)]})])
                .await
                .unwrap(),
            0,
            "{who} count"
        );
    }
    assert_eq!(b.req("q", vec![json!({"ids": [m.id]})]).await.events().len(), 1);
    // Making it public makes it readable.
    a.publish_ok(&event(&alice, 9002, "", &[&["h", "secret"], &["public"]]))
        .await;
    assert_eq!(
        anon.req("p", vec![json!({"ids": [m.id]})]).await.events().len(),
        1
    );
}

async fn agent_registration_is_immutable(backend: Backend) {
    let relay = Relay::start(&backend);
    let owner = Keys::generate();
    let other_owner = Keys::generate();
    let agent = Keys::generate();
    let host = relay.addr.to_string();
    let mut c = Client::connect(&relay.ws_url()).await;
    let profile = |tags: Vec<nostr::prelude::Tag>| {
        nostr::prelude::EventBuilder::new(nostr::prelude::Kind::Metadata, "{\"name\":\"agent\"}")
            .tags(tags)
            .finalize(&agent)
            .unwrap()
    };
    use nostr::prelude::FinalizeEvent;
    let attest = |o: &Keys, cond: &str| protocol::nip_oa::sign(o, &agent.public_key(), cond).unwrap();
    // Invalid attestations.
    let good = attest(&owner, "kind=0&kind=9");
    let (ok, msg) = c.publish(&profile(vec![good.clone(), good.clone()])).await;
    assert!(!ok && msg.starts_with("invalid:"), "two auth tags: {msg}");
    let s = good.as_slice().to_vec();
    let forged = nostr::prelude::Tag::custom("auth", [s[1].clone(), "kind=1".to_string(), s[3].clone()]);
    let (ok, msg) = c.publish(&profile(vec![forged])).await;
    assert!(
        !ok && msg.starts_with("invalid:"),
        "signature over other conditions: {msg}"
    );
    let bad_cond = nostr::prelude::Tag::custom("auth", [s[1].clone(), "kind=x".to_string(), s[3].clone()]);
    let (ok, msg) = c.publish(&profile(vec![bad_cond])).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let self_tag = nostr::prelude::Tag::custom("auth", [hex(&agent), String::new(), s[3].clone()]);
    let (ok, msg) = c.publish(&profile(vec![self_tag])).await;
    assert!(!ok && msg.starts_with("invalid:"), "self-owned: {msg}");
    let (status, me) = http_nip98(&relay.http_url(), &host, &agent, "GET", "/me", b"").await;
    assert_eq!(status, 200);
    assert_eq!(me["agent_owner"], serde_json::Value::Null);
    // The first valid attestation records the owner.
    c.publish_ok(&profile(vec![good])).await;
    let (_, me) = http_nip98(&relay.http_url(), &host, &agent, "GET", "/me", b"").await;

    assert_eq!(me["agent_owner"], hex(&owner));
    // Another owner is refused; the same owner (and no attestation) are fine.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (ok, msg) = c.publish(&profile(vec![attest(&other_owner, "")])).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    c.publish_ok(&profile(vec![attest(&owner, "")])).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    c.publish_ok(&profile(vec![])).await;
    let (_, me) = http_nip98(&relay.http_url(), &host, &agent, "GET", "/me", b"").await;
    assert_eq!(me["agent_owner"], hex(&owner));
    // Channels the agent is in show up too.
    let mut o = authed(&relay, &owner).await;
    o.publish_ok(&event(&owner, 9007, "", &[&["h", "ops"]])).await;
    o.publish_ok(&event(&owner, 9000, "", &[&["h", "ops"], &["p", &hex(&agent)]]))
        .await;
    let (_, me) = http_nip98(&relay.http_url(), &host, &agent, "GET", "/me", b"").await;
    assert_eq!(me["channels"], json!(["ops"]));
}

async fn nip98_failures_are_named(backend: Backend) {
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
    let k = Keys::generate();
    let base = relay.http_url();
    let host = relay.addr.to_string();
    let url = format!("http://{host}/me");
    let hdr = |method: &str, u: &str, body: &[u8]| protocol::nip98::header(&k, method, u, body);
    let code = |v: &serde_json::Value| v["error"].as_str().unwrap_or_default().to_string();

    let (status, v) = http_raw(&base, &host, "GET", "/me", None, b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_missing"));
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some("Bearer x"), b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_bad_scheme"));
    // Signed for another host.
    let (status, v) = http_raw(
        &base,
        &host,
        "GET",
        "/me",
        Some(&hdr("GET", "http://evil.test/me", b"")),
        b"",
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_url_mismatch"));
    // Signed for this host but sent to the other community's host.
    let (status, v) = http_raw(
        &base,
        "other.test",
        "GET",
        "/me",
        Some(&hdr("GET", &url, b"")),
        b"",
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_url_mismatch"));
    // Wrong scheme (the community is ws://, so http://).
    let https = format!("https://{host}/me");
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&hdr("GET", &https, b"")), b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_url_mismatch"));
    // Wrong method.
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&hdr("POST", &url, b"")), b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_method_mismatch"));
    // Stale.
    let stale = {
        use nostr::prelude::{EventBuilder, FinalizeEvent, Kind, Tag, Timestamp};
        let ev = EventBuilder::new(Kind::from_u16(27235), "")
            .tags([Tag::custom("u", [url.as_str()]), Tag::custom("method", ["GET"])])
            .custom_created_at(Timestamp::from_secs(tests::now() - 120))
            .finalize(&k)
            .unwrap();
        protocol::nip98::header_value(&ev)
    };
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&stale), b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_stale"));
    // Tampered body: the payload hash was made for another body.
    let signed_for = br#"{"a":1}"#;
    let (status, v) = http_raw(
        &base,
        &host,
        "GET",
        "/me",
        Some(&hdr("GET", &url, signed_for)),
        br#"{"a":2}"#,
    )
    .await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_payload_mismatch"));
    // A body without a payload tag.
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&hdr("GET", &url, b"")), b"{}").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_payload_missing"));
    // Good once, then replayed.
    let good = hdr("GET", &url, b"");
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&good), b"").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pubkey"], hex(&k));
    let (status, v) = http_raw(&base, &host, "GET", "/me", Some(&good), b"").await;
    assert_eq!((status, code(&v).as_str()), (401, "auth_replayed"));
    // The same request signed twice in one second (as a client without a
    // nonce does: one id, two signatures) is two requests; each header
    // sent again is a replay.
    let twice: Vec<String> = {
        use nostr::prelude::{EventBuilder, FinalizeEvent, Kind, Tag, Timestamp};
        let unsigned = EventBuilder::new(Kind::from_u16(27235), "")
            .tags([Tag::custom("u", [url.as_str()]), Tag::custom("method", ["GET"])])
            .custom_created_at(Timestamp::from_secs(tests::now()));
        let events: Vec<_> = (0..2).map(|_| unsigned.clone().finalize(&k).unwrap()).collect();
        assert_eq!(events[0].id, events[1].id);
        assert_ne!(events[0].sig, events[1].sig);
        events.iter().map(protocol::nip98::header_value).collect()
    };
    for header in &twice {
        let (status, v) = http_raw(&base, &host, "GET", "/me", Some(header), b"").await;
        assert_eq!(status, 200, "{v}");
    }
    for header in &twice {
        let (status, v) = http_raw(&base, &host, "GET", "/me", Some(header), b"").await;
        assert_eq!((status, code(&v).as_str()), (401, "auth_replayed"));
    }
    // Unknown host: 404 before any auth.
    let (status, v) = http_raw(&base, "nobody.test", "GET", "/me", Some(&good), b"").await;
    assert_eq!((status, code(&v).as_str()), (404, "unknown_host"));
}

/// Plain events (stored by the event writer's batches) and channel events
/// (the call writers' batches) from the same authors at the same time: every
/// one is stored. On PostgreSQL every writer serialises an author's events
/// with a lock on the author, and a channel event also locks its channel;
/// batches that took those locks in different orders deadlocked, PostgreSQL
/// failed one of them after `deadlock_timeout` (a second), and each of its
/// events was answered `OK false` (the query benchmark's preload, 1,000
/// authors in 20 channels: 124 deadlocks in its first 100,000 events).
async fn shared_authors_across_writers(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[limits]\nevents_per_second = 100000\nevents_burst = 100000\n\
                          [channels]\nmembership_kinds = [9]\n"
                .into(),
            ..Default::default()
        },
    );
    let owner = Keys::generate();
    let mut o = authed(&relay, &owner).await;
    let channels: Vec<String> = (0..8).map(|i| format!("mix-{i}")).collect();
    for c in &channels {
        o.publish_ok(&event(&owner, 9007, "", &[&["h", c]])).await;
    }
    let authors: Vec<Keys> = (0..16).map(|_| Keys::generate()).collect();
    let (conns, per_conn) = (12, 300);
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let url = relay.ws_url();
            let events: Vec<Event> = (0..per_conn)
                .map(|i| {
                    let author = &authors[(c + i) % authors.len()];
                    let content = format!("mix {c} {i}");
                    if i % 2 == 0 {
                        event(author, 1, &content, &[&["t", "mix"]])
                    } else {
                        let h = &channels[(c * 7 + i) % channels.len()];
                        event(author, 1, &content, &[&["t", "mix"], &["h", h]])
                    }
                })
                .collect();
            tokio::spawn(async move {
                let mut client = Client::connect(&url).await;
                for e in &events {
                    client.send(json!(["EVENT", e])).await;
                }
                let mut refused = Vec::new();
                for e in &events {
                    let (ok, msg) = client.wait_ok(&e.id.to_hex()).await;
                    if !ok {
                        refused.push(msg);
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = Vec::new();
    for t in tasks {
        refused.extend(t.await.unwrap());
    }
    assert!(
        refused.is_empty(),
        "{} refused, first: {:?}",
        refused.len(),
        refused.first()
    );
    let stored = o.count("mixed", vec![json!({"#t": ["mix"]})]).await.unwrap();
    assert_eq!(stored, (conns * per_conn) as u64);
}
