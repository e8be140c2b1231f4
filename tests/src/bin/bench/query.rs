//! The query figures: a store preloaded into every target, then REQs of
//! each filter shape, first as latency (a few connections, one REQ in
//! flight each: p50 and p99 are a REQ's own time), then saturating (many
//! connections, several REQs in flight each: the relay's throughput and
//! its CPU per REQ, where two relays near the load generator's limit are
//! still told apart); and the NIP-77 sync figure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde_json::{json, Value};
use tests::Relay;
use tokio_tungstenite::tungstenite::Message;

use crate::report::{percentile, report, turn_order, Better, Faults, Measured, Rounds};
use crate::{connect, names, next_json, pump, Meter, Sample, Target, ANSWER_TIMEOUT};

/// Words of the preloaded contents: each event holds two of them, so one
/// word is in about 0.2% of the store (2,000 of a million events).
const VOCABULARY: usize = 1000;

/// What the preload stored: its authors, its channels, and the
/// `(created_at, id)` of its kind 7 events (the sync figure's set).
type Preloaded = (Vec<Keys>, Vec<String>, Vec<(u64, [u8; 32])>);

/// Fills a store for the query figure: `n` events over 1000 authors, kinds
/// 1/7/9, `p` tags over 1000 pubkeys, `h` tags over 20 channels, a day of
/// timestamps, two words of [`VOCABULARY`] in each content.
async fn preload(url: &str, n: usize, channels_owner: &Keys) -> Preloaded {
    let authors: Vec<Keys> = (0..1000).map(|_| Keys::generate()).collect();
    let channels: Vec<String> = (0..20).map(|i| format!("bench-{i}")).collect();
    // Channels (the owner creates them; kind 1 in them needs no membership).
    let mut ws = connect(url).await;
    // A relay without NIP-42 (nostr-rs-relay by default) sends no challenge.
    if let Ok(Some(v)) = tokio::time::timeout(Duration::from_secs(2), next_json(&mut ws)).await {
        if v[0] == "AUTH" {
            let auth = EventBuilder::new(Kind::Authentication, "")
                .tags([
                    Tag::custom("relay", [url]),
                    Tag::custom("challenge", [v[1].as_str().unwrap_or_default()]),
                ])
                .finalize(channels_owner)
                .unwrap();
            ws.send(Message::Text(json!(["AUTH", auth]).to_string().into()))
                .await
                .unwrap();
            let _ = next_json(&mut ws).await;
        }
    }
    for c in &channels {
        let ev = EventBuilder::new(Kind::from_u16(9007), "")
            .tags([Tag::custom("h", [c.as_str()])])
            .finalize(channels_owner)
            .unwrap();
        ws.send(Message::Text(json!(["EVENT", ev]).to_string().into()))
            .await
            .unwrap();
        while let Some(v) = next_json(&mut ws).await {
            if v[0] == "OK" {
                break;
            }
        }
    }
    let now = Timestamp::now().as_secs();
    let pks: Vec<String> = authors.iter().map(|k| k.public_key().to_hex()).collect();
    let chunk = 50_000;
    let mut done = 0;
    let mut kind7 = Vec::new();
    let (mut accepted, mut faults) = (0, Faults::default());
    while done < n {
        let m = chunk.min(n - done);
        let events: Vec<Event> = (done..done + m)
            .into_par_iter()
            .map(|i| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                let k = &authors[rng.random_range(0..authors.len())];
                let kind = *[1u16, 7, 9].choose(&mut rng).unwrap();
                let mut tags = vec![Tag::custom("p", [pks[rng.random_range(0..pks.len())].as_str()])];
                if kind != 9 && rng.random_bool(0.5) {
                    tags.push(Tag::custom(
                        "h",
                        [channels[rng.random_range(0..channels.len())].as_str()],
                    ));
                }
                let (w1, w2) = (rng.random_range(0..VOCABULARY), rng.random_range(0..VOCABULARY));
                EventBuilder::new(Kind::from_u16(kind), format!("preload {i} w{w1} w{w2}"))
                    .tags(tags)
                    .custom_created_at(Timestamp::from_secs(now - rng.random_range(0..86_400)))
                    .finalize(k)
                    .unwrap()
            })
            .collect();
        kind7.extend(
            events
                .iter()
                .filter(|e| e.kind.as_u16() == 7)
                .map(|e| (e.created_at.as_secs(), e.id.to_bytes())),
        );
        let mut parts: Vec<Vec<Event>> = vec![Vec::new(); 16];
        for (i, e) in events.into_iter().enumerate() {
            parts[i % 16].push(e);
        }
        let hs: Vec<_> = parts
            .into_iter()
            .map(|p| tokio::spawn(pump(url.to_string(), p, 256)))
            .collect();
        for h in hs {
            let (ok, f) = h.await.unwrap();
            accepted += ok;
            faults.add(f);
        }
        done += m;
        eprintln!("  preloaded {done}/{n}");
    }
    if !faults.is_clean() {
        eprintln!("  {url} stored {accepted} of {n} preloaded events: {faults}");
    }
    (authors, channels, kind7)
}

