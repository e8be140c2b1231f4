//! Memory and connections under attack: the harness behind the figures of
//! docs/reliability.md ("Hostile clients"). Each scenario plays clients
//! that never read (or never finish a request) against a relay and prints
//! the relay process's anonymous resident memory (`RssAnon` from /proc:
//! its heap) before and during the attack, or how many of its stalled
//! connections it has closed.
//!
//! cargo run --release -p tests --bin hostile -- --backend sqlite
//! cargo run --release -p tests --bin hostile -- --url ws://127.0.0.1:7777 --pid <relay pid>
//!
//! Each scenario runs against a fresh relay process. With `--url` and
//! `--pid` it attacks a relay started elsewhere instead (another build, to
//! compare in one run: run one scenario per fresh process there too);
//! that relay's event rate limits must let the preload through.

use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::SinkExt;
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Timestamp};
use serde_json::json;
use tests::{Backend, Relay, RelayOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug)]
#[command(about = "Hostile-client harness: memory and connections under attack")]
struct Args {
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// Attack this relay instead of starting one.
    #[arg(long, requires = "pid")]
    url: Option<String>,
    /// The process id of the relay at `--url` (for its RSS).
    #[arg(long)]
    pid: Option<u32>,
    /// Scenarios (comma separated): req, live, slowloris.
    #[arg(long, default_value = "req,live,slowloris")]
    only: String,
    /// `req` against `--url`: the store already holds the 1,000 events (a
    /// relay restarted after a first run), so none are published.
    #[arg(long)]
    preloaded: bool,
}

/// The relay this harness starts: the rate limits let the preload in;
/// every other limit is the default, so the figures are those a default
/// deployment gets.
const HARNESS_TOML: &str = "[limits]\nevents_per_second = 1000000\nevents_burst = 1000000\n";

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The process's anonymous resident memory (`RssAnon`): its heap. Not the
/// whole RSS, which also counts the pages of the SQLite file it reads
/// through its memory map (the kernel's page cache, shared and reclaimable).
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn addr_of(url: &str) -> String {
    url.trim_start_matches("ws://").trim_end_matches('/').to_string()
}

/// A WebSocket whose socket receives into 4 KiB and is never read: a
/// client that stopped reading.
async fn stalled(url: &str) -> Ws {
    let addr = tokio::net::lookup_host(addr_of(url))
        .await
        .unwrap()
        .next()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(url, tokio_tungstenite::MaybeTlsStream::Plain(stream))
        .await
        .expect("handshake");
    ws
}

async fn reading(url: &str) -> Ws {
    tokio_tungstenite::connect_async(url).await.expect("connect").0
}

/// Publishes `n` events of `bytes` of content and waits for every OK.
async fn publish(url: &str, n: usize, bytes: usize, kind: u16) {
    use futures_util::StreamExt;
    let mut ws = reading(url).await;
    let k = Keys::generate();
    let body = "x".repeat(bytes);
    let now = tests::now();
    for i in 0..n {
        let e = EventBuilder::new(Kind::from_u16(kind), format!("{i} {body}"))
            .custom_created_at(Timestamp::from_secs(now - i as u64))
            .finalize(&k)
            .unwrap();
        ws.send(Message::Text(json!(["EVENT", e]).to_string().into()))
            .await
            .unwrap();
    }
    let mut oks = 0;
    while oks < n {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if t.as_str().starts_with("[\"OK\"") => {
                assert!(
                    t.as_str().contains(",true,"),
                    "refused: {}",
                    &t.as_str()[..200.min(t.len())]
                );
                oks += 1;
            }
            Some(Ok(_)) => {}
            other => panic!("publisher connection ended: {other:?}"),
        }
    }
}

