//! NIP-42 client authentication: the kind 22242 event a client signs to
//! answer a relay's `AUTH` challenge.

use nostr::prelude::{Event, EventBuilder, Keys, Kind, Tag};

/// The `AUTH` answer for `challenge` from the relay at `relay_url` (the
/// WebSocket URL the client connected to), signed by `keys`.
pub fn auth_event(keys: &Keys, relay_url: &str, challenge: &str) -> Event {
    let builder = EventBuilder::new(Kind::Authentication, "").tags([
        Tag::custom("relay", [relay_url]),
        Tag::custom("challenge", [challenge]),
    ]);
    crate::sign::sign(builder, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_relay_and_the_challenge() {
        let keys = Keys::generate();
        let ev = auth_event(&keys, "ws://127.0.0.1:7777", "c1");
        assert_eq!(ev.kind, Kind::Authentication);
        assert_eq!(ev.pubkey, keys.public_key());
        let tags: Vec<Vec<String>> = ev.tags.iter().map(|t| t.as_slice().to_vec()).collect();
        assert_eq!(
            tags,
            [vec!["relay", "ws://127.0.0.1:7777"], vec!["challenge", "c1"]]
        );
        ev.verify().unwrap();
    }
}
