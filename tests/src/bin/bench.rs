//! Benchmarks: the relay started here, load generated here (events signed
//! before the clock starts), one line per figure, each the median of
//! several rounds. With `--peer <ws url>` the same load also runs against
//! another relay and each line gets the ratio (ours / peer for rates, peer /
//! ours for latencies: above 1 means ours is better).
//!
//! cargo run --release -p tests --bin bench -- --quick
//! cargo run --release -p tests --bin bench -- --peer ws://127.0.0.1:8080

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde_json::{json, Value};
use tests::{Backend, Relay, RelayOptions};
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug, Clone)]
#[command(about = "Relay benchmarks")]
struct Args {
    /// A few minutes in all: smaller stores and fewer rounds.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// Another relay to run the same load against (ingest, query, fan-out).
    #[arg(long)]
    peer: Option<String>,
    /// Figures to run (comma separated): ingest,query (with search and sync),fanout,delivery,pipeline,memory.
    #[arg(long, default_value = "ingest,query,fanout,delivery,pipeline,memory")]
    only: String,
    /// Extra environment of the measured relay (`KEY=VALUE`, repeatable),
    /// e.g. `RUST_LOG=info,relay=debug,access=off` to measure without the
    /// access log.
    #[arg(long = "relay-env")]
    relay_env: Vec<String>,
    /// Serves the relay's Prometheus metrics (`metrics_listen`) during the
    /// run, to measure what recording them costs.
    #[arg(long)]
    metrics: bool,
    /// Rounds per figure (default 3 quick, 5 full).
    #[arg(long)]
    rounds: Option<usize>,
    /// Offered load (deliveries per second) of the delivery latency figure.
    #[arg(long, default_value_t = 250)]
    delivery_rate: u32,
    /// Writes the relay's log (debug level for the relay: one line per
    /// write batch and per call batch) to this file at the end.
    #[arg(long)]
    relay_log: Option<std::path::PathBuf>,
    /// With `--backend postgres`: loads pg_stat_statements into the server
    /// and writes its statements, most total time (planning and execution)
    /// first, to this file at the end (the database's share of a figure).
    #[arg(long)]
    pg_stats: Option<std::path::PathBuf>,
    /// Unanswered EVENTs each ingest connection keeps in flight, against
    /// every target (our relay reads 1024 ahead; nostr-rs-relay stalls with
    /// that many from 16 connections, and runs with 256).
    #[arg(long, default_value_t = INGEST_WINDOW)]
    ingest_window: usize,
    /// Appends every timed query to this file, one line each: target,
    /// shape, round, connection, ms since the figure started when sent,
    /// ms to EOSE (to tell a tail spread over the run from stalls).
    #[arg(long)]
    latency_log: Option<std::path::PathBuf>,
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const BENCH_TOML: &str = "[limits]\nevents_per_second = 1000000\nevents_burst = 1000000\nmax_inflight_events = 1024\nmax_subscriptions = 200\n\
max_outbound_bytes = 67108864\napi_requests_per_second = 1000000\napi_burst = 1000000\nfanout_buffer_events = 65536\n\
[channels]\nmembership_kinds = [9]\n[sqlite]\npool_size = 16\n[postgres]\npool_size = 32\n\
[deliveries]\ndefault_lease_secs = 60\n[workflows]\nrun_poll_interval_ms = 1000\n";

/// Read buffer of every bench connection. tungstenite zero-fills its read
/// buffer up to this size before each read (128 KiB by default), which in
/// the fan-out figure was half of the load generator's CPU: 1000 receivers
/// each zeroing 128 KiB per frame, on the two cores the relay also needs.
const CLIENT_READ_BUFFER_BYTES: usize = 8 * 1024;

async fn connect(url: &str) -> Ws {
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(CLIENT_READ_BUFFER_BYTES);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true)
        .await
        .expect("connect");
    ws
}

async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.next().await? {
            Ok(Message::Text(t)) => return serde_json::from_str(t.as_str()).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// CPU seconds (user + system) used so far by process `pid`, with
/// `children` also its exited children and its live child processes (a
/// PostgreSQL server: the postmaster and its backends). Linux /proc.
fn cpu_secs(pid: u32, children: bool) -> f64 {
    // Fields after the command name: state ppid ... utime(12) stime(13)
    // cutime(14) cstime(15), 1-based from the state field.
    let fields = |p: &str| -> Option<(u32, [u64; 4])> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        Some((n(1) as u32, [n(11), n(12), n(13), n(14)]))
    };
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Some((_, [ut, st, cut, cst])) = fields(&pid.to_string()) else {
        return 0.0;
    };
    let mut total = ut + st;
    if children {
        total += cut + cst;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
                continue;
            };
            if let Some((ppid, [ut, st, _, _])) = fields(name) {
                if ppid == pid {
                    total += ut + st;
                }
            }
        }
    }
    total as f64 / ticks
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Signs `n` kind-1 events from `keys` in parallel (before any clock starts).
fn presign(n: usize, keys: &[Keys], tag: &str) -> Vec<Event> {
    let now = Timestamp::now().as_secs();
    (0..n)
        .into_par_iter()
        .map(|i| {
            let k = &keys[i % keys.len()];
            EventBuilder::new(Kind::TextNote, format!("{tag} {i}"))
                .tags([Tag::custom("t", ["bench"])])
                .custom_created_at(Timestamp::from_secs(now - (i as u64 % 3600)))
                .finalize(k)
                .expect("sign")
        })
        .collect()
}