/// Authors in the follows shape's list: a home feed's follow list.
const FOLLOWS: usize = 100;

/// Keys of authors with no event in the preloaded store (a follow list's
/// authors who post elsewhere), made once: a key is a curve point, so
/// random bytes would not do.
fn elsewhere() -> &'static [String] {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        (0..1000)
            .map(|_| Keys::generate().public_key().to_hex())
            .collect()
    })
}

/// A filter shape of the query figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Author,
    Kind,
    P,
    H,
    TimeRange,
    Search,
    /// A home feed: kind 1 of a follow list's 100 authors.
    Follows,
    /// The same where 10 of the 100 post to this relay and 90 elsewhere
    /// (keys with no event here): most of a feed's authors, on one relay
    /// of several.
    FollowsElsewhere,
}

impl Shape {
    const ALL: [Shape; 8] = [
        Shape::Author,
        Shape::Follows,
        Shape::FollowsElsewhere,
        Shape::Kind,
        Shape::P,
        Shape::H,
        Shape::TimeRange,
        Shape::Search,
    ];

    fn label(self) -> &'static str {
        match self {
            Shape::Author => "author",
            Shape::Kind => "kind",
            Shape::P => "#p",
            Shape::H => "#h",
            Shape::TimeRange => "time range",
            Shape::Search => "search",
            Shape::Follows => "follows",
            Shape::FollowsElsewhere => "follows, 90 elsewhere",
        }
    }

    /// The next filter of this shape, `limit` 50, over the preloaded store.
    fn filter(self, rng: &mut rand::rngs::StdRng, pks: &[String], channels: &[String], now: u64) -> Value {
        match self {
            Shape::Author => json!({"authors": [pks.choose(rng).unwrap()], "limit": 50}),
            Shape::Kind => json!({"kinds": [7], "limit": 50}),
            Shape::P => json!({"#p": [pks.choose(rng).unwrap()], "limit": 50}),
            Shape::H => json!({"#h": [channels.choose(rng).unwrap()], "limit": 50}),
            Shape::Follows => {
                let follows: Vec<&String> = pks.choose_multiple(rng, FOLLOWS).collect();
                json!({"authors": follows, "kinds": [1], "limit": 50})
            }
            Shape::FollowsElsewhere => {
                let here = pks.choose_multiple(rng, FOLLOWS / 10);
                let elsewhere = elsewhere().choose_multiple(rng, FOLLOWS - FOLLOWS / 10);
                let follows: Vec<&String> = here.chain(elsewhere).collect();
                json!({"authors": follows, "kinds": [1], "limit": 50})
            }
            Shape::Search => {
                let w = rng.random_range(0..VOCABULARY);
                json!({"search": format!("w{w}"), "limit": 50})
            }
            Shape::TimeRange => {
                let since = now - rng.random_range(3_600..86_400);
                json!({"since": since, "until": since + 600, "limit": 50})
            }
        }
    }
}