/// Ten clients ask for 1,000 stored events of 120 KB and never read. A
/// relay started here is restarted after the preload, so that the memory
/// the preload left in the process is not counted (or reused) as the
/// attack's.
async fn paused_req(url: &str, mut pid: u32, own: Option<&mut Relay>, preloaded: bool) {
    if !preloaded {
        publish(url, 1000, 120 * 1024, 1).await;
    }
    if let Some(relay) = own {
        relay.restart();
        pid = relay.pid().expect("pid");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_mib(pid);
    let mut held = Vec::new();
    for i in 0..10 {
        let mut ws = stalled(url).await;
        ws.send(Message::Text(
            json!(["REQ", format!("r{i}"), {"kinds": [1], "limit": 1000}])
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
        held.push(ws);
    }
    // Well within the stored-results deadline (10 s): the subscribers are
    // still connected, holding what they hold.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = rss_mib(pid);
    drop(held);
    // What a reader that reads gets (so the figure above is of REQs that
    // really stream results).
    let got = read_req(url).await;
    println!(
        "hostile req: 10 paused REQs of 1,000 x 120 KB stored events: heap {before:.1} -> {during:.1} MiB \
         (+{:.1} MiB, {:.1} MiB per subscriber); a reading client's same REQ got {got} events",
        during - before,
        (during - before) / 10.0
    );
}

/// The number of stored events a reading client gets for the paused REQ.
async fn read_req(url: &str) -> usize {
    use futures_util::StreamExt;
    let mut ws = reading(url).await;
    ws.send(Message::Text(
        json!(["REQ", "read", {"kinds": [1], "limit": 1000}])
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut n = 0;
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Text(t) = m {
            if t.as_str().starts_with("[\"EVENT\"") {
                n += 1;
            } else if t.as_str().starts_with("[\"EOSE\"") || t.as_str().starts_with("[\"CLOSED\"") {
                break;
            }
        }
    }
    n
}

/// A hundred anonymous subscribers that never read; 8 MB published.
async fn paused_live(url: &str, pid: u32) {
    let mut held = Vec::new();
    for i in 0..100 {
        let mut ws = stalled(url).await;
        ws.send(Message::Text(
            json!(["REQ", format!("l{i}"), {"kinds": [7], "limit": 0}])
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
        held.push(ws);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_mib(pid);
    publish(url, 80, 100 * 1024, 7).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = rss_mib(pid);
    println!(
        "hostile live: 100 paused subscribers, 80 x 100 KB published: heap {before:.1} -> {during:.1} MiB (+{:.1} MiB)",
        during - before
    );
    drop(held);
}

/// 500 half-sent HTTP requests and 100 silent TCP connections: how many
/// are still open after 40 s.
async fn slowloris(url: &str) {
    let addr = addr_of(url);
    let mut conns = Vec::new();
    for _ in 0..500 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .await
            .unwrap();
        conns.push(s);
    }
    for _ in 0..100 {
        conns.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(40)).await;
    let mut open = 0;
    for s in &mut conns {
        let mut buf = [0u8; 1024];
        let still = loop {
            match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
                Err(_) => break true,                  // nothing to read: open
                Ok(Ok(0)) | Ok(Err(_)) => break false, // closed by the relay
                Ok(Ok(_)) => continue,                 // an answer before the close
            }
        };
        open += usize::from(still);
    }
    println!(
        "hostile slowloris: {open} of 600 stalled connections (500 half-sent requests, 100 silent) still open after {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    println!(
        "hostile backend={} url={}",
        args.backend,
        args.url.as_deref().unwrap_or("(own)")
    );
    for scenario in args.only.split(',') {
        // Each scenario against a fresh relay process (started here unless
        // `--url` names one): memory an earlier one left would blur its RSS.
        let mut own = None;
        let (url, pid) = match (&args.url, args.pid) {
            (Some(u), Some(p)) => (u.clone(), p),
            _ => {
                let backend = match args.backend.as_str() {
                    "postgres" => Backend::postgres(),
                    _ => Backend::Sqlite,
                };
                let relay = Relay::start_opts(
                    &backend,
                    RelayOptions {
                        config_toml: HARNESS_TOML.into(),
                        ..Default::default()
                    },
                );
                let started = (relay.ws_url(), relay.pid().expect("pid"));
                own = Some(relay);
                started
            }
        };
        match scenario {
            "req" => paused_req(&url, pid, own.as_mut(), args.preloaded).await,
            "live" => paused_live(&url, pid).await,
            "slowloris" => slowloris(&url).await,
            other => eprintln!("unknown scenario {other:?}"),
        }
    }
}