/// Publishes `events` over one connection, at most `window` unanswered at a
/// time; returns how many were accepted.
async fn pump(url: String, events: Vec<Event>, window: usize) -> usize {
    let mut ws = connect(&url).await;
    let (mut sent, mut answered, mut ok) = (0usize, 0usize, 0usize);
    while answered < events.len() {
        while sent < events.len() && sent - answered < window {
            let msg = json!(["EVENT", events[sent]]).to_string();
            ws.send(Message::Text(msg.into())).await.expect("send");
            sent += 1;
        }
        let Some(v) = next_json(&mut ws).await else { break };
        if v[0] == "OK" {
            answered += 1;
            if v[2] == true {
                ok += 1;
            }
        }
    }
    ok
}

/// Unanswered EVENTs each ingest connection keeps in flight by default: as
/// many as the bench's relay reads ahead (`max_inflight_events` in
/// `BENCH_TOML`), so that checking signatures of the next events overlaps
/// with storing the previous ones even from one connection.
const INGEST_WINDOW: usize = 1024;

/// Events per second accepted from `conns` connections, each keeping
/// `window` events in flight.
async fn ingest_round(url: &str, n: usize, conns: usize, window: usize, keys: &[Keys], round: usize) -> f64 {
    let events = presign(
        n,
        keys,
        &format!("ingest-{conns}-{round}-{}", rand::random::<u32>()),
    );
    let mut parts: Vec<Vec<Event>> = vec![Vec::new(); conns];
    for (i, e) in events.into_iter().enumerate() {
        parts[i % conns].push(e);
    }
    let start = Instant::now();
    let handles: Vec<_> = parts
        .into_iter()
        .map(|p| tokio::spawn(pump(url.to_string(), p, window)))
        .collect();
    let mut accepted = 0;
    for h in handles {
        accepted += h.await.expect("pump");
    }
    let secs = start.elapsed().as_secs_f64();
    assert!(accepted * 100 >= n * 99, "only {accepted} of {n} accepted");
    accepted as f64 / secs
}

struct Target {
    name: &'static str,
    url: String,
    /// The relay process we started, for RSS (ours only).
    pid: Option<u32>,
}

fn report(figure: &str, ours: f64, peer: Option<f64>, unit: &str, higher_is_better: bool) {
    match peer {
        Some(p) => {
            let ratio = if higher_is_better { ours / p } else { p / ours };
            println!("{figure}: {ours:.1} {unit} (peer {p:.1} {unit}; ratio {ratio:.2}x)");
        }
        None => println!("{figure}: {ours:.1} {unit}"),
    }
}

async fn ingest(targets: &[Target], rounds: usize, quick: bool, window: usize) {
    assert!(window > 0, "--ingest-window must be positive");
    let keys: Vec<Keys> = (0..64).map(|_| Keys::generate()).collect();
    for conns in [1usize, 16, 256] {
        let n = if quick { 20_000 } else { 100_000 };
        let mut results = Vec::new();
        for t in targets {
            let mut v = Vec::new();
            for r in 0..rounds {
                v.push(ingest_round(&t.url, n, conns, window, &keys, r).await);
            }
            results.push(median(v));
        }
        report(
            &format!("ingest {conns} conn"),
            results[0],
            results.get(1).copied(),
            "events/s",
            true,
        );
    }
}

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
            h.await.unwrap();
        }
        done += m;
        eprintln!("  preloaded {done}/{n}");
    }
    (authors, channels, kind7)
}