/// How a query figure loads the relay.
#[derive(Debug, Clone, Copy)]
struct Load {
    conns: usize,
    /// REQs in flight on each connection.
    depth: usize,
    /// How long each round sends new REQs: rounds of equal time rather
    /// than of equal count, so that a slow relay is measured as long as a
    /// fast one and its CPU (read in 10 ms ticks) over a second or more.
    round: Duration,
}

/// What one connection's REQs measured: each REQ's `(ms since the figure
/// began when sent, ms from send to EOSE)`, and its faults.
type Timed = (Vec<(f64, f64)>, Faults);

/// REQs over one connection to `url` until `stop`, `depth` in flight, each timed
/// from the moment it is sent to its EOSE (only `EOSE` and `CLOSED` frames
/// are parsed: the bench's CPU stays out of the relay's way). A `CLOSED`
/// before EOSE counts as refused; a REQ still open when the relay has been
/// silent for [`ANSWER_TIMEOUT`] counts as without EOSE, and the
/// connection stops there (a peer that never ends a subscription is
/// reported, not waited for forever).
async fn req_stream(
    url: &str,
    load: Load,
    stop: Instant,
    epoch: Instant,
    mut next: impl FnMut() -> Value,
) -> Timed {
    let mut ws = connect(url).await;
    let mut open: HashMap<String, (f64, Instant)> = HashMap::with_capacity(load.depth);
    let (mut sent, mut timed, mut faults) = (0, Vec::new(), Faults::default());
    loop {
        while open.len() < load.depth && Instant::now() < stop {
            let sub = format!("q{sent}");
            let req = json!(["REQ", sub, next()]).to_string();
            let since_epoch = epoch.elapsed().as_secs_f64() * 1000.0;
            open.insert(sub, (since_epoch, Instant::now()));
            ws.send(Message::Text(req.into())).await.expect("send REQ");
            sent += 1;
        }
        if open.is_empty() {
            break;
        }
        let text = match tokio::time::timeout(ANSWER_TIMEOUT, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => t,
            Ok(Some(Ok(_))) => continue,
            _ => {
                faults.no_eose += open.len();
                eprintln!(
                    "{url}: {} REQs without EOSE within 30 s; this connection stops",
                    open.len()
                );
                break;
            }
        };
        let t = text.as_str();
        let closed = t.starts_with("[\"CLOSED\"");
        if !closed && !t.starts_with("[\"EOSE\"") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(t) else {
            continue;
        };
        let Some((since_epoch, at)) = v[1].as_str().and_then(|s| open.remove(s)) else {
            continue;
        };
        if closed {
            faults.refused += 1;
            continue;
        }
        timed.push((since_epoch, at.elapsed().as_secs_f64() * 1000.0));
        let close = json!(["CLOSE", v[1]]).to_string();
        ws.send(Message::Text(close.into())).await.expect("send CLOSE");
    }
    (timed, faults)
}

/// After a bulk load, what PostgreSQL's manual advises ("Populating a
/// Database": run ANALYZE afterwards) and what autovacuum would otherwise
/// do during the measurement: `VACUUM (ANALYZE)` on the store, then a
/// checkpoint, so that queries meet the store a relay serves from, not one
/// still digesting a million inserts. SQLite needs nothing (its planner
/// reads no statistics; the relay checkpoints its WAL itself).
fn settle(store: &tests::relay::Store) {
    if store.backend.name() != "postgres" {
        return;
    }
    let started = Instant::now();
    if let Err(e) = store.try_sql("VACUUM (ANALYZE)") {
        eprintln!("VACUUM (ANALYZE) failed: {e}");
    }
    let vacuumed = started.elapsed().as_secs_f64();
    if let Err(e) = store.try_sql("CHECKPOINT") {
        eprintln!("CHECKPOINT failed: {e}");
    }
    eprintln!(
        "  settled: VACUUM (ANALYZE) {vacuumed:.1} s, CHECKPOINT {:.1} s",
        started.elapsed().as_secs_f64() - vacuumed
    );
}

