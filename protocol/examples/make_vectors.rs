//! Writes `tests/vectors/rust_made.json`: NIP-OA attestations and NIP-98
//! auth events signed by this crate with fixed keys (and, for NIP-OA, fixed
//! auxiliary randomness, so the signatures are reproducible). The script
//! `tests/vectors/cross_check.mjs` has them checked by nostr-tools
//! (@noble/curves) and adds vectors made there; `tests/vectors.rs` then
//! holds both sides to the result.
//!
//! cargo run -p protocol --example make_vectors

use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, SecretKey, Tag, Timestamp};
use serde_json::json;

fn keys(byte: u8) -> Keys {
    Keys::new(SecretKey::from_slice(&[byte; 32]).expect("valid secret key"))
}

fn main() {
    let owner = keys(1);
    let agent = keys(2);
    let mut oa = Vec::new();
    for cond in [
        "",
        "kind=9",
        "kind=0&kind=9&created_at>1700000000&created_at<2000000000",
    ] {
        let tag =
            protocol::nip_oa::sign_with_aux(&owner, &agent.public_key(), cond, &[7u8; 32]).expect("sign");
        let s = tag.as_slice();
        oa.push(json!({
            "agent": agent.public_key().to_hex(),
            "owner": s[1],
            "conditions": s[2],
            "sig": s[3],
            "message": format!("nostr:agent-auth:{}:{}", agent.public_key().to_hex(), cond),
        }));
    }
    let mut nip98 = Vec::new();
    for (method, url, body) in [
        (
            "POST",
            "https://relay.example.com/deliveries/claim",
            r#"{"lease_seconds":30}"#,
        ),
        ("GET", "https://relay.example.com/deliveries?status=pending", ""),
    ] {
        let mut tags = vec![Tag::custom("u", [url]), Tag::custom("method", [method])];
        if !body.is_empty() {
            use sha2::Digest;
            tags.push(Tag::custom(
                "payload",
                [hex::encode(sha2::Sha256::digest(body.as_bytes()))],
            ));
        }
        let ev = EventBuilder::new(Kind::from_u16(protocol::nip98::KIND), "")
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(1_800_000_000))
            .finalize(&agent)
            .expect("sign");
        nip98.push(json!({"event": ev, "method": method, "url": url, "body": body}));
    }
    let out = json!({"nip_oa": oa, "nip98": nip98});
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/rust_made.json");
    std::fs::write(path, serde_json::to_string_pretty(&out).expect("json") + "\n").expect("write");
    println!("wrote {path}");
}
