#![no_main]
//! Any frame a client can send: parsing never panics, and every error names
//! an answer (NOTICE, OK or CLOSED).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = protocol::message::parse(text);
    }
});