/// One REQ, timed from send to EOSE; `None` when no EOSE (or CLOSED) came
/// within 30 s (a peer that never ends a subscription is reported, not
/// waited for forever).
async fn timed_req(ws: &mut Ws, sub: &str, filter: &Value) -> Option<f64> {
    let start = Instant::now();
    ws.send(Message::Text(json!(["REQ", sub, filter]).to_string().into()))
        .await
        .unwrap();
    // Only the end of the answer is parsed: the bench's CPU stays out of
    // the relay's way (the EVENT frames are counted, not decoded).
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Text(t) = msg else { continue };
            let t = t.as_str();
            if !(t.starts_with("[\"EOSE\"") || t.starts_with("[\"CLOSED\"")) {
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(t) else {
                continue;
            };
            if v[1] == sub {
                return true;
            }
        }
        false
    })
    .await;
    if !matches!(ended, Ok(true)) {
        return None;
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    ws.send(Message::Text(json!(["CLOSE", sub]).to_string().into()))
        .await
        .unwrap();
    Some(ms)
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

async fn query(
    targets: &[Target],
    ours: &Relay,
    rounds: usize,
    quick: bool,
    latency_log: Option<std::path::PathBuf>,
) {
    let epoch = Instant::now();
    let n = if quick { 50_000 } else { 1_000_000 };
    let owner = Keys::generate();
    let mut data = Vec::new();
    for t in targets {
        eprintln!("preloading {} events into {}", n, t.name);
        data.push(preload(&t.url, n, &owner).await);
    }
    settle(&ours.store);
    let now = Timestamp::now().as_secs();
    let kinds = ["author", "kind", "#p", "#h", "time range", "search"];
    let per_round = if quick { 200 } else { 1000 };
    for kind in kinds {
        let mut rates = Vec::new();
        let mut p50s = Vec::new();
        let mut p99s = Vec::new();
        for (ti, t) in targets.iter().enumerate() {
            if kind == "search" && ti > 0 {
                // NIP-50 is not a shape every peer serves: ours only.
                continue;
            }
            let (authors, channels, _) = &data[ti];
            let (mut rate_v, mut p50_v, mut p99_v) = (Vec::new(), Vec::new(), Vec::new());
            // Round 0 is a warm-up, not counted: the first time a query
            // shape runs on each of the relay's pooled database connections
            // it is parsed and planned there (on PostgreSQL a round trip
            // and, with time partitions, a costly plan); with 200 queries a
            // round those first uses alone would be the p99.
            for round in 0..=rounds {
                let conns = 8;
                let start = Instant::now();
                let hs: Vec<_> = (0..conns)
                    .map(|c| {
                        let url = t.url.clone();
                        let authors: Vec<String> = authors.iter().map(|k| k.public_key().to_hex()).collect();
                        let channels = channels.clone();
                        tokio::spawn(async move {
                            let mut ws = connect(&url).await;
                            let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64);
                            let mut lat = Vec::new();
                            let mut stamped = Vec::new();
                            for q in 0..per_round / conns {
                                let f = match kind {
                                    "author" => {
                                        json!({"authors": [authors.choose(&mut rng).unwrap()], "limit": 50})
                                    }
                                    "kind" => json!({"kinds": [7], "limit": 50}),
                                    "#p" => json!({"#p": [authors.choose(&mut rng).unwrap()], "limit": 50}),
                                    "#h" => json!({"#h": [channels.choose(&mut rng).unwrap()], "limit": 50}),
                                    "search" => {
                                        let w = rng.random_range(0..VOCABULARY);
                                        json!({"search": format!("w{w}"), "limit": 50})
                                    }
                                    _ => {
                                        let since = now - rng.random_range(3_600..86_400);
                                        json!({"since": since, "until": since + 600, "limit": 50})
                                    }
                                };
                                let sent = epoch.elapsed().as_secs_f64() * 1000.0;
                                match timed_req(&mut ws, &format!("q{q}"), &f).await {
                                    Some(ms) => {
                                        lat.push(ms);
                                        stamped.push((c, sent, ms));
                                    }
                                    None => {
                                        eprintln!(
                                            "{url}: no EOSE within 30 s for {f}; this connection stops"
                                        );
                                        break;
                                    }
                                }
                            }
                            (lat, stamped)
                        })
                    })
                    .collect();
                let mut lat = Vec::new();
                for h in hs {
                    let (l, stamped) = h.await.unwrap();
                    lat.extend(l);
                    if let Some(path) = &latency_log {
                        use std::io::Write;
                        let mut out = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .expect("latency log");
                        for (c, sent, ms) in stamped {
                            writeln!(out, "{} {kind} {round} {c} {sent:.3} {ms:.3}", t.name)
                                .expect("latency log");
                        }
                    }
                }
                if round == 0 {
                    continue;
                }
                let secs = start.elapsed().as_secs_f64();
                lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
                rate_v.push(lat.len() as f64 / secs);
                p50_v.push(percentile(&lat, 0.5));
                p99_v.push(percentile(&lat, 0.99));
            }
            rates.push(median(rate_v));
            p50s.push(median(p50_v));
            p99s.push(median(p99_v));
        }
        report(
            &format!("query {kind} ({n} events)"),
            rates[0],
            rates.get(1).copied(),
            "REQ/s",
            true,
        );
        report(
            &format!("query {kind} p50"),
            p50s[0],
            p50s.get(1).copied(),
            "ms",
            false,
        );
        report(
            &format!("query {kind} p99"),
            p99s[0],
            p99s.get(1).copied(),
            "ms",
            false,
        );
    }
    sync_figure(&targets[0].url, &data[0].2, rounds).await;
}

