//! Benchmarks: the relay started here, load generated here (events signed
//! before the clock starts), one line per figure, each the median of
//! several rounds. With `--peer name=<ws url>` (repeatable) the same load
//! also runs against other relays and each line leads with the ratios
//! (ours / peer for rates, peer / ours for latencies: above 1 means ours is
//! better). Every line carries what makes it fair to read: the relay's CPU
//! per operation (from /proc, for local processes), the load generator's
//! own CPU, and every refusal, timeout and missing answer. The machine
//! line and each relay's durability settings are printed first.
//!
//! cargo run --release -p tests --bin bench -- --quick
//! cargo run --release -p tests --bin bench -- --peer nostr-rs-relay=ws://127.0.0.1:8080

mod fanout;
mod host;
mod query;
mod report;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};

use rayon::prelude::*;
use serde_json::{json, Value};
use tests::{Backend, Relay, RelayOptions};
use tokio_tungstenite::tungstenite::Message;

use host::cpu_secs;
use report::{median, percentile, report, turn_order, Better, Faults, Measured, Rounds};

#[derive(Parser, Debug, Clone)]
#[command(about = "Relay benchmarks")]
struct Args {
    /// A few minutes in all: smaller stores and fewer rounds.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// Another relay to run the same load against (ingest, query,
    /// fan-out), as `name=ws://host:port` or a bare URL (named "peer");
    /// repeatable. A peer on this machine is found by its listening port,
    /// so its CPU and its sockets' `TCP_NODELAY` are measured too.
    #[arg(long)]
    peer: Vec<String>,
    /// With `--backend postgres`: run the server with `fsync=off` and
    /// `synchronous_commit=off`, for experiments only. Published figures
    /// use PostgreSQL's default durability.
    #[arg(long)]
    unsafe_pg: bool,
    /// `sqlite.synchronous` of the measured relay: `normal` (the relay's
    /// default: WAL, a commit survives a process crash, the last
    /// commits may not survive a power cut) or `full` (an fsync per commit,
    /// like strfry's LMDB).
    #[arg(long, default_value = "normal")]
    sqlite_synchronous: String,
    /// Connections of the saturating query load (each keeping
    /// `--load-depth` REQs in flight).
    #[arg(long, default_value_t = 32)]
    load_conns: usize,
    /// REQs in flight on each connection of the saturating query load.
    #[arg(long, default_value_t = 4)]
    load_depth: usize,
    /// Figures to run (comma separated): ingest,query (with search and sync),fanout,delivery,mentions,pipeline,fairness,memory.
    #[arg(
        long,
        default_value = "ingest,query,fanout,delivery,mentions,pipeline,fairness,memory"
    )]
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
    /// Live subscribers of the fan-out figure (default 200 quick, 1000
    /// full), each on a connection of its own, e.g. 10000 for the relay's
    /// memory per subscriber at that count.
    #[arg(long)]
    fanout_subs: Option<usize>,
    /// Connections of the fan-out figure subscribed to other authors
    /// (bystanders: no published event goes to them), which a relay that
    /// matches subscriptions in its hub never wakes.
    #[arg(long, default_value_t = 0)]
    fanout_others: usize,
    /// Offered load (deliveries per second) of the delivery latency figure.
    #[arg(long, default_value_t = 250)]
    delivery_rate: u32,
    /// How long each simulated agent works on a claimed delivery before it
    /// finishes, in the delivery figure's paced phase (0: at once, the
    /// worst case, where each burst's finishes share the machine with its
    /// claims). A managed agent's handler takes seconds; with a work time
    /// longer than a burst, the paced trigger-to-claim is the claim path
    /// alone. Keep it under the time between triggers (agents per
    /// `--delivery-rate`): each agent works on one delivery at a time.
    #[arg(long, default_value_t = 0)]
    agent_work_ms: u64,
    /// The measured relay's `deliveries.mention_debounce_secs` (the
    /// mentions figure: how long a conversation must be quiet before its
    /// mentions are claimed as one turn; 0: at once).
    #[arg(long, default_value_t = 0)]
    mention_debounce_secs: u32,
    /// Writes the relay's log (debug level for the relay: one line per
    /// write batch and per call batch) to this file at the end.
    #[arg(long)]
    relay_log: Option<std::path::PathBuf>,
    /// With `--backend postgres`: loads pg_stat_statements into the server
    /// and writes its statements, most total time (planning and execution)
    /// first, to this file at the end (the database's share of a figure).
    #[arg(long)]
    pg_stats: Option<std::path::PathBuf>,
    /// With `--backend postgres`: a hot standby of the server (streaming,
    /// asynchronous) in `read_database_urls`, serving the relay's reads.
    #[arg(long)]
    pg_standby: bool,
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

/// The measured relay's configuration, but for `[sqlite] synchronous`.
const BENCH_TOML: &str = "[limits]\nevents_per_second = 1000000\nevents_burst = 1000000\nmax_inflight_events = 1024\nmax_subscriptions = 200\n\
max_outbound_bytes = 67108864\napi_requests_per_second = 1000000\napi_burst = 1000000\nfanout_buffer_events = 65536\n\
[channels]\nmembership_kinds = [9]\n[sqlite]\npool_size = 16\nsynchronous = \"{synchronous}\"\n[postgres]\npool_size = 32\n\
[deliveries]\ndefault_lease_secs = 60\nmentions_per_hour = 1000000\nmentions_per_day = 1000000\nmention_debounce_secs = {debounce}\n[workflows]\nrun_poll_interval_ms = 1000\n";

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

/// The measured relay's configuration with `sqlite.synchronous` and
/// `deliveries.mention_debounce_secs` set.
fn bench_toml(args: &Args) -> String {
    BENCH_TOML
        .replace("{synchronous}", &args.sqlite_synchronous)
        .replace("{debounce}", &args.mention_debounce_secs.to_string())
}

