//! What Nostr clients expect beyond NIP-01, over real sockets on every
//! backend: NIP-50 search under the read rules, NIP-17/59 gift wraps only
//! for their recipient, NIP-65 and DM relay lists, NIP-77 negentropy sync
//! (driven by the `negentropy` crate as a client), per-community access
//! control, and NIP-01 leniency (empty tags; complete subscriptions closed
//! after EOSE). Filters are built with the `nostr` crate's `Filter`.

use std::collections::HashSet;
use std::time::Duration;

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::{Event, Filter, Keys, Kind, PublicKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tests::workflow::rpc;
use tests::{backend_tests, event, event_at, now, Backend, Client, Relay, RelayOptions};

backend_tests!(
    search_is_ranked_and_obeys_the_read_rules,
    search_finds_each_event_of_a_batch,
    search_finds_each_channel_message_of_a_call_batch,
    gift_wraps_reach_only_their_recipient,
    relay_lists_are_stored_and_listed,
    negentropy_reconciles_without_downloading,
    access_control_per_community,
    empty_tags_are_kept_and_id_subscriptions_close,
    nip29_roles_invites_deletes_and_previous,
);

fn f(filter: Filter) -> Value {
    serde_json::to_value(filter).expect("filter")
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.to_hex()).collect()
}

fn one(event: &Event) -> Vec<String> {
    vec![event.id.to_hex()]
}

async fn search_is_ranked_and_obeys_the_read_rules(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let t = now();
    // Older, but every word many times: ranked first.
    let best = event_at(
        &k,
        1,
        "Durable delivery: delivery, DELIVERY, durable!",
        &[],
        t - 100,
    );
    let plain = event_at(
        &k,
        1,
        "a note about durable agent delivery and more words",
        &[],
        t - 10,
    );
    let one_word = event_at(&k, 1, "durable goods only", &[], t - 5);
    let deleted = event_at(&k, 1, "durable delivery to be deleted", &[], t - 4);
    let expiring = event(
        &k,
        1,
        "durable delivery soon gone",
        &[&["expiration", &(t + 2).to_string()]],
    );
    for e in [&best, &plain, &one_word, &deleted, &expiring] {
        c.publish_ok(e).await;
    }
    c.publish_ok(&event(&k, 5, "", &[&["e", &deleted.id.to_hex()]]))
        .await;
    // A gift wrap to `bob` that holds the words: only bob finds it.
    let bob = Keys::generate();
    let wrap = event(
        &k,
        1059,
        "durable delivery sealed",
        &[&["p", &bob.public_key().to_hex()]],
    );
    c.publish_ok(&wrap).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let query = Filter::new().search("durable DELIVERY include:spam");
    let got = c.req("s1", vec![f(query.clone())]).await.events();
    assert_eq!(
        ids(&got),
        ids(&[best.clone(), plain.clone()]),
        "ranked, read rules kept"
    );
    let got = c.req("s2", vec![f(query.clone().limit(1))]).await.events();
    assert_eq!(ids(&got), one(&best), "limit applies after ranking");
    assert_eq!(c.count("n1", vec![f(query.clone())]).await.unwrap(), 2);
    let got = c
        .req(
            "s3",
            vec![f(Filter::new().search("durable").kind(Kind::from_u16(1)))],
        )
        .await
        .events();
    assert_eq!(got.len(), 3, "{got:?}");
    // Only extensions: no words, no constraint beyond the other fields.
    let got = c
        .req(
            "s4",
            vec![f(Filter::new()
                .search("language:en")
                .author(k.public_key())
                .kind(Kind::from_u16(5)))],
        )
        .await
        .events();
    assert_eq!(got.len(), 1);

    let mut b = Client::connect(&relay.ws_url()).await;
    b.auth(&bob).await;
    let got = b
        .req("s5", vec![f(Filter::new().search("sealed"))])
        .await
        .events();
    assert_eq!(ids(&got), one(&wrap), "the recipient finds its gift wrap");
    assert!(c
        .req("s6", vec![f(Filter::new().search("sealed"))])
        .await
        .events()
        .is_empty());

    // Live: a subscription with a search sees new events that match it only.
    c.req("live", vec![f(Filter::new().search("fresh delivery"))])
        .await
        .events();
    let other = Keys::generate();
    let mut p = Client::connect(&relay.ws_url()).await;
    p.publish_ok(&event(&other, 1, "fresh bread", &[])).await;
    let hit = event(&other, 1, "A FRESH delivery arrived", &[]);
    p.publish_ok(&hit).await;
    assert_eq!(c.next_event("live").await.id, hit.id);

    let info = relay_info(&relay).await;
    assert!(nips(&info).contains(&50), "{info}");
}

