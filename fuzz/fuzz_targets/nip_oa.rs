#![no_main]
//! NIP-OA: conditions and attestation parts from arbitrary input never
//! panic; arbitrary bytes never verify.
use libfuzzer_sys::fuzz_target;
use nostr::prelude::Keys;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static AGENT: OnceLock<Keys> = OnceLock::new();
    let agent = AGENT.get_or_init(Keys::generate);
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = protocol::nip_oa::Conditions::parse(text) {
        let _ = c.allows(1, 1_700_000_000);
    }
    let mut parts = text.splitn(3, '|');
    let (owner, cond, sig) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    assert!(protocol::nip_oa::verify(&agent.public_key(), owner, cond, sig).is_err());
});