/// How long the bench waits for any one answer before it counts the
/// request as timed out and stops that connection.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Publishes `events` over one connection, at most `window` unanswered at a
/// time; returns how many were accepted, and what was refused or never
/// answered.
async fn pump(url: String, events: Vec<Event>, window: usize) -> (usize, Faults) {
    let mut ws = connect(&url).await;
    let (mut sent, mut answered, mut ok) = (0usize, 0usize, 0usize);
    let mut faults = Faults::default();
    while answered < events.len() {
        while sent < events.len() && sent - answered < window {
            let msg = json!(["EVENT", events[sent]]).to_string();
            ws.send(Message::Text(msg.into())).await.expect("send");
            sent += 1;
        }
        let Ok(Some(v)) = tokio::time::timeout(ANSWER_TIMEOUT, next_json(&mut ws)).await else {
            break;
        };
        if v[0] == "OK" {
            answered += 1;
            if v[2] == true {
                ok += 1;
            } else {
                faults.refused += 1;
            }
        }
    }
    faults.timed_out += events.len() - answered;
    (ok, faults)
}

/// Unanswered EVENTs each ingest connection keeps in flight by default: as
/// many as the bench's relay reads ahead (`max_inflight_events` in
/// `BENCH_TOML`), so that checking signatures of the next events overlaps
/// with storing the previous ones even from one connection.
const INGEST_WINDOW: usize = 1024;

/// Events per second accepted from `conns` connections, each keeping
/// `window` events in flight, with the relay's CPU per accepted event.
async fn ingest_round(
    t: &Target,
    n: usize,
    conns: usize,
    window: usize,
    keys: &[Keys],
    round: usize,
) -> Sample {
    let events = presign(
        n,
        keys,
        &format!("ingest-{conns}-{round}-{}", rand::random::<u32>()),
    );
    let mut parts: Vec<Vec<Event>> = vec![Vec::new(); conns];
    for (i, e) in events.into_iter().enumerate() {
        parts[i % conns].push(e);
    }
    let meter = Meter::start(t);
    let handles: Vec<_> = parts
        .into_iter()
        .map(|p| tokio::spawn(pump(t.url.clone(), p, window)))
        .collect();
    let (mut accepted, mut faults) = (0, Faults::default());
    for h in handles {
        let (ok, f) = h.await.expect("pump");
        accepted += ok;
        faults.add(f);
    }
    meter.sample(t, accepted, faults)
}

/// With `--pg-standby`: a standby of the store's server, made after its
/// database, and the configuration line that reads from it.
fn standby_of(args: &Args, store: &tests::relay::Store) -> (Option<tests::pg::PgServer>, String) {
    if !args.pg_standby {
        return (None, String::new());
    }
    let Backend::Postgres(server) = &store.backend else {
        panic!("--pg-standby needs --backend postgres");
    };
    let standby = server.standby(false).expect("a standby");
    let db = store.database_url.rsplit('/').next().expect("a database");
    let line = format!(
        "read_database_urls = [\"postgres://postgres@127.0.0.1:{}/{db}\"]\n",
        standby.port
    );
    (Some(standby), line)
}

/// A relay the bench measures: ours (started here) or a peer.
struct Target {
    name: String,
    url: String,
    /// The relay's process when it runs on this machine: ours, or a
    /// peer found by its listening port. CPU and RSS are read from it.
    pid: Option<u32>,
    /// Ours on PostgreSQL: the servers' postmasters (the primary's, and
    /// the standby's with `--pg-standby`), whose backends' CPU is the
    /// relay's too.
    db_pids: Vec<u32>,
}

impl Target {
    /// The relay this bench started, with its PostgreSQL server if any.
    fn ours(relay: &Relay) -> Target {
        Target {
            name: "ours".into(),
            url: relay.ws_url(),
            pid: relay.pid(),
            db_pids: match &relay.store.backend {
                Backend::Postgres(server) => server.pid().into_iter().collect(),
                Backend::Sqlite => Vec::new(),
            },
        }
    }

    /// CPU seconds of the relay (and its database) so far.
    fn cpu(&self) -> Option<f64> {
        let pid = self.pid?;
        Some(cpu_secs(pid, false) + self.db_pids.iter().map(|&d| cpu_secs(d, true)).sum::<f64>())
    }
}

/// Clocks at the start of a measured stretch: wall, the relay's CPU, and
/// the bench's own CPU.
struct Meter {
    start: Instant,
    relay_cpu: Option<f64>,
    generator_cpu: f64,
}

/// One round of a figure: operations per second, the relay's CPU per
/// operation, the generator's cores, and the round's faults.
struct Sample {
    rate: f64,
    cpu_us: Option<f64>,
    generator_cores: f64,
    faults: Faults,
}

impl Meter {
    fn start(t: &Target) -> Meter {
        Meter {
            start: Instant::now(),
            relay_cpu: t.cpu(),
            generator_cpu: cpu_secs(std::process::id(), false),
        }
    }

    /// The stretch ends: `ops` operations completed.
    fn sample(&self, t: &Target, ops: usize, faults: Faults) -> Sample {
        let secs = self.start.elapsed().as_secs_f64();
        let ops_f = ops.max(1) as f64;
        let cpu_us = self
            .relay_cpu
            .zip(t.cpu())
            .map(|(before, now)| (now - before) * 1e6 / ops_f);
        let generator = cpu_secs(std::process::id(), false) - self.generator_cpu;
        Sample {
            rate: ops as f64 / secs,
            cpu_us,
            generator_cores: generator / secs,
            faults,
        }
    }
}

fn names(targets: &[Target]) -> Vec<String> {
    targets.iter().map(|t| t.name.clone()).collect()
}

/// CPU of the bare id-and-signature check of one event, in microseconds
/// (the floor of a relay's CPU per accepted event): the median of three
/// passes over pre-signed events, on this thread, with the `nostr`
/// crate's `Event::verify` (the checks the relay runs).
fn check_floor_us(keys: &[Keys]) -> f64 {
    const EVENTS: usize = 4_000;
    let events = presign(EVENTS, keys, "floor");
    let mut passes: Vec<f64> = (0..3)
        .map(|_| {
            let started = std::time::Instant::now();
            for e in &events {
                assert!(e.verify().is_ok(), "a pre-signed event verifies");
            }
            started.elapsed().as_secs_f64() * 1e6 / EVENTS as f64
        })
        .collect();
    passes.sort_by(f64::total_cmp);
    passes[1]
}

