//! Property: for random events and random filters, the relay's SQL (each
//! backend) returns exactly what in-memory NIP-01 matching (the `nostr`
//! crate's `Filter::match_event`) selects, in NIP-01 order (newest first,
//! ties by lowest id), with `limit` applied; and COUNT agrees. Most events
//! fall within 20 seconds, a quarter minutes to years before them.

use nostr::prelude::{Event, Filter, Keys, MatchEventOptions};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tests::{backend_tests, event_at, Backend, Client, Relay, RelayOptions};

backend_tests!(
    sql_matches_in_memory_filtering,
    a_follow_list_reaches_back_past_its_windows
);

const EVENTS: usize = 120;
const FILTERS: usize = 150;

fn random_events(rng: &mut StdRng, authors: &[Keys], base: u64) -> Vec<Event> {
    let kinds = [1u16, 7, 1111, 4000];
    let letters = ["alpha", "beta", "gamma", "delta"];
    let mut out: Vec<Event> = Vec::new();
    for i in 0..EVENTS {
        let author = authors.choose(rng).unwrap();
        let kind = *kinds.choose(rng).unwrap();
        let mut tags: Vec<Vec<String>> = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            tags.push(vec!["t".into(), letters.choose(rng).unwrap().to_string()]);
        }
        if rng.random_bool(0.4) {
            tags.push(vec![
                "p".into(),
                authors.choose(rng).unwrap().public_key().to_hex(),
            ]);
        }
        if !out.is_empty() && rng.random_bool(0.3) {
            tags.push(vec!["e".into(), out.choose(rng).unwrap().id.to_hex()]);
        }
        // Few distinct timestamps, so that ties (and their order) are
        // exercised; and one event in four minutes to years older, so that
        // a follow list's read by time window (SQLite) widens across them.
        let created = if rng.random_bool(0.25) {
            base - 10u64.pow(rng.random_range(2..9)) + rng.random_range(0..3)
        } else {
            base + rng.random_range(0..20)
        };
        let tag_refs: Vec<Vec<&str>> = tags
            .iter()
            .map(|t| t.iter().map(String::as_str).collect())
            .collect();
        let tag_slices: Vec<&[&str]> = tag_refs.iter().map(Vec::as_slice).collect();
        out.push(event_at(
            author,
            kind,
            &format!("event {i}"),
            &tag_slices,
            created,
        ));
    }
    out
}

fn random_filter(rng: &mut StdRng, events: &[Event], authors: &[Keys], base: u64) -> Value {
    let mut f = serde_json::Map::new();
    let pick = |rng: &mut StdRng, n: usize| rng.random_range(0..=n);
    if rng.random_bool(0.2) {
        let n = pick(rng, 3);
        let mut ids: Vec<String> = (0..n).map(|_| events.choose(rng).unwrap().id.to_hex()).collect();
        if rng.random_bool(0.3) {
            ids.push(Keys::generate().public_key().to_hex()); // unknown id
        }
        f.insert("ids".into(), json!(ids));
    }
    if rng.random_bool(0.4) {
        let n = pick(rng, 3);
        f.insert(
            "authors".into(),
            json!((0..n)
                .map(|_| authors.choose(rng).unwrap().public_key().to_hex())
                .collect::<Vec<_>>()),
        );
    }
    if rng.random_bool(0.4) {
        let n = pick(rng, 2);
        f.insert(
            "kinds".into(),
            json!((0..n)
                .map(|_| *[1u16, 7, 1111, 4000, 5].choose(rng).unwrap())
                .collect::<Vec<_>>()),
        );
    }
    if rng.random_bool(0.3) {
        f.insert("since".into(), json!(base + rng.random_range(0..20)));
    }
    if rng.random_bool(0.3) {
        f.insert("until".into(), json!(base + rng.random_range(0..20)));
    }
    if rng.random_bool(0.4) {
        let n = pick(rng, 2);
        f.insert(
            "#t".into(),
            json!((0..n)
                .map(|_| *["alpha", "beta", "gamma", "delta", "zeta"].choose(rng).unwrap())
                .collect::<Vec<_>>()),
        );
    }
    if rng.random_bool(0.2) {
        f.insert(
            "#p".into(),
            json!([authors.choose(rng).unwrap().public_key().to_hex()]),
        );
    }
    if rng.random_bool(0.15) {
        f.insert("#e".into(), json!([events.choose(rng).unwrap().id.to_hex()]));
    }
    if rng.random_bool(0.5) {
        // Mostly below the matches of the 20 seconds, sometimes past them.
        let most = if rng.random_bool(0.7) { 15 } else { 60 };
        f.insert("limit".into(), json!(rng.random_range(0..most)));
    }
    Value::Object(f)
}