/// Events sent without waiting for their OKs are stored in batches (a few
/// statements for many events, the words of all of them in one): each
/// event's own word finds that event and only it, and a word they share
/// finds them all.
async fn search_finds_each_event_of_a_batch(backend: Backend) {
    let options = RelayOptions {
        config_toml: "metrics_listen = \"127.0.0.1:0\"\n".into(),
        ..RelayOptions::default()
    };
    let relay = Relay::start_opts(&backend, options);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let mut sent = Vec::new();
    for round in 0..4 {
        let events: Vec<Event> = (0..64)
            .map(|i| {
                event(
                    &k,
                    1,
                    &format!("pipelined {} words", letters(round * 64 + i)),
                    &[],
                )
            })
            .collect();
        c.publish_all_ok(&events).await;
        sent.extend(events);
        if batches_held_two(&relay).await {
            break;
        }
    }
    assert!(batches_held_two(&relay).await, "no write batch held two events");
    assert_each_found_by_its_word(&mut c, &sent, 5, "pipelined").await;
}

/// Channel messages are stored by the call writer, many calls to one
/// transaction, whose words reach the search index at its commit (on
/// SQLite, `events::rules::index_words`): each message of a batch is
/// found by its own word, and all of them by the word they share.
async fn search_finds_each_channel_message_of_a_call_batch(backend: Backend) {
    let relay = Relay::start(&backend);
    let fx = tests::workflow::Fixture::new(&relay, "searched", 0).await;
    // Several connections at once: one connection's channel messages are
    // stored one after another.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let mut c = Client::connect(&relay.ws_url()).await;
        c.auth(&fx.owner).await;
        clients.push(c);
    }
    let mut sent = Vec::new();
    for round in 0..4 {
        let batches: Vec<Vec<Event>> = (0..clients.len())
            .map(|k| {
                (0..16)
                    .map(|i| {
                        let n = (round * clients.len() + k) * 16 + i;
                        let text = format!("channelled {} words", letters(n));
                        event(&fx.owner, 9, &text, &[&["h", "searched"]])
                    })
                    .collect()
            })
            .collect();
        let publishes = clients.iter_mut().zip(&batches).map(|(c, b)| c.publish_all_ok(b));
        futures_util::future::join_all(publishes).await;
        sent.extend(batches.into_iter().flatten());
        if call_batch_held_two(&relay) {
            break;
        }
    }
    assert!(call_batch_held_two(&relay), "no call batch held two calls");
    assert_each_found_by_its_word(&mut clients[0], &sent, 7, "channelled").await;
}

/// Every `step`-th event of `sent` (content `<shared> <own> words`) is
/// found by a search for its own word and by nothing else, and all of
/// `sent` by a search for the `shared` word.
async fn assert_each_found_by_its_word(c: &mut Client, sent: &[Event], step: usize, shared: &str) {
    for e in sent.iter().step_by(step) {
        let word = e.content.split(' ').nth(1).expect("a word of its own");
        let got = c.req("own", vec![f(Filter::new().search(word))]).await.events();
        assert_eq!(ids(&got), one(e), "{word}");
    }
    let all = Filter::new().search(shared).limit(sent.len());
    let got: HashSet<String> = ids(&c.req("all", vec![f(all)]).await.events())
        .into_iter()
        .collect();
    assert_eq!(got, ids(sent).into_iter().collect::<HashSet<_>>());
}

/// Whether the relay's log shows a call batch of two calls or more (its
/// debug line `call batch`, `calls=N`).
fn call_batch_held_two(relay: &Relay) -> bool {
    relay.log().lines().filter(|l| l.contains("call batch")).any(|l| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix("calls="))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= 2)
    })
}

/// A word of letters only for `n` (`zq` and base 26): one token for both
/// backends' word splitting.
fn letters(mut n: usize) -> String {
    let mut word = String::from("zq");
    loop {
        word.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            return word;
        }
    }
}