async fn ingest(targets: &[Target], rounds: usize, quick: bool, window: usize) {
    assert!(window > 0, "--ingest-window must be positive");
    let keys: Vec<Keys> = (0..64).map(|_| Keys::generate()).collect();
    let floor_us = check_floor_us(&keys);
    println!("ingest floor: the id and signature check alone takes {floor_us:.1} µs of CPU an event (Event::verify, one core)");
    for conns in [1usize, 16, 256] {
        let n = if quick { 20_000 } else { 100_000 };
        // Round by round, every target in turn, the order alternating
        // (A B, B A): the machine's drift over the figure, and what one
        // target's round leaves to the next, fall on all of them alike.
        let mut per_target: Vec<Rounds> = targets.iter().map(|_| Rounds::default()).collect();
        for round in 0..rounds {
            for i in turn_order(round, targets.len()) {
                let s = ingest_round(&targets[i], n, conns, window, &keys, round).await;
                per_target[i].push(s.rate, s.cpu_us, s.generator_cores, s.faults);
            }
        }
        let results: Vec<Measured> = per_target.iter().map(Rounds::measured).collect();
        report(
            &format!("ingest {conns} conn ({window} in flight each)"),
            "events/s",
            Better::Higher,
            "event",
            &names(targets),
            &results,
        );
        if let Some(cpu) = results.first().and_then(|m| m.cpu_us) {
            println!(
                "ingest {conns} conn: ours spends {:.2}x the bare check's CPU per accepted event",
                cpu / floor_us
            );
        }
    }
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
/// paced, each mentioning every agent; agents work `work_ms` on each
/// delivery before they finish it).
async fn delivery(relay: &Relay, rounds: usize, quick: bool, rate: u32, work_ms: u64) {
    use tests::workflow::{on_message, Fixture};
    let agents_n = if quick { 20 } else { 50 };
    let messages = if quick { 50 } else { 200 };
    let target = Target::ours(relay);
    let (mut rates, mut burst_p50, mut burst_p99) = (Rounds::default(), Rounds::default(), Rounds::default());
    let (mut paced_rates, mut p50, mut p99) = (Rounds::default(), Rounds::default(), Rounds::default());
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
        let refusals = Arc::new(AtomicUsize::new(0));
        let mut done_rx = start_agents(relay, &fx.agents, &channel, &refusals).await;
        // CPU per delivery in the back-to-back phase: the machine's cores
        // are shared by the relay, the database and the bench's agents, so
        // this, unlike the rate, hardly moves with the hour's speed.
        let meter = Meter::start(&target);
        let (burst, mut faults) = triggers(
            &mut fx,
            &mut done_rx,
            &format!("b{round}"),
            messages,
            agents_n,
            None,
        )
        .await;
        faults.refused += refusals.swap(0, Ordering::Relaxed);
        let s = meter.sample(&target, burst.len(), faults);
        if warm_up {
            if matches!(relay.store.backend, Backend::Postgres(_)) {
                relay.store.sql("ANALYZE");
            }
            continue;
        }
        rates.push(s.rate, s.cpu_us, s.generator_cores, s.faults);
        burst_p50.push(percentile(&burst, 0.5), None, s.generator_cores, s.faults);
        burst_p99.push(percentile(&burst, 0.99), None, s.generator_cores, s.faults);
        let interval = Duration::from_secs_f64(agents_n as f64 / f64::from(rate.max(1)));
        AGENT_WORK_MS.store(work_ms, Ordering::Relaxed);
        let meter = Meter::start(&target);
        let (paced, mut faults) = triggers(
            &mut fx,
            &mut done_rx,
            &format!("p{round}"),
            messages,
            agents_n,
            Some(interval),
        )
        .await;
        AGENT_WORK_MS.store(0, Ordering::Relaxed);
        faults.refused += refusals.swap(0, Ordering::Relaxed);
        let s = meter.sample(&target, paced.len(), faults);
        paced_rates.push(s.rate, s.cpu_us, s.generator_cores, s.faults);
        p50.push(percentile(&paced, 0.5), None, s.generator_cores, s.faults);
        p99.push(percentile(&paced, 0.99), None, s.generator_cores, s.faults);
    }
    let ours = ["ours".to_string()];
    let one = |r: &Rounds| [r.measured()];
    let back = format!("{agents_n} agents, triggers back to back");
    report(
        &format!("delivery end to end ({back})"),
        "deliveries/s",
        Better::Higher,
        "delivery",
        &ours,
        &one(&rates),
    );
    report(
        &format!("delivery trigger sent to claim p50 ({back}: queueing)"),
        "ms",
        Better::Lower,
        "delivery",
        &ours,
        &one(&burst_p50),
    );
    report(
        &format!("delivery trigger sent to claim p99 ({back}: queueing)"),
        "ms",
        Better::Lower,
        "delivery",
        &ours,
        &one(&burst_p99),
    );
    let paced = match work_ms {
        0 => format!("{agents_n} agents, {rate} deliveries/s offered"),
        ms => format!("{agents_n} agents, {rate} deliveries/s offered, agents work {ms} ms"),
    };
    report(
        &format!("delivery achieved ({paced})"),
        "deliveries/s",
        Better::Higher,
        "delivery",
        &ours,
        &one(&paced_rates),
    );
    report(
        &format!("delivery trigger sent to claim p50 ({paced})"),
        "ms",
        Better::Lower,
        "delivery",
        &ours,
        &one(&p50),
    );
    report(
        &format!("delivery trigger sent to claim p99 ({paced})"),
        "ms",
        Better::Lower,
        "delivery",
        &ours,
        &one(&p99),
    );
}