pub async fn query(
    targets: &[Target],
    ours: &Relay,
    rounds: usize,
    quick: bool,
    saturating: (usize, usize),
    latency_log: Option<std::path::PathBuf>,
) {
    let n = if quick { 50_000 } else { 1_000_000 };
    let owner = Keys::generate();
    let mut data = Vec::new();
    for t in targets {
        eprintln!("preloading {} events into {}", n, t.name);
        data.push(preload(&t.url, n, &owner).await);
    }
    settle(&ours.store);
    let round = Duration::from_secs(if quick { 1 } else { 3 });
    let latency = Load {
        conns: 8,
        depth: 1,
        round,
    };
    let saturated = Load {
        conns: saturating.0.max(1),
        depth: saturating.1.max(1),
        round,
    };
    for shape in Shape::ALL {
        // NIP-50 is not a shape every peer serves: ours only.
        let serving = if shape == Shape::Search {
            &targets[..1]
        } else {
            targets
        };
        for load in [latency, saturated] {
            let measured = shape_rounds(serving, &data, shape, load, rounds, latency_log.as_deref()).await;
            let mut figures = [Vec::new(), Vec::new(), Vec::new()];
            for [rate, p50, p99] in measured {
                figures[0].push(rate);
                figures[1].push(p50);
                figures[2].push(p99);
            }
            let label = format!(
                "query {} ({n} events, {} conn x {} in flight)",
                shape.label(),
                load.conns,
                load.depth
            );
            let names = names(serving);
            report(&label, "REQ/s", Better::Higher, "REQ", &names, &figures[0]);
            report(
                &format!("{label} p50"),
                "ms",
                Better::Lower,
                "REQ",
                &names,
                &figures[1],
            );
            report(
                &format!("{label} p99"),
                "ms",
                Better::Lower,
                "REQ",
                &names,
                &figures[2],
            );
        }
    }
    sync_figure(&targets[0], &data[0].2, rounds).await;
}

/// Rounds of one shape under one load, every target in turn each round,
/// the order alternating (A B, B A: the machine's drift over the figure,
/// and what one target's round leaves to the next, fall on all alike):
/// per target, REQ/s (with the relay's CPU per REQ), p50 and p99, each
/// the median over rounds.
async fn shape_rounds(
    targets: &[Target],
    data: &[Preloaded],
    shape: Shape,
    load: Load,
    rounds: usize,
    latency_log: Option<&std::path::Path>,
) -> Vec<[Measured; 3]> {
    let epoch = Instant::now();
    let mut acc: Vec<[Rounds; 3]> = targets.iter().map(|_| Default::default()).collect();
    // Round 0 is a warm-up, not counted: the first time a query shape runs
    // on each of the relay's pooled database connections it is parsed and
    // planned there (on PostgreSQL a round trip and, with time partitions,
    // a costly plan); in a short round those first uses alone would be the
    // p99.
    for round in 0..=rounds {
        for i in turn_order(round, targets.len()) {
            let (t, d, [rate, p50, p99]) = (&targets[i], &data[i], &mut acc[i]);
            let (s, lat) = shape_round(t, d, shape, load, round, epoch, latency_log).await;
            if round > 0 {
                rate.push(s.rate, s.cpu_us, s.generator_cores, s.faults);
                p50.push(percentile(&lat, 0.5), None, s.generator_cores, s.faults);
                p99.push(percentile(&lat, 0.99), None, s.generator_cores, s.faults);
            }
        }
    }
    acc.iter()
        .map(|[rate, p50, p99]| [rate.measured(), p50.measured(), p99.measured()])
        .collect()
}

