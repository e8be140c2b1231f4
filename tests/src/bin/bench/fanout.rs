//! The fan-out figure: `subs` connections subscribed to one author's new
//! events, and `others` more subscribed to other authors' (bystanders:
//! each published event goes to none of them), then events of that author
//! published one at a time; the clock runs from the publisher's send to
//! each subscriber's receipt.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Timestamp};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::report::{percentile, report, Better, Faults, Measured, Rounds};
use crate::{connect, dropped_out, next_json, rss_bytes, Meter, Target, Ws, ANSWER_TIMEOUT};

pub async fn fanout(targets: &[Target], rounds: usize, subs: usize, others: usize) {
    let mut figures = [Vec::new(), Vec::new()];
    for t in targets {
        let Some([p50, p99]) = fanout_target(t, rounds, subs, others).await else {
            continue;
        };
        figures[0].push((t.name.clone(), p50));
        figures[1].push((t.name.clone(), p99));
    }
    for (figure, which) in figures.iter().zip(["p50", "p99"]) {
        // Ours is always first: its fan-out asserts rather than returning None.
        let (names, m): (Vec<String>, Vec<Measured>) = figure.iter().cloned().unzip();
        let label = match others {
            0 => format!("fanout {which} to {subs} subscribers, from send"),
            n => format!("fanout {which} to {subs} subscribers ({n} others), from send"),
        };
        report(&label, "ms", Better::Lower, "frame", &names, &m);
    }
}

/// p50 and p99 from the publisher's send to receipt by every subscriber,
/// with the relay's CPU per frame delivered; `None` when a peer did not
/// end every subscription's stored results with EOSE.
async fn fanout_target(t: &Target, rounds: usize, subs: usize, others: usize) -> Option<[Measured; 2]> {
    // Events a round: enough frames that the relay's CPU, read in 10 ms
    // ticks, is measured over a tenth of a second or more.
    let per_round = 50;
    let author = Keys::generate();
    let rss_before = t.pid.map(rss_bytes);
    let (mut rx, all_ready) = subscribe_all(t, &author, subs, others).await;
    if !all_ready {
        assert!(
            t.name != "ours",
            "our relay did not answer every subscription with EOSE"
        );
        dropped_out(&t.name, "fan-out: not every subscription got EOSE within 30 s");
        return None;
    }
    if let (Some(before), Some(pid)) = (rss_before, t.pid) {
        let after = rss_bytes(pid);
        let conns = subs + others;
        println!(
            "fanout memory, {}: {:.0} bytes per subscribed connection ({conns} connections, RSS {:.1} MiB -> {:.1} MiB; RSS growth, so only a fresh relay's figure counts: `--only fanout`)",
            t.name,
            after.saturating_sub(before) as f64 / conns as f64,
            before as f64 / 1048576.0,
            after as f64 / 1048576.0
        );
    }
    let (mut p50, mut p99) = (Rounds::default(), Rounds::default());
    let mut publisher = connect(&t.url).await;
    for _ in 0..rounds {
        let mut lat = Vec::new();
        let mut faults = Faults::default();
        let meter = Meter::start(t);
        for j in 0..per_round {
            let ev = EventBuilder::new(Kind::TextNote, format!("fanout {j} {}", rand::random::<u64>()))
                .finalize(&author)
                .unwrap();
            let id = ev.id.to_hex();
            let frame = json!(["EVENT", ev]).to_string();
            // The clock starts as the event is sent, not at its OK: a
            // relay may fan out before it answers the publisher.
            let sent_at = Instant::now();
            publisher.send(Message::Text(frame.into())).await.unwrap();
            let mut got = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while got < subs {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some((eid, at))) if eid == id => {
                        got += 1;
                        lat.push(at.duration_since(sent_at).as_secs_f64() * 1000.0);
                    }
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            faults.missing += subs - got;
            faults.add(publisher_answer(&mut publisher, &id).await);
        }
        let s = meter.sample(t, lat.len(), faults);
        lat.sort_by(f64::total_cmp);
        p50.push(percentile(&lat, 0.5), s.cpu_us, s.generator_cores, s.faults);
        p99.push(percentile(&lat, 0.99), s.cpu_us, s.generator_cores, s.faults);
    }
    Some([p50.measured(), p99.measured()])
}

/// Waits for the publisher's `OK` of event `id`: refused or unanswered is a fault.
async fn publisher_answer(publisher: &mut Ws, id: &str) -> Faults {
    let mut faults = Faults::default();
    loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, next_json(publisher)).await {
            Ok(Some(v)) if v[0] == "OK" && v[1] == id => {
                faults.refused += usize::from(v[2] != true);
                return faults;
            }
            Ok(Some(_)) => {}
            _ => {
                faults.timed_out += 1;
                return faults;
            }
        }
    }
}

/// Receipts of the fan-out figure: each event's id and when it arrived.
type Receipts = tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>;

/// `subs` connections subscribed to new events of `author`, and `others`
/// to new events of an author each that never publishes; whether every
/// subscription got its EOSE within 30 s.
async fn subscribe_all(t: &Target, author: &Keys, subs: usize, others: usize) -> (Receipts, bool) {
    // Only new events: `since` now rather than `limit: 0`, which
    // nostr-rs-relay never answers with EOSE.
    let since = Timestamp::now().as_secs();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let mut ready = Vec::new();
    for i in 0..subs + others {
        let of = if i < subs {
            author.public_key()
        } else {
            Keys::generate().public_key()
        };
        let filter = json!({"authors": [of.to_hex()], "since": since});
        let (url, tx) = (t.url.clone(), tx.clone());
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
            // bench's clients share the cores with the relay.
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
    // Bounded: a relay that never ends a subscription's stored results is
    // reported, not waited for forever.
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    for r in ready {
        if !matches!(tokio::time::timeout_at(deadline, r).await, Ok(Ok(()))) {
            return (rx, false);
        }
    }
    (rx, true)
}

/// The `"id"` of the event in an `["EVENT", sub, event]` frame, found by
/// its key (an event's JSON has one `"id"` key; tag values are arrays, so a
/// tag cannot hold `"id":"` as a key).
fn event_id_of(frame: &str) -> Option<&str> {
    let start = frame.find("\"id\":\"")? + 6;
    let len = frame[start..].find('"')?;
    Some(&frame[start..start + len])
}