/// Whether the event writer has written a batch of two events or more
/// (its batch-size histogram counts more batches than those of one).
async fn batches_held_two(relay: &Relay) -> bool {
    let count = |lines: Vec<String>| -> f64 {
        lines
            .first()
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let all = count(relay.metric_lines("relay_write_batch_events_count").await);
    let ones = relay
        .metric_lines("relay_write_batch_events_bucket")
        .await
        .into_iter()
        .filter(|l| l.contains("le=\"1\""))
        .collect();
    all > count(ones)
}

async fn relay_info(relay: &Relay) -> Value {
    reqwest::Client::new()
        .get(relay.http_url())
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .expect("nip11")
        .json()
        .await
        .expect("json")
}

fn nips(info: &Value) -> Vec<u64> {
    info["supported_nips"]
        .as_array()
        .expect("supported_nips")
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

async fn gift_wraps_reach_only_their_recipient(backend: Backend) {
    let relay = Relay::start(&backend);
    let sender = Keys::generate();
    let (bob, eve) = (Keys::generate(), Keys::generate());
    let mut c = Client::connect(&relay.ws_url()).await;
    let wrap = event(&sender, 1059, "ciphertext", &[&["p", &bob.public_key().to_hex()]]);
    c.publish_ok(&wrap).await;
    let note = event(&sender, 1, "public", &[]);
    c.publish_ok(&note).await;
    let wrap_id = wrap.id.to_hex();

    // Anonymous: asking for the kind is refused; every other shape hides it.
    let closed = c.req("a", vec![json!({"kinds": [1059]})]).await.closed();
    assert!(closed.starts_with("auth-required:"), "{closed}");
    assert!(c
        .count("a2", vec![json!({"kinds": [1059]})])
        .await
        .unwrap_err()
        .starts_with("auth-required:"));
    for filter in [
        json!({}),
        json!({"ids": [wrap_id]}),
        json!({"authors": [sender.public_key().to_hex()]}),
        json!({"#p": [bob.public_key().to_hex()]}),
        json!({"since": wrap.created_at.as_secs()}),
    ] {
        let got = c.req("a3", vec![filter.clone()]).await.events();
        assert!(!ids(&got).contains(&wrap_id), "{filter}");
    }
    assert_eq!(
        c.count("a4", vec![json!({})]).await.unwrap(),
        1,
        "COUNT hides it too"
    );

    // Another authenticated pubkey: the same.
    let mut e = Client::connect(&relay.ws_url()).await;
    e.auth(&eve).await;
    assert!(e
        .req("e1", vec![json!({"ids": [wrap_id]})])
        .await
        .events()
        .is_empty());
    let closed = e
        .req(
            "e2",
            vec![json!({"kinds": [1059], "#p": [bob.public_key().to_hex()]})],
        )
        .await
        .closed();
    assert!(closed.starts_with("restricted:"), "{closed}");
    assert_eq!(e.count("e3", vec![json!({})]).await.unwrap(), 1);

    // The recipient, by every shape.
    let mut b = Client::connect(&relay.ws_url()).await;
    b.auth(&bob).await;
    for filter in [
        json!({"kinds": [1059]}),
        json!({"kinds": [1059], "#p": [bob.public_key().to_hex()]}),
        json!({"ids": [wrap_id]}),
        json!({}),
    ] {
        let got = b.req("b1", vec![filter.clone()]).await.events();
        assert!(ids(&got).contains(&wrap_id), "{filter}");
    }
    assert_eq!(b.count("b2", vec![json!({"kinds": [1059]})]).await.unwrap(), 1);
    // Live, too: only the recipient's subscription receives a new one.
    b.req(
        "live",
        vec![json!({"kinds": [1059], "#p": [bob.public_key().to_hex()]})],
    )
    .await
    .events();
    e.req("live", vec![json!({})]).await.events();
    let second = event(&sender, 1059, "more", &[&["p", &bob.public_key().to_hex()]]);
    c.publish_ok(&second).await;
    assert_eq!(b.next_event("live").await.id, second.id);
    let marker = event(&sender, 1, "after", &[]);
    c.publish_ok(&marker).await;
    assert_eq!(
        e.next_event("live").await.id,
        marker.id,
        "eve saw the note, not the wrap"
    );

    // NIP-04 DMs: their sender reads them too (its own sent messages).
    let alice = Keys::generate();
    let dm = event(&alice, 4, "?iv=x", &[&["p", &bob.public_key().to_hex()]]);
    c.publish_ok(&dm).await;
    let mut a = Client::connect(&relay.ws_url()).await;
    a.auth(&alice).await;
    let sent =
        json!({"kinds": [4], "authors": [alice.public_key().to_hex()], "#p": [bob.public_key().to_hex()]});
    assert_eq!(ids(&a.req("a1", vec![sent.clone()]).await.events()), one(&dm));
    assert_eq!(
        ids(&b.req("b3", vec![json!({"kinds": [4]})]).await.events()),
        one(&dm)
    );
    assert!(e.req("e4", vec![sent]).await.closed().starts_with("restricted:"));
    assert!(e
        .req("e5", vec![json!({"ids": [dm.id.to_hex()]})])
        .await
        .events()
        .is_empty());

    let info = relay_info(&relay).await;
    for nip in [4, 17, 59] {
        assert!(nips(&info).contains(&nip), "{info}");
    }
}

async fn relay_lists_are_stored_and_listed(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let t = now();
    let old = event_at(&k, 10002, "", &[&["r", "wss://a.example"]], t - 10);
    let new = event_at(&k, 10002, "", &[&["r", "wss://b.example", "write"]], t - 5);
    let dm = event(&k, 10050, "", &[&["relay", "wss://inbox.example"]]);
    for e in [&old, &new, &dm] {
        c.publish_ok(e).await;
    }
    let got = c
        .req(
            "r",
            vec![json!({"kinds": [10002], "authors": [k.public_key().to_hex()]})],
        )
        .await
        .events();
    assert_eq!(ids(&got), one(&new), "the newer list replaced the older");
    let got = c
        .req(
            "d",
            vec![json!({"kinds": [10050], "authors": [k.public_key().to_hex()]})],
        )
        .await
        .events();
    assert_eq!(ids(&got), one(&dm));
    // An older list sent after the newer one is not stored over it.
    c.publish(&event_at(&k, 10002, "", &[&["r", "wss://c.example"]], t - 20))
        .await;
    let got = c
        .req(
            "r2",
            vec![json!({"kinds": [10002], "authors": [k.public_key().to_hex()]})],
        )
        .await
        .events();
    assert_eq!(ids(&got), ids(&[new]));
    assert!(nips(&relay_info(&relay).await).contains(&65));
}

/// Runs a negentropy client over the relay's socket: the ids the client
/// has that the relay lacks, and those the relay has that the client
/// lacks. `Err` is the relay's NEG-ERR.
async fn sync(
    c: &mut Client,
    sub: &str,
    filter: Value,
    mine: &[(u64, [u8; 32])],
) -> Result<(HashSet<[u8; 32]>, HashSet<[u8; 32]>), String> {
    let mut storage = NegentropyStorageVector::new();
    for (at, id) in mine {
        storage.insert(*at, Id::from_byte_array(*id)).unwrap();
    }
    storage.seal().unwrap();
    let mut client = Negentropy::owned(storage, 0).unwrap();
    let first = client.initiate().unwrap();
    c.send(json!(["NEG-OPEN", sub, filter, hex::encode(first)])).await;
    let (mut have, mut need) = (Vec::new(), Vec::new());
    let mut rounds = 0;
    loop {
        let v = c.recv().await;
        if v[1] != sub {
            continue;
        }
        match v[0].as_str() {
            Some("NEG-ERR") => return Err(v[2].as_str().unwrap_or_default().to_string()),
            Some("NEG-MSG") => {}
            _ => continue,
        }
        rounds += 1;
        assert!(rounds < 50, "the sync ends");
        let msg = hex::decode(v[2].as_str().unwrap()).unwrap();
        match client.reconcile_with_ids(&msg, &mut have, &mut need).unwrap() {
            Some(next) => c.send(json!(["NEG-MSG", sub, hex::encode(next)])).await,
            None => break,
        }
    }
    c.send(json!(["NEG-CLOSE", sub])).await;
    let set = |v: Vec<Id>| v.into_iter().map(|id| *id).collect();
    Ok((set(have), set(need)))
}

async fn negentropy_reconciles_without_downloading(backend: Backend) {
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: "[limits]\nmax_sync_events = 300\n".into(),
            ..Default::default()
        },
    );
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let t = now();
    let mut stored = Vec::new();
    for i in 0..200u64 {
        let e = event_at(&k, 1, &format!("n{i}"), &[&["t", "sync"]], t - 1000 + i);
        c.send(json!(["EVENT", e])).await;
        stored.push(e);
    }
    for e in &stored {
        let (ok, msg) = c.wait_ok(&e.id.to_hex()).await;
        assert!(ok, "{msg}");
    }
    // A wrap for someone else never enters an anonymous sync.
    let bob = Keys::generate();
    c.publish_ok(&event(&k, 1059, "x", &[&["p", &bob.public_key().to_hex()]]))
        .await;
    let item = |e: &Event| (e.created_at.as_secs(), e.id.to_bytes());
    // The client holds the first 150 and 20 the relay never saw.
    let mine_only: Vec<Event> = (0..20)
        .map(|i| event_at(&k, 1, &format!("local{i}"), &[], t - 500 + i))
        .collect();
    let mut mine: Vec<(u64, [u8; 32])> = stored[..150].iter().map(item).collect();
    mine.extend(mine_only.iter().map(item));

    let (have, need) = sync(&mut c, "n", json!({"authors": [k.public_key().to_hex()]}), &mine)
        .await
        .expect("sync");
    let want_need: HashSet<[u8; 32]> = stored[150..].iter().map(|e| e.id.to_bytes()).collect();
    let want_have: HashSet<[u8; 32]> = mine_only.iter().map(|e| e.id.to_bytes()).collect();
    assert_eq!(need, want_need, "the relay's 50 the client lacks (not the wrap)");
    assert_eq!(have, want_have, "the client's 20 the relay lacks");

    // Same sets: nothing to exchange.
    let all: Vec<_> = stored.iter().map(item).collect();
    let (have, need) = sync(&mut c, "same", json!({"#t": ["sync"]}), &all)
        .await
        .expect("sync");
    assert!(have.is_empty() && need.is_empty());

    // Bounds: more events than max_sync_events, a bad message, an unknown id.
    let mut many = Client::connect(&relay.ws_url()).await;
    for i in 0..120u64 {
        many.send(json!([
            "EVENT",
            event_at(&Keys::generate(), 1, "m", &[], t - 2000 + i)
        ]))
        .await;
    }
    for _ in 0..120 {
        loop {
            if many.recv().await[0] == "OK" {
                break;
            }
        }
    }
    let err = sync(&mut c, "big", json!({"kinds": [1]}), &[]).await.unwrap_err();
    assert!(err.starts_with("blocked:"), "{err}");
    c.send(json!(["NEG-OPEN", "bad", {}, "zz"])).await;
    let err = loop {
        let v = c.recv().await;
        if v[0] == "NEG-ERR" && v[1] == "bad" {
            break v[2].as_str().unwrap().to_string();
        }
    };
    assert!(err.starts_with("invalid:"), "{err}");
    c.send(json!(["NEG-MSG", "nothing", "61"])).await;
    let err = loop {
        let v = c.recv().await;
        if v[0] == "NEG-ERR" && v[1] == "nothing" {
            break v[2].as_str().unwrap().to_string();
        }
    };
    assert!(err.starts_with("closed:"), "{err}");
    assert!(nips(&relay_info(&relay).await).contains(&77));
}