/// Mentions as work (`--only mentions`): `convs` conversations, each a
/// channel with one agent whose mentions are on and its owner, a member,
/// mentioning it; simulated agents claim by wake (after its `due-in`: the
/// relay's `mention_debounce_secs`) and answer each claim's turn once. A
/// mention's clock runs from its send to its claim: back to back (each
/// round's mentions of every conversation at once) and paced at `rate` a
/// second. Turns: the claims that answered them (a turn takes every due
/// mention of its conversation).
async fn mentions(relay: &Relay, rounds: usize, quick: bool, rate: u32, debounce_secs: u32) {
    let convs = if quick { 20 } else { 50 };
    let per_conv = if quick { 10 } else { 40 };
    let target = Target::ours(relay);
    let mut fixtures = Vec::with_capacity(convs);
    for c in 0..convs {
        let fx = tests::workflow::Fixture::new(relay, &format!("talk-{c}"), 1).await;
        let agent = fx.agents[0].public_key().to_hex();
        let set = tests::workflow::rpc(relay, &fx.owner, "setmentions", json!([agent, true])).await;
        assert_eq!(set.0, 200, "setmentions: {set:?}");
        fixtures.push(fx);
    }
    let placed: Vec<(Keys, String)> = fixtures
        .iter()
        .map(|fx| (fx.agents[0].clone(), fx.channel.clone()))
        .collect();
    let refusals = Arc::new(AtomicUsize::new(0));
    let mut done_rx = start_placed_agents(relay.addr, &placed, &refusals).await;
    let mut talk = Conversations(fixtures);
    let mut burst = MentionRounds::default();
    let mut paced = MentionRounds::default();
    for round in 0..=rounds {
        let warm_up = round == 0;
        let n = if warm_up { 2 } else { per_conv };
        for (kind, into) in [("b", &mut burst), ("p", &mut paced)] {
            let interval =
                (kind == "p").then(|| Duration::from_secs_f64(convs as f64 / f64::from(rate.max(1))));
            let meter = Meter::start(&target);
            let turns_before = TURNS_FINISHED.load(Ordering::Relaxed);
            let (lat, mut faults) = triggers(
                &mut talk,
                &mut done_rx,
                &format!("{kind}{round}"),
                n,
                convs,
                interval,
            )
            .await;
            faults.refused += refusals.swap(0, Ordering::Relaxed);
            let turns = TURNS_FINISHED.load(Ordering::Relaxed) - turns_before;
            let s = meter.sample(&target, lat.len(), faults);
            if !warm_up {
                into.push(&s, &lat, turns);
            }
        }
    }
    let debounce = format!("debounce {debounce_secs} s");
    let back = format!("{convs} conversations, mentions back to back, {debounce}");
    let offered = format!("{convs} conversations, {rate} mentions/s offered, {debounce}");
    let figures = [
        (
            format!("mentions answered ({back})"),
            "mentions/s",
            Better::Higher,
            &burst.rates,
        ),
        (
            format!("turns answered ({back})"),
            "turns/s",
            Better::Higher,
            &burst.turns,
        ),
        (
            format!("mentions a turn ({back})"),
            "mentions",
            Better::Higher,
            &burst.per_turn,
        ),
        (
            format!("mention sent to claim p50 ({back}: queueing)"),
            "ms",
            Better::Lower,
            &burst.p50,
        ),
        (
            format!("mention sent to claim p99 ({back}: queueing)"),
            "ms",
            Better::Lower,
            &burst.p99,
        ),
        (
            format!("turns answered ({offered})"),
            "turns/s",
            Better::Higher,
            &paced.turns,
        ),
        (
            format!("mentions a turn ({offered})"),
            "mentions",
            Better::Higher,
            &paced.per_turn,
        ),
        (
            format!("mention sent to claim p50 ({offered})"),
            "ms",
            Better::Lower,
            &paced.p50,
        ),
        (
            format!("mention sent to claim p99 ({offered})"),
            "ms",
            Better::Lower,
            &paced.p99,
        ),
    ];
    let ours = ["ours".to_string()];
    for (name, unit, better, rounds) in figures {
        let unit_of_cpu = if unit == "turns/s" { "turn" } else { "mention" };
        report(&name, unit, better, unit_of_cpu, &ours, &[rounds.measured()]);
    }
}

/// The mentions figure's rounds of one load: mentions and turns a second
/// (the relay's CPU per mention, per turn), mentions a turn, latencies.
#[derive(Default)]
struct MentionRounds {
    rates: Rounds,
    turns: Rounds,
    per_turn: Rounds,
    p50: Rounds,
    p99: Rounds,
}

impl MentionRounds {
    fn push(&mut self, s: &Sample, lat: &[f64], turns: usize) {
        let (cores, faults) = (s.generator_cores, s.faults);
        let per_turn = lat.len() as f64 / turns.max(1) as f64;
        self.rates.push(s.rate, s.cpu_us, cores, faults);
        self.turns
            .push(s.rate / per_turn, s.cpu_us.map(|us| us * per_turn), cores, faults);
        self.per_turn.push(per_turn, None, cores, faults);
        self.p50.push(percentile(lat, 0.5), None, cores, faults);
        self.p99.push(percentile(lat, 0.99), None, cores, faults);
    }
}

/// Starts one simulated agent per key, each subscribed to its wakes;
/// returns the channel on which they report each finished delivery
/// (when they claimed it, and its trigger's text).
async fn start_agents(
    relay: &Relay,
    agents: &[Keys],
    channel: &str,
    refusals: &Arc<AtomicUsize>,
) -> tokio::sync::mpsc::UnboundedReceiver<(Instant, String)> {
    start_agents_at(relay.addr, agents, channel, refusals).await
}

/// [`start_agents`] in the community served at `addr`.
async fn start_agents_at(
    addr: std::net::SocketAddr,
    agents: &[Keys],
    channel: &str,
    refusals: &Arc<AtomicUsize>,
) -> tokio::sync::mpsc::UnboundedReceiver<(Instant, String)> {
    let placed: Vec<(Keys, String)> = agents.iter().map(|a| (a.clone(), channel.to_string())).collect();
    start_placed_agents(addr, &placed, refusals).await
}

