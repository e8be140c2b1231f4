//! The fan-out figure: `subs` connections subscribed to one author's new
//! events, and `others` more subscribed to other authors' (bystanders:
//! each published event goes to none of them), then events of that author
//! published one at a time; the clock runs from the publisher's send to
//! each subscriber's receipt. Every target's subscribers connect first;
//! then the rounds take the targets in alternating order (A B, B A).

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Timestamp};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::report::{percentile, report, turn_order, Better, Faults, Measured, Rounds};
use crate::{connect, dropped_out, next_json, rss_bytes, Meter, Target, Ws, ANSWER_TIMEOUT};

pub async fn fanout(targets: &[Target], rounds: usize, subs: usize, others: usize) {
    settle_disk();
    let mut ready = Vec::with_capacity(targets.len());
    for t in targets {
        if let Some(r) = subscribe_target(t, subs, others).await {
            ready.push(r);
        }
    }
    // Round by round, A B then B A: what one relay's turn leaves behind
    // falls on each in turn (`turn_order`).
    for round in 0..rounds {
        for i in turn_order(round, ready.len()) {
            fanout_round(&mut ready[i], subs, events_per_round(subs)).await;
        }
    }
    let mut figures = [Vec::new(), Vec::new()];
    for r in ready {
        figures[0].push((r.target.name.clone(), r.p50.measured()));
        figures[1].push((r.target.name.clone(), r.p99.measured()));
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

/// Events a round: at least 50, so that the relay's CPU, read in 10 ms
/// ticks, is measured over a tenth of a second or more; with few
/// subscribers up to 200, so that a round's p99 is more than its one
/// slowest publish (to 200 subscribers, 50 events make 10,000 frames, and
/// the slowest hundred are half of one event's; 200 events, two events').
fn events_per_round(subs: usize) -> usize {
    (40_000 / subs.max(1)).clamp(50, 200)
}

/// Writes back every dirty page on the machine (`sync(2)`) before the
/// first round: what a figure run before this one left to write (an
/// ingest's WAL, a peer's store) must not fall on whichever relay
/// measures first. (Its time is printed; after `--quick` ingests it has
/// found little: 0.0 s.)
fn settle_disk() {
    let started = Instant::now();
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    println!(
        "fanout: the disk's writeback done first (sync, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// One target's subscribers and publisher, and its figures so far.
struct Ready<'a> {
    target: &'a Target,
    author: Keys,
    rx: Receipts,
    publisher: Ws,
    p50: Rounds,
    p99: Rounds,
}

/// `subs` subscribers of a new author's events (and `others` bystanders)
/// on `t`, with its memory per subscribed connection printed; `None`
/// when a peer did not end every subscription's stored results with EOSE.
async fn subscribe_target(t: &Target, subs: usize, others: usize) -> Option<Ready<'_>> {
    let author = Keys::generate();
    let rss_before = t.pid.map(rss_bytes);
    let (rx, all_ready) = subscribe_all(t, &author, subs, others).await;
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
    Some(Ready {
        target: t,
        author,
        rx,
        publisher: connect(&t.url).await,
        p50: Rounds::default(),
        p99: Rounds::default(),
    })
}

/// One round on one target: events published one at a time, p50 and p99
/// from the publisher's send to receipt by every subscriber, with the
/// relay's CPU per frame delivered.
async fn fanout_round(r: &mut Ready<'_>, subs: usize, per_round: usize) {
    let mut lat = Vec::new();
    let mut faults = Faults::default();
    let meter = Meter::start(r.target);
    for j in 0..per_round {
        let ev = EventBuilder::new(Kind::TextNote, format!("fanout {j} {}", rand::random::<u64>()))
            .finalize(&r.author)
            .unwrap();
        let id = ev.id.to_hex();
        let frame = json!(["EVENT", ev]).to_string();
        // The clock starts as the event is sent, not at its OK: a relay
        // may fan out before it answers the publisher.
        let sent_at = Instant::now();
        r.publisher.send(Message::Text(frame.into())).await.unwrap();
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while got < subs {
            match tokio::time::timeout_at(deadline, r.rx.recv()).await {
                Ok(Some((eid, at))) if eid == id => {
                    got += 1;
                    lat.push(at.duration_since(sent_at).as_secs_f64() * 1000.0);
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        faults.missing += subs - got;
        faults.add(publisher_answer(&mut r.publisher, &id).await);
    }
    let s = meter.sample(r.target, lat.len(), faults);
    lat.sort_by(f64::total_cmp);
    r.p50
        .push(percentile(&lat, 0.5), s.cpu_us, s.generator_cores, s.faults);
    r.p99
        .push(percentile(&lat, 0.99), s.cpu_us, s.generator_cores, s.faults);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_has_enough_events_for_its_p99() {
        let rows = [
            (0, 200),
            (1, 200),
            (200, 200),
            (400, 100),
            (1_000, 50),
            (10_000, 50),
        ];
        for (subs, events) in rows {
            assert_eq!(events_per_round(subs), events, "{subs} subscribers");
        }
    }
}
