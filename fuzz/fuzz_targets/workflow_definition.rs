#![no_main]
//! Definition content: parsing and validation never panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(def) = protocol::workflow::parse(text) {
        let _ = protocol::workflow::check(&def);
    }
});