/// [`start_agents`], each agent replying in its own channel.
async fn start_placed_agents(
    addr: std::net::SocketAddr,
    agents: &[(Keys, String)],
    refusals: &Arc<AtomicUsize>,
) -> tokio::sync::mpsc::UnboundedReceiver<(Instant, String)> {
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, String)>();
    let http = format!("http://{addr}");
    let mut ready = Vec::new();
    for (a, channel) in agents.iter().cloned() {
        let (url, http, done_tx) = (format!("ws://{addr}"), http.clone(), done_tx.clone());
        let (rtx, rrx) = tokio::sync::oneshot::channel();
        ready.push(rrx);
        let refusals = refusals.clone();
        tokio::spawn(simulated_agent(url, http, a, channel, (done_tx, refusals), rtx));
    }
    for r in ready {
        let _ = r.await;
    }
    done_rx
}

/// Fair shares under a flood: a quiet community's trigger-to-claim
/// latency, alone and while another community (on the relay's second
/// address) works through a flood of deliveries posted back to back just
/// before, on one relay. Each community has one workflow (a message
/// mentioning its one agent) and one simulated agent; the quiet one's
/// triggers are paced.
async fn fairness(relay: &Relay, quick: bool) {
    use tests::workflow::{on_message, Fixture};
    let flood_n = if quick { 3_000 } else { 10_000 };
    let (quiet_n, pace) = (if quick { 40 } else { 100 }, Duration::from_millis(25));
    let flood_addr = relay.addrs[1];
    relay.cli(&[
        "community",
        "add",
        "--id",
        "flood",
        "--host",
        &flood_addr.ip().to_string(),
        "--url",
        &format!("ws://{flood_addr}"),
    ]);
    let refusals = Arc::new(AtomicUsize::new(0));
    let mut quiet = Fixture::new(relay, "quiet", 1).await;
    let text = format!("{} go {{{{trigger.text}}}}", quiet.mention(0));
    quiet.define("quiet", &on_message(&text)).await;
    let mut quiet_rx = start_agents(relay, &quiet.agents, "quiet", &refusals).await;
    let mut flood = Fixture::new_on(flood_addr, "flood", 1).await;
    let text = format!("{} go {{{{trigger.text}}}}", flood.mention(0));
    flood.define("flood", &on_message(&text)).await;
    let mut flood_rx = start_agents_at(flood_addr, &flood.agents, "flood", &refusals).await;
    // Warm-up, both communities (the engine reads new communities once a
    // second: the flood's first delivery shows it knows this one).
    triggers(&mut quiet, &mut quiet_rx, "warm", 10, 1, Some(pace)).await;
    let (warm, _) = triggers(&mut flood, &mut flood_rx, "warm", 5, 1, None).await;
    assert_eq!(warm.len(), 5, "the flood's community works");
    let (alone, alone_faults) = triggers(&mut quiet, &mut quiet_rx, "alone", quiet_n, 1, Some(pace)).await;
    let floods: Vec<Event> = (0..flood_n)
        .map(|i| tests::event(&flood.owner, 9, &format!("flood {i}"), &[&["h", "flood"]]))
        .collect();
    let posted = Instant::now();
    let (accepted, _) = pump(format!("ws://{flood_addr}"), floods, 256).await;
    let post_secs = posted.elapsed().as_secs_f64();
    let flooded_done = Arc::new(AtomicUsize::new(0));
    let counter = flooded_done.clone();
    let drain = tokio::spawn(async move {
        while flood_rx.recv().await.is_some() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let (during, faults) = triggers(&mut quiet, &mut quiet_rx, "during", quiet_n, 1, Some(pace)).await;
    let flood_claimed = flooded_done.load(Ordering::Relaxed);
    let flood_wait = Instant::now();
    while flooded_done.load(Ordering::Relaxed) < accepted && flood_wait.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained_secs = posted.elapsed().as_secs_f64();
    drain.abort();
    let (p99_alone, p99_during) = (percentile(&alone, 0.99), percentile(&during, 0.99));
    let incomplete = alone_faults.missing + faults.missing + refusals.load(Ordering::Relaxed);
    println!(
        "fairness: quiet community trigger sent to claim, {quiet_n} triggers every {} ms: alone p50 {:.1} ms p99 {:.1} ms; \
         during another community's flood of {accepted} deliveries (posted in {post_secs:.1} s, all claimed {drained_secs:.1} s \
         after the first; {flood_claimed} claimed when the quiet one's last was): p50 {:.1} ms p99 {:.1} ms; \
         p99 during / alone {:.2}x{}",
        pace.as_millis(),
        percentile(&alone, 0.5),
        p99_alone,
        percentile(&during, 0.5),
        p99_during,
        p99_during / p99_alone.max(0.001),
        match incomplete {
            0 => String::new(),
            n => format!(" INCOMPLETE: {n} quiet deliveries missing or claims refused"),
        }
    );
}

/// The measured relay's environment: `--relay-env`, and, unless it sets the log
/// filter, the log at the level a user runs the relay (`info`, its
/// default) where the test harness would add the relay's debug lines;
/// those only with `--relay-log`, which reads them.
fn relay_env(args: &Args) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = args
        .relay_env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if !env.iter().any(|(k, _)| k == "RUST_LOG" || k == "RELAY_LOG") {
        let log = if args.relay_log.is_some() {
            "info,relay=debug"
        } else {
            "info"
        };
        env.push(("RELAY_LOG".to_string(), log.to_string()));
    }
    env
}

/// Agents asked by every run of the pipeline figure.
const PIPELINE_AGENTS: usize = 20;

/// What a pipeline figure's ask step adds.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// Plain text answers.
    Plain,
    /// An `output` schema: every answer is checked at finish, and the
    /// summary's condition reads a typed field.
    Shaped,
}