/// One round of one shape under one load against one target: the
/// meter's sample and the latencies (ms, sorted).
async fn shape_round(
    t: &Target,
    (authors, channels, _): &Preloaded,
    shape: Shape,
    load: Load,
    round: usize,
    epoch: Instant,
    latency_log: Option<&std::path::Path>,
) -> (Sample, Vec<f64>) {
    let now = Timestamp::now().as_secs();
    let pks: Vec<String> = authors.iter().map(|k| k.public_key().to_hex()).collect();
    let meter = Meter::start(t);
    let stop = Instant::now() + load.round;
    let hs: Vec<_> = (0..load.conns)
        .map(|c| {
            let (url, pks, channels) = (t.url.clone(), pks.clone(), channels.clone());
            let mut rng = rand::rngs::StdRng::seed_from_u64((round * load.conns + c) as u64);
            tokio::spawn(async move {
                let next = move || shape.filter(&mut rng, &pks, &channels, now);
                req_stream(&url, load, stop, epoch, next).await
            })
        })
        .collect();
    let (mut lat, mut faults) = (Vec::new(), Faults::default());
    for (c, h) in hs.into_iter().enumerate() {
        let (timed, f) = h.await.expect("query connection");
        faults.add(f);
        if let Some(path) = latency_log {
            log_latencies(path, &t.name, shape, round, c, &timed);
        }
        lat.extend(timed.into_iter().map(|(_, ms)| ms));
    }
    let s = meter.sample(t, lat.len(), faults);
    lat.sort_by(f64::total_cmp);
    (s, lat)
}

/// Appends one line per timed REQ: target, shape, round, connection, ms
/// since the figure started when sent, ms to EOSE (to tell a tail spread
/// over the run from stalls).
fn log_latencies(
    path: &std::path::Path,
    target: &str,
    shape: Shape,
    round: usize,
    c: usize,
    timed: &[(f64, f64)],
) {
    use std::io::Write;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("latency log");
    for (sent, ms) in timed {
        writeln!(out, "{target} {} {round} {c} {sent:.3} {ms:.3}", shape.label()).expect("latency log");
    }
}

/// NIP-77: a client holding the store's kind 7 events but every 100th
/// reconciles with the relay (`negentropy` crate on both ends), from
/// NEG-OPEN to the last message; ours only.
async fn sync_figure(t: &Target, kind7: &[(u64, [u8; 32])], rounds: usize) {
    use negentropy::{Id, Negentropy, NegentropyStorageVector};
    let url = t.url.as_str();
    let mut times = Rounds::default();
    let (mut exchanges, mut missing) = (0, 0);
    for round in 0..=rounds {
        let mut storage = NegentropyStorageVector::with_capacity(kind7.len());
        for (i, (at, id)) in kind7.iter().enumerate() {
            if i % 100 != 0 {
                storage.insert(*at, Id::from_byte_array(*id)).unwrap();
            }
        }
        storage.seal().unwrap();
        let mut client = Negentropy::owned(storage, 0).unwrap();
        let mut ws = connect(url).await;
        let meter = Meter::start(t);
        let first = client.initiate().unwrap();
        let sub = format!("sync{round}");
        ws.send(Message::Text(
            json!(["NEG-OPEN", sub, {"kinds": [7]}, hex::encode(first)])
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
        let (mut have, mut need) = (Vec::new(), Vec::new());
        exchanges = 0;
        while let Some(v) = next_json(&mut ws).await {
            if v[1] != sub.as_str() {
                continue;
            }
            if v[0] != "NEG-MSG" {
                eprintln!("sync refused: {v}");
                return;
            }
            exchanges += 1;
            let msg = hex::decode(v[2].as_str().unwrap_or_default()).unwrap();
            match client.reconcile_with_ids(&msg, &mut have, &mut need).unwrap() {
                Some(next) => ws
                    .send(Message::Text(
                        json!(["NEG-MSG", sub, hex::encode(next)]).to_string().into(),
                    ))
                    .await
                    .unwrap(),
                None => break,
            }
        }
        missing = need.len();
        let s = meter.sample(t, 1, Faults::default());
        if round > 0 {
            // One sync per stretch: its rate is 1 / seconds.
            times.push(1000.0 / s.rate, s.cpu_us, s.generator_cores, s.faults);
        }
    }
    report(
        &format!(
            "sync {} kind 7 events, 1% missing ({missing} found, {exchanges} messages)",
            kind7.len()
        ),
        "ms",
        Better::Lower,
        "sync",
        &names(std::slice::from_ref(t)),
        &[times.measured()],
    );
}
