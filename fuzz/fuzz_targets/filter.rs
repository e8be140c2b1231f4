#![no_main]
//! Arbitrary filters against a fixed set of events: decoding and in-memory
//! matching never panic.
use libfuzzer_sys::fuzz_target;
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Filter, Keys, Kind, MatchEventOptions, Tag};
use std::sync::OnceLock;

fn events() -> &'static Vec<Event> {
    static E: OnceLock<Vec<Event>> = OnceLock::new();
    E.get_or_init(|| {
        let k = Keys::generate();
        (0..8u16)
            .map(|i| {
                EventBuilder::new(Kind::from_u16(i), format!("e{i}"))
                    .tags([Tag::custom("t", [format!("v{i}")]), Tag::custom("p", [k.public_key().to_hex()])])
                    .finalize(&k)
                    .unwrap()
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(f) = serde_json::from_str::<Filter>(text) else { return };
    for e in events() {
        let _ = f.match_event(e, MatchEventOptions::new());
    }
    // And as the relay would receive it inside a REQ.
    let _ = protocol::message::parse(&format!("[\"REQ\",\"s\",{text}]"));
});