/// The three-step workflow end to end: each trigger's run asks all
/// [`PIPELINE_AGENTS`] agents (`ask_agent`, waiting for every reply),
/// posts a summary quoting them when every reply checks out (`if`,
/// `send_message`), and skips the escalation (`if` false). Runs per second over back-to-back triggers, and
/// the time from sending the trigger to the final message reaching a
/// subscriber. `label` names the figure's variant (and its channels).
async fn pipeline(relay: &Relay, rounds: usize, quick: bool, variant: Variant, label: &str) {
    use tests::workflow::Fixture;
    let runs_n = if quick { 20 } else { 50 };
    let (mut rates, mut p50s, mut p99s, mut cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let refusals = Arc::new(AtomicUsize::new(0));
    for round in 0..=rounds {
        let warm_up = round == 0;
        let n = if warm_up { 5 } else { runs_n };
        let slug: String = label
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(24)
            .collect();
        let channel = format!("pipe-{slug}-{round}");
        let mut fx = Fixture::new(relay, &channel, PIPELINE_AGENTS).await;
        let mentions: Vec<String> = (0..PIPELINE_AGENTS).map(|i| fx.mention(i)).collect();
        let mut ask = json!({"id": "ask", "action": "ask_agent",
                             "text": format!("{} look at {{{{trigger.text}}}}", mentions.join(" "))});
        let (fine, not_fine) = match variant {
            Variant::Plain => (
                "steps.ask.output.replies.all(r, r.text == 'ack')",
                "steps.ask.output.replies.exists(r, r.text != 'ack')",
            ),
            Variant::Shaped => {
                ask["output"] = json!({"type": "object", "required": ["ok"],
                                       "properties": {"ok": {"type": "boolean"}}});
                (
                    "steps.ask.output.ok && steps.ask.output.replies.all(r, r.status == 'delivered')",
                    "!steps.ask.output.ok",
                )
            }
        };
        fx.define(
            &format!("pipe{slug}{round}"),
            &json!({"name": "pipeline", "trigger": {"on": "message_posted"}, "steps": [ask,
                {"id": "summary", "action": "send_message", "if": fine,
                 "text": "summary of {{trigger.text}}: {{steps.ask.output.reply}}"},
                {"id": "escalate", "action": "send_message", "if": not_fine,
                 "text": "escalating {{trigger.text}}"}]}),
        )
        .await;
        let _done_rx = start_agents(relay, &fx.agents, &channel, &refusals).await;
        let finals = watch_finals(relay, &channel, &fx.relay_pk, n).await;
        let target = Target::ours(relay);
        let meter = Meter::start(&target);
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
        let sample = meter.sample(&target, n, Faults::default());
        if warm_up {
            continue;
        }
        if let Some(us) = sample.cpu_us {
            cpus.push(us);
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
        "pipeline ({label}): {:.1} runs/s (ask_agent to {PIPELINE_AGENTS} agents -> if on their replies -> send_message, a skipped step), \
         trigger sent to final message p50 {:.1} ms, p99 {:.1} ms, relay CPU {:.2} ms a run{}",
        median(rates),
        median(p50s),
        median(p99s),
        median(cpus) / 1000.0,
        match refusals.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(" INCOMPLETE: {n} claims or finishes refused"),
        }
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
/// each; returns the sorted trigger-to-claim latencies in ms (one per
/// delivery finished) and the deliveries that never were.
/// What sends one trigger: returns the text each delivery it makes will
/// carry, with when its message was sent (the clock starts as a trigger
/// is sent, not at its OK).
trait Trigger: Send {
    fn send<'a>(&'a mut self, text: &'a str) -> futures_util::future::BoxFuture<'a, Vec<(String, Instant)>>;
}

/// A message in the fixture's channel, which its workflow turns into one
/// delivery per agent, each carrying the message's text.
impl Trigger for tests::workflow::Fixture {
    fn send<'a>(&'a mut self, text: &'a str) -> futures_util::future::BoxFuture<'a, Vec<(String, Instant)>> {
        Box::pin(async move {
            let sent = Instant::now();
            self.post(text).await;
            vec![(text.to_string(), sent)]
        })
    }
}

/// One mention per conversation: each fixture's owner (a member) p-tags
/// the fixture's one agent in its channel, the text suffixed with the
/// conversation's number.
struct Conversations(Vec<tests::workflow::Fixture>);

impl Trigger for Conversations {
    fn send<'a>(&'a mut self, text: &'a str) -> futures_util::future::BoxFuture<'a, Vec<(String, Instant)>> {
        Box::pin(async move {
            let mut sent = Vec::with_capacity(self.0.len());
            for (j, fx) in self.0.iter_mut().enumerate() {
                let text = format!("{text}@{j}");
                let agent = fx.agents[0].public_key().to_hex();
                let ev = tests::event(&fx.owner, 9, &text, &[&["h", &fx.channel], &["p", &agent]]);
                sent.push((text, Instant::now()));
                fx.owner_client.publish_ok(&ev).await;
            }
            sent
        })
    }
}

async fn triggers(
    fx: &mut dyn Trigger,
    done_rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
    prefix: &str,
    n: usize,
    agents_n: usize,
    interval: Option<Duration>,
) -> (Vec<f64>, Faults) {
    let total = agents_n * n;
    let start = Instant::now();
    let mut sent_at = std::collections::HashMap::new();
    let mut lat = Vec::new();
    let record = |lat: &mut Vec<f64>,
                  sent_at: &std::collections::HashMap<String, Instant>,
                  (claimed_at, text): (Instant, String)| {
        if let Some(s) = sent_at.get(&text) {
            lat.push(claimed_at.duration_since(*s).as_secs_f64() * 1000.0);
        }
    };
    for i in 0..n {
        if let Some(iv) = interval {
            tokio::time::sleep_until((start + iv * i as u32).into()).await;
        }
        let text = format!("m{prefix}-{i}");
        // The clock starts as the trigger is sent, not at its OK.
        sent_at.extend(fx.send(&text).await);
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
    let faults = Faults {
        missing: total - lat.len(),
        ..Faults::default()
    };
    lat.sort_by(f64::total_cmp);
    (lat, faults)
}

async fn simulated_agent(
    url: String,
    http: String,
    keys: Keys,
    channel: String,
    (done, refusals): (
        tokio::sync::mpsc::UnboundedSender<(Instant, String)>,
        Arc<AtomicUsize>,
    ),
    ready: tokio::sync::oneshot::Sender<()>,
) {
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
    let sim = Arc::new(SimAgent {
        client: reqwest::Client::new(),
        http,
        keys,
        channel,
        done,
        refusals,
    });
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
        match tag("due-in").parse::<u64>().unwrap_or(0) {
            0 => {
                sim.work(body).await;
            }
            // A mention waiting out its conversation's debounce: claimed
            // then (the wakes of one conversation all wait; the last one's
            // claim takes the turn), and those that came during the turn
            // are polled for after it, as the reference agent does.
            secs => {
                let sim = sim.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(secs) + Duration::from_millis(200)).await;
                    if sim.work(body).await {
                        while sim.work(json!({"records_operations": true})).await {}
                    }
                });
            }
        }
    }
}