/// A relay that takes the tests' events as fast as they are sent.
fn unthrottled(backend: &Backend) -> Relay {
    Relay::start_opts(
        backend,
        RelayOptions {
            config_toml: "[limits]\nevents_per_second = 100000\nevents_burst = 100000\n".into(),
            ..Default::default()
        },
    )
}

async fn sql_matches_in_memory_filtering(backend: Backend) {
    let seed: u64 = std::env::var("FILTER_PROPERTY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261130);
    let mut rng = StdRng::seed_from_u64(seed);
    let relay = unthrottled(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let authors: Vec<Keys> = (0..4).map(|_| Keys::generate()).collect();
    let base = tests::now() - 1000;
    let events = random_events(&mut rng, &authors, base);
    for e in &events {
        c.publish_ok(e).await;
    }
    for n in 0..FILTERS {
        let fv = random_filter(&mut rng, &events, &authors, base);
        let filter: Filter = serde_json::from_value(fv.clone()).unwrap();
        let mut expected: Vec<&Event> = events
            .iter()
            .filter(|e| filter.match_event(e, MatchEventOptions::new()))
            .collect();
        expected.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.id.cmp(&b.id)));
        let all = expected.len();
        if let Some(l) = filter.limit {
            expected.truncate(l);
        }
        let sub = format!("p{n}");
        let got = c.req(&sub, vec![fv.clone()]).await.events();
        c.send(json!(["CLOSE", sub])).await;
        let got_ids: Vec<String> = got.iter().map(|e| e.id.to_hex()).collect();
        let want_ids: Vec<String> = expected.iter().map(|e| e.id.to_hex()).collect();
        assert_eq!(got_ids, want_ids, "seed {seed}, filter {n}: {fv}");
        let mut count_filter = fv.clone();
        count_filter.as_object_mut().unwrap().remove("limit");
        let count = c.count(&format!("c{n}"), vec![count_filter]).await.unwrap();
        assert_eq!(count as usize, all, "seed {seed}, COUNT of filter {n}: {fv}");
    }
}

/// A follow list's REQ (on SQLite read window by window back from the
/// page's start, each window wider) returns its authors' newest events
/// wherever they fall in time, past windows that hold some of them but
/// not enough, and past another author's events in every window.
async fn a_follow_list_reaches_back_past_its_windows(backend: Backend) {
    let relay = unthrottled(&backend);
    let mut c = Client::connect(&relay.ws_url()).await;
    let (a, b, other) = (Keys::generate(), Keys::generate(), Keys::generate());
    let now = tests::now();
    // Seconds back: two inside the first window (60 s), then one or two
    // past each next window's floor, the last years back.
    let ages = [5u64, 30, 400, 3_000, 20_000, 200_000, 2_000_000, 100_000_000];
    let mut listed = Vec::new();
    for (i, age) in ages.iter().enumerate() {
        let author = if i % 2 == 0 { &a } else { &b };
        let e = event_at(author, 1, &format!("listed {i}"), &[], now - age);
        c.publish_ok(&e).await;
        listed.push(e.id.to_hex());
    }
    for age in [1u64, 10, 100, 1_000, 10_000, 100_000] {
        c.publish_ok(&event_at(&other, 1, &format!("other {age}"), &[], now - age))
            .await;
    }
    let follows = json!([a.public_key().to_hex(), b.public_key().to_hex()]);
    let ids = |events: Vec<Event>| events.iter().map(|e| e.id.to_hex()).collect::<Vec<_>>();
    for limit in [1usize, 2, 3, 5, 8, 50] {
        let got = c
            .req(
                &format!("l{limit}"),
                vec![json!({"authors": follows, "kinds": [1], "limit": limit})],
            )
            .await
            .events();
        assert_eq!(ids(got), listed[..limit.min(ages.len())], "limit {limit}");
        c.send(json!(["CLOSE", format!("l{limit}")])).await;
    }
    // Back from `until`, down to `since`.
    let got = c
        .req(
            "u",
            vec![json!({"authors": follows, "until": now - 1_000, "limit": 3})],
        )
        .await
        .events();
    assert_eq!(ids(got), listed[3..6]);
    let got = c
        .req("s", vec![json!({"authors": follows, "since": now - 500_000})])
        .await
        .events();
    assert_eq!(ids(got), listed[..6]);
}
