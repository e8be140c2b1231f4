//! Signing an event with a key held in this process.
//!
//! nostr's `finalize` checks every signature it has just made (a Schnorr
//! verification after the signing). For the relay's own output, a wake per
//! delivery, a message per step, notices, that check cost more CPU than
//! the signing itself: 3% of the relay's CPU in the delivery benchmark.
//! Agents sign with it too (their NIP-98 headers, their replies): a
//! managed agent signs three events a delivery, and the bench's simulated
//! agents share the machine with the relay they measure.
//! libsecp256k1 signs with the key it is given and the id computed here,
//! so the check can only fail on a bug of its own or a hardware fault;
//! debug builds (every test) still run it.

use nostr::prelude::{Event, EventBuilder, FinalizeUnsignedEvent, Keys};

/// `builder` as an event signed by `keys` (the id computed from it).
pub fn sign(builder: EventBuilder, keys: &Keys) -> Event {
    let unsigned = builder.finalize_unsigned(keys.public_key());
    let id = unsigned.id.unwrap_or_else(|| unsigned.compute_id());
    let sig = keys.sign_schnorr(id.as_bytes());
    let event = Event::new(
        id,
        unsigned.pubkey,
        unsigned.created_at,
        unsigned.kind,
        unsigned.tags,
        unsigned.content,
        sig,
    );
    debug_assert!(event.verify().is_ok(), "a signature made here verifies");
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Kind, Tag, Timestamp};

    #[test]
    fn signed_events_verify_and_keep_what_was_built() {
        let keys = Keys::generate();
        let builder = EventBuilder::new(Kind::from_u16(9), "hello")
            .tags([Tag::parse(["h", "general"]).unwrap()])
            .custom_created_at(Timestamp::from_secs(1_700_000_000));
        let ev = sign(builder, &keys);
        assert!(ev.verify().is_ok());
        assert_eq!(ev.pubkey, keys.public_key());
        assert_eq!(ev.kind, Kind::from_u16(9));
        assert_eq!(ev.content, "hello");
        assert_eq!(ev.created_at.as_secs(), 1_700_000_000);
        assert_eq!(ev.tags.len(), 1);
        // Another key's signature over the same id does not verify.
        let mut forged = ev.clone();
        forged.pubkey = Keys::generate().public_key();
        assert!(forged.verify().is_err());
    }
}
