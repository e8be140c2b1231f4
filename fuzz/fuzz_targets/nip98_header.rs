#![no_main]
//! Authorization headers: verification never panics and never accepts a
//! header that was not made for the request.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (header, body) = text.split_once('\n').unwrap_or((text, ""));
    let req = protocol::nip98::Request {
        method: "POST",
        url: "https://relay.example.com/deliveries/claim",
        body: body.as_bytes(),
        now: 1_800_000_000,
    };
    let _ = protocol::nip98::verify(Some(header), &req);
    let _ = protocol::nip98::verify(Some(&format!("Nostr {header}")), &req);
    let _ = protocol::nip98::same_url(header, body);
});
