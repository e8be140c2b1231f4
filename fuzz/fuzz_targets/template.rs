#![no_main]
//! Templates: parse, check, render against a context, find mentions. Never
//! panics; rendering is deterministic.
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(t) = protocol::template::Template::parse(text) else { return };
    let _ = t.check(&["a", "b"]);
    let ctx = json!({"trigger": {"text": text, "author": "x", "body": {"a": {"b": [1, 2]}, "n": null}},
                     "steps": {"a": {"output": {"event_id": "e"}}}});
    let once = t.render(&ctx);
    assert_eq!(once, t.render(&ctx));
    let _ = protocol::template::mentions(&t);
});