/// NIP-77: a client holding the store's kind 7 events but every 100th
/// reconciles with the relay (`negentropy` crate on both ends), from
/// NEG-OPEN to the last message; ours only.
async fn sync_figure(url: &str, kind7: &[(u64, [u8; 32])], rounds: usize) {
    use negentropy::{Id, Negentropy, NegentropyStorageVector};
    let mut times = Vec::new();
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
        let start = Instant::now();
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
        if round > 0 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    report(
        &format!(
            "sync {} kind 7 events, 1% missing ({missing} found, {exchanges} messages)",
            kind7.len()
        ),
        median(times),
        None,
        "ms",
        false,
    );
}

async fn fanout(targets: &[Target], rounds: usize, quick: bool) {
    let subs = if quick { 200 } else { 1000 };
    let per_round = 10;
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    for t in targets {
        let author = Keys::generate();
        // Only new events: `since` now rather than `limit: 0`, which
        // nostr-rs-relay never answers with EOSE.
        let filter = json!({"authors": [author.public_key().to_hex()], "since": Timestamp::now().as_secs()});
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
        let mut ready = Vec::new();
        for i in 0..subs {
            let (url, filter, tx) = (t.url.clone(), filter.clone(), tx.clone());
            let (rtx, rrx) = tokio::sync::oneshot::channel();
            ready.push(rrx);
            tokio::spawn(async move {
                let mut ws = connect(&url).await;
                ws.send(Message::Text(
                    json!(["REQ", format!("f{i}"), filter]).to_string().into(),
                ))
                .await
                .unwrap();
                let mut rtx = Some(rtx);
                // The receipt time is taken as the frame arrives, and the
                // event's id found without decoding the whole frame: the
                // bench's 1000 clients share the two cores with the relay.
                while let Some(Ok(msg)) = ws.next().await {
                    let Message::Text(t) = msg else { continue };
                    let at = Instant::now();
                    let t = t.as_str();
                    if t.starts_with("[\"EOSE\"") {
                        if let Some(r) = rtx.take() {
                            let _ = r.send(());
                        }
                    } else if t.starts_with("[\"EVENT\"") {
                        let _ = tx.send((event_id_of(t).unwrap_or_default().to_string(), at));
                    }
                }
            });
        }
        // Bounded: a relay that never ends a subscription's stored results
        // is reported, not waited for forever.
        let mut all_ready = true;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for r in ready {
            all_ready &= matches!(tokio::time::timeout_at(deadline, r).await, Ok(Ok(())));
            if !all_ready {
                break;
            }
        }
        if !all_ready {
            assert!(
                t.pid.is_none(),
                "our relay did not answer every subscription with EOSE"
            );
            eprintln!(
                "{}: not every subscription got EOSE within 30 s; fan-out not measured",
                t.name
            );
            continue;
        }
        let (mut p50_v, mut p99_v) = (Vec::new(), Vec::new());
        let mut publisher = connect(&t.url).await;
        for _ in 0..rounds {
            let mut lat = Vec::new();
            for j in 0..per_round {
                let ev = EventBuilder::new(Kind::TextNote, format!("fanout {j} {}", rand::random::<u64>()))
                    .finalize(&author)
                    .unwrap();
                let id = ev.id.to_hex();
                publisher
                    .send(Message::Text(json!(["EVENT", ev]).to_string().into()))
                    .await
                    .unwrap();
                let ok_at = loop {
                    let v = next_json(&mut publisher).await.expect("publisher answer");
                    if v[0] == "OK" && v[1] == id.as_str() {
                        break Instant::now();
                    }
                };
                let mut got = 0;
                let deadline = Instant::now() + Duration::from_secs(10);
                while got < subs && Instant::now() < deadline {
                    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                        Ok(Some((eid, at))) if eid == id => {
                            got += 1;
                            lat.push(at.saturating_duration_since(ok_at).as_secs_f64() * 1000.0);
                        }
                        Ok(Some(_)) => {}
                        _ => break,
                    }
                }
                assert_eq!(got, subs, "not every subscriber got the event");
            }
            lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
            p50_v.push(percentile(&lat, 0.5));
            p99_v.push(percentile(&lat, 0.99));
        }
        p50s.push(median(p50_v));
        p99s.push(median(p99_v));
    }
    report(
        &format!("fanout p50 to {subs} subscribers"),
        p50s[0],
        p50s.get(1).copied(),
        "ms",
        false,
    );
    report(
        &format!("fanout p99 to {subs} subscribers"),
        p99s[0],
        p99s.get(1).copied(),
        "ms",
        false,
    );
}