async fn access_control_per_community(backend: Backend) {
    let admin = Keys::generate();
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: format!(
                "[communities.default]\nadmins = [\"{}\"]\n[communities.default.access]\n\
                 auth_required_for_reads = true\nauth_required_for_writes = true\nwriters_allowlist = true\n",
                admin.public_key().to_hex()
            ),
            ..Default::default()
        },
    );
    let (alice, mallory) = (Keys::generate(), Keys::generate());
    let mut c = Client::connect(&relay.ws_url()).await;
    let closed = c.req("r", vec![json!({})]).await.closed();
    assert!(closed.starts_with("auth-required:"), "{closed}");
    assert!(c
        .count("n", vec![json!({})])
        .await
        .unwrap_err()
        .starts_with("auth-required:"));
    let (ok, msg) = c.publish(&event(&alice, 1, "hi", &[])).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");

    c.auth(&alice).await;
    assert!(c.req("r2", vec![json!({})]).await.events().is_empty());
    let (ok, msg) = c.publish(&event(&alice, 1, "hi", &[])).await;
    assert!(
        !ok && msg.starts_with("restricted:"),
        "not on the allow list yet: {msg}"
    );
    let (status, body) = rpc(
        &relay,
        &admin,
        "allowpubkey",
        json!([alice.public_key().to_hex(), "member"]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let note = event(&alice, 1, "hi", &[]);
    c.publish_ok(&note).await;
    // The allow list is about authors: mallory, authenticated, still may not.
    let mut m = Client::connect(&relay.ws_url()).await;
    m.auth(&mallory).await;
    let (ok, msg) = m.publish(&event(&mallory, 1, "spam", &[])).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let got = m
        .req("r3", vec![json!({"authors": [alice.public_key().to_hex()]})])
        .await
        .events();
    assert_eq!(ids(&got), ids(&[note]));
    // The admin may always publish.
    let mut a = Client::connect(&relay.ws_url()).await;
    a.auth(&admin).await;
    a.publish_ok(&event(&admin, 1, "rules", &[])).await;

    let info = relay_info(&relay).await;
    assert_eq!(info["limitation"]["auth_required"], true, "{info}");
    assert_eq!(info["limitation"]["restricted_writes"], true, "{info}");
}

/// A signed event whose tags NIP-01 allows but the `nostr` crate cannot
/// hold (empty arrays), as raw JSON.
fn raw_event(keys: &Keys, tags: Value, content: &str, created_at: u64) -> (String, Value) {
    let pubkey: PublicKey = keys.public_key();
    let canonical = json!([0, pubkey.to_hex(), created_at, 1, tags, content]).to_string();
    let id: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
    let sig = keys.sign_schnorr(id);
    let id = hex::encode(id);
    let ev = json!({"id": id, "pubkey": pubkey.to_hex(), "created_at": created_at, "kind": 1,
        "tags": tags, "content": content, "sig": sig.to_string()});
    (id, ev)
}

async fn empty_tags_are_kept_and_id_subscriptions_close(backend: Backend) {
    let relay = Relay::start(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = Keys::generate();
    let (id, ev) = raw_event(&k, json!([[], ["t", "x"], []]), "empty tags", now());
    c.send(json!(["EVENT", ev])).await;
    let (ok, msg) = c.wait_ok(&id).await;
    assert!(ok, "{msg}");
    // Served as written: every tag, and an id that still checks.
    c.send(json!(["REQ", "q", {"ids": [id]}])).await;
    let served = loop {
        let v = c.recv().await;
        if v[0] == "EVENT" && v[1] == "q" {
            break v[2].clone();
        }
    };
    assert_eq!(served["tags"], json!([[], ["t", "x"], []]));
    let canonical = json!([
        0,
        served["pubkey"],
        served["created_at"],
        served["kind"],
        served["tags"],
        served["content"]
    ]);
    assert_eq!(hex::encode(Sha256::digest(canonical.to_string().as_bytes())), id);
    // A complete subscription (ids only) ends with EOSE, then CLOSED.
    let mut saw_eose = false;
    loop {
        let v = c.recv().await;
        match v[0].as_str() {
            Some("EOSE") if v[1] == "q" => saw_eose = true,
            Some("CLOSED") if v[1] == "q" => {
                assert!(saw_eose, "CLOSED after EOSE");
                break;
            }
            _ => {}
        }
    }
    // Found by its other tag too (counted: the test's client parses with
    // the `nostr` crate, which holds no empty tag).
    let by_tag = json!({"#t": ["x"], "authors": [k.public_key().to_hex()]});
    assert_eq!(c.count("t", vec![by_tag]).await.unwrap(), 1);
    // An id that does not hash the tags as written is refused.
    let (_, mut forged) = raw_event(&k, json!([[]]), "forged", now());
    forged["content"] = json!("changed");
    let forged_id = forged["id"].as_str().unwrap().to_string();
    c.send(json!(["EVENT", forged])).await;
    let (ok, msg) = c.wait_ok(&forged_id).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // A subscription that is not complete stays open after EOSE.
    c.req(
        "open",
        vec![json!({"authors": [k.public_key().to_hex()], "limit": 0})],
    )
    .await
    .events();
    let later = event(&k, 1, "later", &[]);
    c.publish_ok(&later).await;
    assert_eq!(c.next_event("open").await.id, later.id);
}

/// The channel's relay-signed event of `kind` (39000-39003), its tags.
async fn metadata(c: &mut Client, kind: u16, channel: &str) -> Vec<Vec<String>> {
    let got = c
        .req("meta", vec![json!({"kinds": [kind], "#d": [channel]})])
        .await
        .events();
    assert_eq!(got.len(), 1, "one current {kind}");
    got[0].tags.iter().map(|t| t.as_slice().to_vec()).collect()
}

fn lists(tags: &[Vec<String>], name: &str, value: &str) -> bool {
    tags.iter()
        .any(|t| t.first().is_some_and(|n| n == name) && t.get(1).is_some_and(|v| v == value))
}

async fn nip29_roles_invites_deletes_and_previous(backend: Backend) {
    let relay = Relay::start(&backend);
    let (admin, alice, bob) = (Keys::generate(), Keys::generate(), Keys::generate());
    let mut a = Client::connect(&relay.ws_url()).await;
    a.auth(&admin).await;
    let h: &[&str] = &["h", "club"];
    a.publish_ok(&event(&admin, 9007, "", &[h, &["closed"]])).await;
    let roles = metadata(&mut a, 39003, "club").await;
    assert!(
        lists(&roles, "role", "admin") && lists(&roles, "role", "member"),
        "{roles:?}"
    );
    let meta = metadata(&mut a, 39000, "club").await;
    assert!(
        meta.iter().any(|t| t == &["closed"]) && meta.iter().any(|t| t == &["public"]),
        "{meta:?}"
    );

    // Invites: only admins create them; a join with one enters at once.
    let mut al = Client::connect(&relay.ws_url()).await;
    al.auth(&alice).await;
    let (ok, msg) = al
        .publish(&event(&alice, 9009, "", &[h, &["code", "sesame"]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    let (ok, msg) = a.publish(&event(&admin, 9009, "", &[h])).await;
    assert!(
        !ok && msg.starts_with("invalid:"),
        "an invite needs a code: {msg}"
    );
    a.publish_ok(&event(&admin, 9009, "", &[h, &["code", "sesame"]]))
        .await;
    al.publish_ok(&event(&alice, 9021, "", &[h, &["code", "sesame"]]))
        .await;
    let members = metadata(&mut a, 39002, "club").await;
    assert!(lists(&members, "p", &alice.public_key().to_hex()), "{members:?}");
    // Without a code (or with a wrong one) a join waits for an admin.
    let mut b = Client::connect(&relay.ws_url()).await;
    b.auth(&bob).await;
    b.publish_ok(&event(&bob, 9021, "", &[h, &["code", "guess"]]))
        .await;
    assert!(!lists(
        &metadata(&mut a, 39002, "club").await,
        "p",
        &bob.public_key().to_hex()
    ));
    let (ok, msg) = b.publish(&event(&bob, 9, "hi", &[h])).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");

    // `previous`: the first 8 hex characters of recent events of the channel.
    let m1 = event(&alice, 9, "first", &[h]);
    al.publish_ok(&m1).await;
    let prefix = &m1.id.to_hex()[..8];
    al.publish_ok(&event(&alice, 9, "second", &[h, &["previous", prefix]]))
        .await;
    let (ok, msg) = al
        .publish(&event(&alice, 9, "forked", &[h, &["previous", "deadbeef"]]))
        .await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");

    // 9005: admins delete an event of the channel; members may not.
    let target = json!({"ids": [m1.id.to_hex()]});
    let (ok, msg) = al
        .publish(&event(&alice, 9005, "", &[h, &["e", &m1.id.to_hex()]]))
        .await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    assert_eq!(al.req("m", vec![target.clone()]).await.events().len(), 1);
    a.publish_ok(&event(&admin, 9005, "", &[h, &["e", &m1.id.to_hex()]]))
        .await;
    assert!(al.req("m2", vec![target]).await.events().is_empty());
}