/// Turns finished by every simulated agent (a claim and its finish, with
/// the rows of its turn).
static TURNS_FINISHED: AtomicUsize = AtomicUsize::new(0);

/// How long a simulated agent works on a claimed delivery before it
/// finishes it, in ms (`--agent-work-ms`, in the delivery figure's paced
/// phase only; 0 elsewhere).
static AGENT_WORK_MS: AtomicU64 = AtomicU64::new(0);

/// A simulated agent's calls: claim, answer every delivery of the claim's
/// turn with one reply, finish them together.
struct SimAgent {
    client: reqwest::Client,
    http: String,
    keys: Keys,
    channel: String,
    done: tokio::sync::mpsc::UnboundedSender<(Instant, String)>,
    refusals: Arc<AtomicUsize>,
}

impl SimAgent {
    async fn call(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.http);
        let bytes = body.to_string().into_bytes();
        let auth = protocol::nip98::header(&self.keys, "POST", &url, &bytes);
        let r = self
            .client
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

    /// Claims with `body` and answers what it got: `false` when nothing
    /// was due (a mention another turn took, or one not yet due).
    async fn work(&self, body: Value) -> bool {
        let claimed = self.call("/deliveries/claim", body).await;
        let claimed_at = Instant::now();
        let d = &claimed["delivery"];
        if d.is_null() {
            return false;
        }
        let text_of = |d: &Value| {
            d["trigger_context"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let work_ms = AGENT_WORK_MS.load(Ordering::Relaxed);
        if work_ms > 0 {
            tokio::time::sleep(Duration::from_millis(work_ms)).await;
        }
        let parts = d["turn"].as_array().cloned().unwrap_or_default();
        let mut texts = vec![text_of(d)];
        texts.extend(parts.iter().map(text_of));
        // An answer in the asked shape when the step gives one.
        let answer = if d["output"].is_null() {
            "ack"
        } else {
            r#"{"ok": true}"#
        };
        let reply = EventBuilder::new(Kind::from_u16(9), answer).tags([
            Tag::custom("h", [self.channel.as_str()]),
            Tag::custom(
                "e",
                [d["message_event_id"].as_str().unwrap_or_default(), "", "root"],
            ),
        ]);
        // Signed as an agent signs (protocol::sign: no check of its own
        // signature after signing), so the generator's CPU is an agent's.
        let reply = protocol::sign::sign(reply, &self.keys);
        let turn: Vec<&Value> = parts.iter().map(|p| &p["id"]).collect();
        let fin = self
            .call(
                &format!("/deliveries/{}/finish", d["id"].as_str().unwrap_or_default()),
                json!({"claim_token": d["claim_token"], "outcome": "delivered", "reply": reply, "turn": turn}),
            )
            .await;
        if fin["status"] == "delivered" {
            TURNS_FINISHED.fetch_add(1, Ordering::Relaxed);
            for text in texts {
                let _ = self.done.send((claimed_at, text));
            }
        } else {
            self.refusals.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// PostgreSQL's durability settings of the bench's server: its defaults,
/// or with `--unsafe-pg` none of the waits for the disk.
fn pg_durability(unsafe_pg: bool) -> [&'static str; 3] {
    if unsafe_pg {
        ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
    } else {
        ["fsync=on", "synchronous_commit=on", "full_page_writes=on"]
    }
}

/// What a commit of ours survives, read back from the running database.
fn durability(relay: &Relay, args: &Args) -> String {
    match &relay.store.backend {
        Backend::Sqlite => format!(
            "SQLite WAL, synchronous={} ({})",
            args.sqlite_synchronous,
            if args.sqlite_synchronous == "full" {
                "an fsync per commit"
            } else {
                "commits survive a crash of the process, not always of the machine"
            }
        ),
        Backend::Postgres(server) => {
            let show = |name: &str| {
                server
                    .psql("postgres", &format!("SHOW {name}"))
                    .map_or_else(|e| format!("unknown ({e})"), |v| v.trim().to_string())
            };
            let unsafe_mark = if args.unsafe_pg {
                " UNSAFE: not for published figures"
            } else {
                ""
            };
            format!(
                "PostgreSQL fsync={} synchronous_commit={} full_page_writes={}{unsafe_mark}",
                show("fsync"),
                show("synchronous_commit"),
                show("full_page_writes")
            )
        }
    }
}

/// The port of a `ws://host:port` URL whose host is this machine.
fn port_of(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("ws://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
        .then(|| port.parse().ok())
        .flatten()
}

/// Connections the `TCP_NODELAY` check opens to each relay.
const NODELAY_PROBES: usize = 4;

/// One line on a target: its process, and whether the sockets it accepts
/// have `TCP_NODELAY` (without it, every multi-frame answer waits for the
/// client's delayed ACK, about 40 ms: a figure of Nagle's algorithm, not of
/// the relay; see `tests/bench/nodelay.c` to measure a peer at its best).
async fn describe(t: &Target) -> String {
    let Some(pid) = t.pid else {
        return format!(
            "{}: {} (not a process of this machine: no CPU, no TCP_NODELAY check)",
            t.name, t.url
        );
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut probes = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..NODELAY_PROBES {
        let ws = connect(&t.url).await;
        if let tokio_tungstenite::MaybeTlsStream::Plain(s) = ws.get_ref() {
            ports.extend(s.local_addr().ok().map(|a| a.port()));
        }
        probes.push(ws);
    }
    let nodelay = match port_of(&t.url).map(|server| host::nodelay_count(pid, server, &ports)) {
        Some(Ok((set, n))) if set == n => format!("TCP_NODELAY on all {n} probed sockets"),
        Some(Ok((set, n))) => format!(
            "TCP_NODELAY on {set} of {n} probed sockets: NAGLE ON, multi-frame answers wait for delayed ACKs"
        ),
        Some(Err(e)) => format!("TCP_NODELAY not read ({e})"),
        None => "TCP_NODELAY not read (no port)".to_string(),
    };
    let shim = if host::maps_contain(pid, "nodelay") {
        ", nodelay shim loaded"
    } else {
        ""
    };
    format!(
        "{}: {} pid {pid} ({}){shim}, {nodelay}",
        t.name,
        t.url,
        comm.trim()
    )
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
            // The test servers run with fsync=off (the disk is not what a
            // test checks); a published figure runs as users run:
            // PostgreSQL's defaults for durability, set again here because
            // the later `-c` wins.
            settings.extend(pg_durability(args.unsafe_pg).iter().map(|s| s.to_string()));
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
    let metrics = if args.metrics || args.pg_standby {
        "metrics_listen = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    let env = relay_env(&args);
    let store = tests::relay::Store::new(&backend);
    let (standby, reads) = standby_of(&args, &store);
    // A second address, for the fairness figure's second community.
    let relay = Relay::start_listening(
        store,
        RelayOptions {
            config_toml: format!("{metrics}{reads}{}", bench_toml(&args)),
            env,
        },
        "127.0.0.1:0,127.0.0.2:0",
    );
    println!(
        "bench backend={} quick={} rounds={rounds} date={}",
        args.backend,
        args.quick,
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
    println!("{}", host::machine_line(relay.store.dir.path()));
    println!("durability: ours {}", durability(&relay, &args));
    if standby.is_some() {
        println!("reads: ours from a hot standby on this machine (read_database_urls)");
    }
    let mut targets = vec![Target::ours(&relay)];
    targets[0].db_pids.extend(standby.as_ref().and_then(|s| s.pid()));
    for (i, p) in args.peer.iter().enumerate() {
        let (name, url) = match p.split_once('=') {
            Some((name, url)) => (name.to_string(), url.to_string()),
            None if args.peer.len() == 1 => ("peer".to_string(), p.clone()),
            None => (format!("peer{}", i + 1), p.clone()),
        };
        let pid = port_of(&url).and_then(host::listener_of);
        targets.push(Target {
            name,
            url,
            pid,
            db_pids: Vec::new(),
        });
    }
    for t in &targets {
        println!("{}", describe(t).await);
    }
    let only: Vec<&str> = args.only.split(',').collect();
    if only.contains(&"ingest") {
        ingest(&targets, rounds, args.quick, args.ingest_window).await;
    }
    if only.contains(&"fanout") {
        let subs = args.fanout_subs.unwrap_or(if args.quick { 200 } else { 1000 });
        fanout::fanout(&targets, rounds, subs, args.fanout_others).await;
    }
    if only.contains(&"delivery") {
        delivery(&relay, rounds, args.quick, args.delivery_rate, args.agent_work_ms).await;
    }
    if only.contains(&"mentions") {
        mentions(
            &relay,
            rounds,
            args.quick,
            args.delivery_rate,
            args.mention_debounce_secs,
        )
        .await;
    }
    if only.contains(&"pipeline") {
        // Each variant on a relay of its own (the agents of a figure stay
        // connected, and a relay that kept an earlier figure's 80 was
        // measured 3 ms of CPU a run slower): plain, with an output
        // schema, exporting every run's trace over OTLP to a collector in
        // this process, and plain again (the drift of the hour).
        let collector = tests::hooks::HookServer::start().await;
        collector.answer("/v1/traces", tests::hooks::Answer::json(200, json!({})));
        let otlp = format!("otlp_endpoint = \"{}\"\n", collector.url("/v1/traces"));
        for (variant, label, traced) in [
            (Variant::Plain, "plain", false),
            (Variant::Shaped, "answers checked against an output schema", false),
            (Variant::Plain, "traced", true),
            (Variant::Plain, "plain again", false),
        ] {
            let own = Relay::start_opts(
                &backend,
                RelayOptions {
                    config_toml: format!(
                        "{}{metrics}{}",
                        if traced { otlp.as_str() } else { "" },
                        bench_toml(&args)
                    ),
                    env: relay_env(&args),
                },
            );
            pipeline(&own, rounds, args.quick, variant, label).await;
        }
        println!(
            "pipeline (traced): the collector received {} OTLP exports",
            collector.received("/v1/traces").len()
        );
    }
    if only.contains(&"fairness") {
        fairness(&relay, args.quick).await;
    }
    if only.contains(&"query") {
        let load = (args.load_conns, args.load_depth);
        query::query(
            &targets,
            &relay,
            rounds,
            args.quick,
            load,
            args.latency_log.clone(),
        )
        .await;
    }
    if let Some(path) = &args.relay_log {
        if let Err(e) = std::fs::write(path, relay.log()) {
            eprintln!("writing the relay's log to {}: {e}", path.display());
        }
    }
    if standby.is_some() {
        let scrape = tests::metrics::scrape(&relay).await;
        let from = |f| tests::metrics::value(&scrape, "relay_reads_total", &[("from", f)]) as u64;
        println!(
            "reads: primary {}, standby {} (relay_reads_total)",
            from("primary"),
            from("standby")
        );
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
                config_toml: bench_toml(&args),
                ..Default::default()
            },
        );
        memory(&Target::ours(&fresh), args.quick).await;
    }
    let dropped = DROPPED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    if !dropped.is_empty() {
        println!("FAILED: peers dropped out of figures: {}", dropped.join("; "));
        std::process::exit(1);
    }
}

/// Peers that dropped out of a figure, and why: the run fails at its end
/// (their figures' lines name only the others).
static DROPPED_OUT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records that peer `name` dropped out of a figure (`why`), and says so.
fn dropped_out(name: &str, why: &str) {
    eprintln!("{name}: {why}; not measured");
    DROPPED_OUT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(format!("{name} ({why})"));
}