/// The `"id"` of the event in an `["EVENT", sub, event]` frame, found by
/// its key (an event's JSON has one `"id"` key; tag values are arrays, so a
/// tag cannot hold `"id":"` as a key).
fn event_id_of(frame: &str) -> Option<&str> {
    let start = frame.find("\"id\":\"")? + 6;
    let len = frame[start..].find('"')?;
    Some(&frame[start..start + len])
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn memory(t: &Target, quick: bool) {
    let Some(pid) = t.pid else { return };
    let n = if quick { 2_000 } else { 10_000 };
    let before = rss_bytes(pid);
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let mut ws = connect(&t.url).await;
        let _ = next_json(&mut ws).await; // the AUTH challenge: the connection is fully set up
        conns.push(ws);
        if i % 1000 == 999 {
            eprintln!("  {} connections open", i + 1);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(pid);
    println!(
        "memory: {:.0} bytes per idle connection ({n} connections, RSS {:.1} MiB -> {:.1} MiB)",
        (after.saturating_sub(before)) as f64 / n as f64,
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    drop(conns);
}

/// Deliveries per second through the whole pipeline, and trigger-to-claim
/// latency, with `agents` simulated agents (wake subscription + NIP-98 claim
/// by id + finish with a reply) in this process. Two phases per round:
/// throughput (every trigger posted as soon as the previous one is
/// acknowledged: the queue is always full, so its latency is queueing), then
/// latency at an offered load of `rate` deliveries per second (triggers
/// paced, each mentioning every agent).
async fn delivery(relay: &Relay, rounds: usize, quick: bool, rate: u32) {
    use tests::workflow::{on_message, Fixture};
    let agents_n = if quick { 20 } else { 50 };
    let messages = if quick { 50 } else { 200 };
    let (mut rates, mut burst_p50, mut burst_p99) = (Vec::new(), Vec::new(), Vec::new());
    let (mut paced_rates, mut p50_v, mut p99_v) = (Vec::new(), Vec::new(), Vec::new());
    // CPU per delivery in the back-to-back phase: the machine's two cores
    // are shared by the relay, the database and the bench's agents, so
    // this, unlike the rate, hardly moves with the hour's speed.
    let (mut relay_cpu, mut pg_cpu) = (Vec::new(), Vec::new());
    let pg_pid = match &relay.store.backend {
        Backend::Postgres(server) => server.pid(),
        Backend::Sqlite => None,
    };
    // Round 0 warms up and is not counted: it fills the tables a little,
    // after which PostgreSQL gets the statistics autovacuum would have
    // gathered within its first minute (its nap is 60 s; the bench's
    // database is seconds old). Without them the planner takes the
    // delivery table for empty, and the relay's connections keep plans
    // that read every delivery of the community for a lookup by key
    // (measured: 830 blocks a finish).
    for round in 0..=rounds {
        let warm_up = round == 0;
        let messages = if warm_up { 10 } else { messages };
        let channel = format!("deliver-{round}");
        let mut fx = Fixture::new(relay, &channel, agents_n).await;
        let mentions: Vec<String> = (0..agents_n).map(|i| fx.mention(i)).collect();
        fx.define(
            &format!("w{round}"),
            &on_message(&format!("{} go {{{{trigger.text}}}}", mentions.join(" "))),
        )
        .await;
        let mut done_rx = start_agents(relay, &fx.agents, &channel).await;
        let cpu_before = (
            relay.pid().map(|p| cpu_secs(p, false)),
            pg_pid.map(|p| cpu_secs(p, true)),
        );
        let burst = triggers(
            &mut fx,
            &mut done_rx,
            &format!("b{round}"),
            messages,
            agents_n,
            None,
        )
        .await;
        if warm_up {
            if matches!(relay.store.backend, Backend::Postgres(_)) {
                relay.store.sql("ANALYZE");
            }
            continue;
        }
        let per_delivery_ms = |before: Option<f64>, now: Option<f64>| {
            before
                .zip(now)
                .map(|(b, n)| (n - b) * 1000.0 / (agents_n * messages) as f64)
        };
        if let Some(ms) = per_delivery_ms(cpu_before.0, relay.pid().map(|p| cpu_secs(p, false))) {
            relay_cpu.push(ms);
        }
        if let Some(ms) = per_delivery_ms(cpu_before.1, pg_pid.map(|p| cpu_secs(p, true))) {
            pg_cpu.push(ms);
        }
        rates.push(burst.0);
        burst_p50.push(percentile(&burst.1, 0.5));
        burst_p99.push(percentile(&burst.1, 0.99));
        let interval = Duration::from_secs_f64(agents_n as f64 / f64::from(rate.max(1)));
        let paced = triggers(
            &mut fx,
            &mut done_rx,
            &format!("p{round}"),
            messages,
            agents_n,
            Some(interval),
        )
        .await;
        paced_rates.push(paced.0);
        p50_v.push(percentile(&paced.1, 0.5));
        p99_v.push(percentile(&paced.1, 0.99));
    }
    println!(
        "delivery: {:.1} deliveries/s end to end ({agents_n} agents, triggers back to back)",
        median(rates)
    );
    if !relay_cpu.is_empty() {
        let database = if pg_cpu.is_empty() {
            " (SQLite works in the relay's process)".to_string()
        } else {
            format!(", PostgreSQL {:.2} ms", median(pg_cpu))
        };
        println!(
            "delivery CPU per delivery, triggers back to back: relay {:.2} ms{database}",
            median(relay_cpu)
        );
    }
    println!(
        "delivery trigger-to-claim, triggers back to back: p50 {:.1} ms, p99 {:.1} ms (queueing)",
        median(burst_p50),
        median(burst_p99)
    );
    println!(
        "delivery trigger-to-claim at {rate} deliveries/s offered ({:.1} achieved): p50 {:.1} ms, p99 {:.1} ms",
        median(paced_rates),
        median(p50_v),
        median(p99_v)
    );
}

/// Starts one simulated agent per key, each subscribed to its wakes;
/// returns the channel on which they report each finished delivery
/// (when they claimed it, and its trigger's text).
async fn start_agents(
    relay: &Relay,
    agents: &[Keys],
    channel: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<(Instant, String)> {
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, String)>();
    let http = format!("http://{}", relay.addr);
    let mut ready = Vec::new();
    for a in agents.iter().cloned() {
        let (url, http, done_tx, channel) =
            (relay.ws_url(), http.clone(), done_tx.clone(), channel.to_string());
        let (rtx, rrx) = tokio::sync::oneshot::channel();
        ready.push(rrx);
        tokio::spawn(simulated_agent(url, http, a, channel, done_tx, rtx));
    }
    for r in ready {
        let _ = r.await;
    }
    done_rx
}

/// Agents asked by every run of the pipeline figure.
const PIPELINE_AGENTS: usize = 20;

/// The three-step workflow end to end: each trigger's run asks all
/// [`PIPELINE_AGENTS`] agents (`ask_agent`, waiting for every reply),
/// posts a summary quoting them when every reply checks out (`if`,
/// `send_message`), and skips the escalation (`if` false). Runs per second over back-to-back triggers, and
/// the time from sending the trigger to the final message reaching a
/// subscriber.
async fn pipeline(relay: &Relay, rounds: usize, quick: bool) {
    use tests::workflow::Fixture;
    let runs_n = if quick { 20 } else { 50 };
    let (mut rates, mut p50s, mut p99s) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        let warm_up = round == 0;
        let n = if warm_up { 5 } else { runs_n };
        let channel = format!("pipe-{round}");
        let mut fx = Fixture::new(relay, &channel, PIPELINE_AGENTS).await;
        let mentions: Vec<String> = (0..PIPELINE_AGENTS).map(|i| fx.mention(i)).collect();
        fx.define(
            &format!("pipe{round}"),
            &json!({"name": "pipeline", "trigger": {"on": "message_posted"}, "steps": [
                {"id": "ask", "action": "ask_agent", "text": format!("{} look at {{{{trigger.text}}}}", mentions.join(" "))},
                {"id": "summary", "action": "send_message", "if": "steps.ask.output.replies.all(r, r.text == 'ack')",
                 "text": "summary of {{trigger.text}}: {{steps.ask.output.reply}}"},
                {"id": "escalate", "action": "send_message", "if": "steps.ask.output.replies.exists(r, r.text != 'ack')",
                 "text": "escalating {{trigger.text}}"}]}),
        )
        .await;
        let _done_rx = start_agents(relay, &fx.agents, &channel).await;
        let finals = watch_finals(relay, &channel, &fx.relay_pk, n).await;
        let start = Instant::now();
        let mut sent_at = std::collections::HashMap::new();
        for i in 0..n {
            let text = format!("run{round}-{i}");
            // The clock starts when the trigger is sent, not at its OK.
            sent_at.insert(text.clone(), Instant::now());
            fx.post(&text).await;
        }
        let arrived = tokio::time::timeout(Duration::from_secs(300), finals)
            .await
            .expect("every run's final message within 300 s")
            .expect("watcher");
        let secs = start.elapsed().as_secs_f64();
        if warm_up {
            continue;
        }
        let mut lat: Vec<f64> = arrived
            .iter()
            .filter_map(|(at, text)| {
                sent_at
                    .get(text)
                    .map(|s| at.duration_since(*s).as_secs_f64() * 1000.0)
            })
            .collect();
        assert_eq!(lat.len(), n, "a final message for every run");
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rates.push(n as f64 / secs);
        p50s.push(percentile(&lat, 0.5));
        p99s.push(percentile(&lat, 0.99));
    }
    println!(
        "pipeline: {:.1} runs/s (ask_agent to {PIPELINE_AGENTS} agents -> if on their replies -> send_message, a skipped step), \
         trigger sent to final message p50 {:.1} ms, p99 {:.1} ms",
        median(rates),
        median(p50s),
        median(p99s)
    );
}

/// A subscriber to the relay's messages in `channel`: resolves with the
/// arrival time and trigger text of the first `n` summaries.
async fn watch_finals(
    relay: &Relay,
    channel: &str,
    relay_pk: &str,
    n: usize,
) -> tokio::task::JoinHandle<Vec<(Instant, String)>> {
    let mut c = tests::Client::connect(&relay.ws_url()).await;
    c.req(
        "fin",
        vec![json!({"kinds": [9], "#h": [channel], "authors": [relay_pk], "limit": 0})],
    )
    .await;
    tokio::spawn(async move {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let e = c.next_event("fin").await;
            if let Some(rest) = e.content.strip_prefix("summary of ") {
                let text = rest.split(':').next().unwrap_or_default().to_string();
                got.push((Instant::now(), text));
            }
        }
        got
    })
}

/// Posts `n` triggers (one every `interval`, or each as soon as the previous
/// one is acknowledged) and waits until every agent claimed and finished
/// each; returns deliveries per second and the sorted trigger-to-claim
/// latencies in ms.
async fn triggers(
    fx: &mut tests::workflow::Fixture,
    done_rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
    prefix: &str,
    n: usize,
    agents_n: usize,
    interval: Option<Duration>,
) -> (f64, Vec<f64>) {
    let total = agents_n * n;
    let start = Instant::now();
    let mut sent_at = std::collections::HashMap::new();
    let mut lat = Vec::new();
    let record = |lat: &mut Vec<f64>,
                  sent_at: &std::collections::HashMap<String, Instant>,
                  (claimed_at, text): (Instant, String)| {
        if let Some(s) = sent_at.get(&text) {
            lat.push(claimed_at.saturating_duration_since(*s).as_secs_f64() * 1000.0);
        }
    };
    for i in 0..n {
        if let Some(iv) = interval {
            tokio::time::sleep_until((start + iv * i as u32).into()).await;
        }
        let text = format!("m{prefix}-{i}");
        fx.post(&text).await;
        sent_at.insert(text, Instant::now());
        // Claims answered meanwhile (their trigger was acknowledged before).
        while let Ok(d) = done_rx.try_recv() {
            record(&mut lat, &sent_at, d);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while lat.len() < total && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(30), done_rx.recv()).await {
            Ok(Some(d)) => record(&mut lat, &sent_at, d),
            _ => break,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(lat.len(), total, "not every delivery was claimed and finished");
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (total as f64 / secs, lat)
}

async fn simulated_agent(
    url: String,
    http: String,
    keys: Keys,
    channel: String,
    done: tokio::sync::mpsc::UnboundedSender<(Instant, String)>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let client = reqwest::Client::new();
    let mut ws = connect(&url).await;
    let challenge = next_json(&mut ws).await.unwrap()[1]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let auth = tests::client::auth_event(&keys, &challenge, &url);
    ws.send(Message::Text(json!(["AUTH", auth]).to_string().into()))
        .await
        .unwrap();
    let _ = next_json(&mut ws).await;
    let me = keys.public_key().to_hex();
    ws.send(Message::Text(
        json!(["REQ", "w", {"kinds": [24620], "#p": [me], "limit": 0}])
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut ready = Some(ready);
    let call = |path: String, body: Value| {
        let (client, http, keys) = (client.clone(), http.clone(), keys.clone());
        async move {
            let url = format!("{http}{path}");
            let bytes = body.to_string().into_bytes();
            let auth = protocol::nip98::header(&keys, "POST", &url, &bytes);
            let r = client
                .post(&url)
                .header("Authorization", auth)
                .header("Content-Type", "application/json")
                .body(bytes)
                .send()
                .await;
            match r {
                Ok(r) => r.json::<Value>().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        }
    };
    while let Some(v) = next_json(&mut ws).await {
        if v[0] == "EOSE" {
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
            continue;
        }
        if v[0] != "EVENT" {
            continue;
        }
        let tag = |name: &str| {
            v[2]["tags"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t[0] == name))
                .and_then(|t| t[1].as_str())
                .unwrap_or_default()
                .to_string()
        };
        let body = json!({"delivery_id": tag("delivery"), "expected": {"run_id": tag("workflow-run"), "step_id": tag("workflow-step"),
            "definition_event_id": tag("workflow-definition"), "message_event_id": tag("e"), "channel": tag("h")},
            "records_operations": true});
        let claimed = call("/deliveries/claim".into(), body).await;
        let claimed_at = Instant::now();
        let d = &claimed["delivery"];
        if d.is_null() {
            continue;
        }
        let text = d["trigger_context"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let reply = EventBuilder::new(Kind::from_u16(9), "ack")
            .tags([
                Tag::custom("h", [channel.as_str()]),
                Tag::custom(
                    "e",
                    [d["message_event_id"].as_str().unwrap_or_default(), "", "root"],
                ),
            ])
            .finalize(&keys)
            .unwrap();
        let fin = call(
            format!("/deliveries/{}/finish", d["id"].as_str().unwrap_or_default()),
            json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply}),
        )
        .await;
        if fin["status"] == "delivered" {
            let _ = done.send((claimed_at, text));
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let rounds = args.rounds.unwrap_or(if args.quick { 3 } else { 5 });
    let backend = match args.backend.as_str() {
        "postgres" => {
            // The test suite's servers keep 64 MB of shared buffers (many
            // run at once); a server holding a relay's million events is
            // given more, as any would be (PostgreSQL's manual suggests a
            // quarter of the memory): with 64 MB the `#p` query's scattered
            // rows missed the buffers, p99 7.9-15.8 ms against 4.9-5.2 with 1 GB.
            // TESTS_PG_SETTINGS still overrides it.
            let mut settings = vec!["shared_buffers=1GB".to_string()];
            if args.pg_stats.is_some() {
                settings.push("shared_preload_libraries=pg_stat_statements".to_string());
                settings.push("pg_stat_statements.track_planning=on".to_string());
            }
            let server = tests::pg::PgServer::start_with(settings).expect("PostgreSQL");
            if args.pg_stats.is_some() {
                server
                    .psql("postgres", "CREATE EXTENSION pg_stat_statements")
                    .expect("pg_stat_statements");
            }
            Backend::Postgres(Arc::new(server))
        }
        _ => Backend::Sqlite,
    };
    let metrics = if args.metrics {
        "metrics_listen = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    let env = args
        .relay_env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let relay = Relay::start_opts(
        &backend,
        RelayOptions {
            config_toml: format!("{metrics}{BENCH_TOML}"),
            env,
        },
    );
    println!(
        "bench backend={} quick={} rounds={rounds} cpus={} date={}",
        args.backend,
        args.quick,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        String::from_utf8_lossy(
            &std::process::Command::new("date")
                .arg("-u")
                .arg("+%F")
                .output()
                .unwrap()
                .stdout
        )
        .trim()
    );
    let mut targets = vec![Target {
        name: "ours",
        url: relay.ws_url(),
        pid: relay.pid(),
    }];
    if let Some(p) = &args.peer {
        targets.push(Target {
            name: "peer",
            url: p.clone(),
            pid: None,
        });
    }
    let only: Vec<&str> = args.only.split(',').collect();
    if only.contains(&"ingest") {
        ingest(&targets, rounds, args.quick, args.ingest_window).await;
    }
    if only.contains(&"fanout") {
        fanout(&targets, rounds, args.quick).await;
    }
    if only.contains(&"delivery") {
        delivery(&relay, rounds, args.quick, args.delivery_rate).await;
    }
    if only.contains(&"pipeline") {
        pipeline(&relay, rounds, args.quick).await;
    }
    if only.contains(&"query") {
        query(&targets, &relay, rounds, args.quick, args.latency_log.clone()).await;
    }
    if let Some(path) = &args.relay_log {
        if let Err(e) = std::fs::write(path, relay.log()) {
            eprintln!("writing the relay's log to {}: {e}", path.display());
        }
    }
    if let (Some(path), Backend::Postgres(server)) = (&args.pg_stats, &backend) {
        let top = server.psql(
            "postgres",
            "SELECT 'all statements: ' || sum(calls) || ' calls, ' || round(sum(total_exec_time)::numeric) \
             || ' ms executing, ' || round(sum(total_plan_time)::numeric) || ' ms planning; transactions: ' \
             || (SELECT sum(xact_commit) || ' committed, ' || sum(xact_rollback) || ' rolled back' FROM pg_stat_database) \
             FROM pg_stat_statements UNION ALL (SELECT round((total_exec_time + total_plan_time)::numeric, 1) || ' ms | ' || calls || ' calls | ' \
             || plans || ' plans ' || round(total_plan_time::numeric, 1) || ' ms | ' \
             || round(mean_exec_time::numeric, 3) || ' ms mean exec | ' || rows || ' rows | ' \
             || shared_blks_hit + shared_blks_read || ' blocks | ' || regexp_replace(query, '\\s+', ' ', 'g') \
             FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 40)",
        );
        match top {
            Ok(text) => {
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("writing pg_stat_statements to {}: {e}", path.display());
                }
            }
            Err(e) => eprintln!("reading pg_stat_statements: {e}"),
        }
    }
    if only.contains(&"memory") {
        // A fresh relay process, so that RSS is not what the other figures left.
        let fresh = Relay::start_opts(
            &backend,
            RelayOptions {
                config_toml: BENCH_TOML.into(),
                ..Default::default()
            },
        );
        let t = Target {
            name: "ours",
            url: fresh.ws_url(),
            pid: fresh.pid(),
        };
        memory(&t, args.quick).await;
    }
}
