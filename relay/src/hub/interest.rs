//! What a connection's live filters can match, as keys the hub indexes:
//! an event is handed only to the connections holding one of its keys.
//!
//! A filter is indexed under one field, the narrowest it names (`ids`,
//! then `authors`, then its `#x` tag with the fewest values, then
//! `kinds`; else [`Key::Any`]), by every value of that field. So a filter
//! that matches an event always shares a key with it: the keys choose
//! whom to wake, and the connection still matches the event exactly
//! (`ws/read.rs`). Tag values are keyed by a hash: two values of one hash
//! wake a connection for nothing, never miss one.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use nostr::prelude::{Event, Filter};

/// One indexed value of a filter, or of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// A filter naming no indexed field: every event.
    Any,
    Id([u8; 32]),
    Author([u8; 32]),
    Kind(u16),
    /// A single-letter tag and the hash of its first value.
    Tag(char, u64),
}

/// Hashes tag values for [`Key::Tag`], seeded per process.
#[derive(Debug, Clone, Default)]
pub struct TagHasher(std::collections::hash_map::RandomState);

impl TagHasher {
    fn key(&self, letter: char, value: &str) -> Key {
        Key::Tag(letter, self.0.hash_one(value))
    }

    /// The keys `filter` is indexed under: the values of its narrowest
    /// field (an empty list is no constraint, as in NIP-01 matching).
    pub fn keys_of(&self, filter: &Filter) -> Vec<Key> {
        if let Some(ids) = filter.ids.as_ref().filter(|s| !s.is_empty()) {
            return ids.iter().map(|id| Key::Id(id.to_bytes())).collect();
        }
        if let Some(authors) = filter.authors.as_ref().filter(|s| !s.is_empty()) {
            return authors.iter().map(|pk| Key::Author(pk.to_bytes())).collect();
        }
        let narrowest = filter
            .generic_tags
            .iter()
            .filter(|(_, values)| !values.is_empty())
            .min_by_key(|(_, values)| values.len());
        if let Some((letter, values)) = narrowest {
            let letter = letter.as_char();
            return values.iter().map(|v| self.key(letter, v)).collect();
        }
        if let Some(kinds) = filter.kinds.as_ref().filter(|s| !s.is_empty()) {
            return kinds.iter().map(|k| Key::Kind(k.as_u16())).collect();
        }
        vec![Key::Any]
    }

    /// The keys of `event`: its id, author, kind, each single-letter tag's
    /// first value, and [`Key::Any`].
    pub fn event_keys(&self, event: &Event) -> Vec<Key> {
        let tags = event
            .tags
            .iter()
            .filter_map(|t| Some(self.key(t.single_letter_tag()?.as_char(), t.content()?)));
        [
            Key::Any,
            Key::Id(event.id.to_bytes()),
            Key::Author(event.pubkey.to_bytes()),
            Key::Kind(event.kind.as_u16()),
        ]
        .into_iter()
        .chain(tags)
        .collect()
    }
}

/// Which listeners hold each key.
#[derive(Debug, Default)]
pub struct Index {
    by_key: HashMap<Key, HashSet<u64>>,
}

impl Index {
    pub fn add(&mut self, listener: u64, keys: &[Key]) {
        for k in keys {
            self.by_key.entry(*k).or_default().insert(listener);
        }
    }

    pub fn remove(&mut self, listener: u64, keys: &[Key]) {
        for k in keys {
            if let Some(set) = self.by_key.get_mut(k) {
                set.remove(&listener);
                if set.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
    }

    /// The listeners holding any of `keys`, each once, in id order.
    pub fn holders(&self, keys: &[Key]) -> Vec<u64> {
        let mut found: Vec<u64> = keys
            .iter()
            .filter_map(|k| self.by_key.get(k))
            .flatten()
            .copied()
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    /// Whether no key is held (a check in tests).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, Keys, Kind, Tag};

    fn filter(json: &str) -> Filter {
        Filter::from_json(json).expect("filter")
    }

    /// Every filter that matches an event shares a key with it, whichever
    /// field it is indexed under; the index hands the event to its holders.
    #[test]
    fn a_matching_filter_always_shares_a_key_with_the_event() {
        let hasher = TagHasher::default();
        let author = Keys::generate();
        let other = Keys::generate().public_key().to_hex();
        let tags = [
            Tag::parse(["h", "room"]).unwrap(),
            Tag::parse(["p", &other]).unwrap(),
        ];
        let ev = protocol::sign::sign(EventBuilder::new(Kind::Custom(9), "hi").tags(tags), &author);
        let me = author.public_key().to_hex();
        let id = ev.id.to_hex();
        let matching = [
            format!(r#"{{"ids":["{id}"],"authors":["{me}"]}}"#),
            format!(r#"{{"authors":["{other}","{me}"],"kinds":[1,9]}}"#),
            format!(r##"{{"#h":["room","hall"],"#p":["a","b","{other}"],"kinds":[9]}}"##),
            format!(r##"{{"#p":["{other}"],"#h":["room","b"]}}"##),
            r#"{"kinds":[1,9]}"#.to_string(),
            r#"{"since":1}"#.to_string(),
            r#"{"authors":[],"kinds":[9]}"#.to_string(),
        ];
        let ev_keys = hasher.event_keys(&ev);
        for (n, f) in matching.iter().enumerate() {
            let f = filter(f);
            assert!(f.match_event(&ev, Default::default()), "filter {n} matches");
            let keys = hasher.keys_of(&f);
            assert!(
                keys.iter().any(|k| ev_keys.contains(k)),
                "filter {n} shares no key"
            );
            let mut index = Index::default();
            index.add(n as u64, &keys);
            assert_eq!(index.holders(&ev_keys), vec![n as u64]);
            index.remove(n as u64, &keys);
            assert!(index.is_empty(), "removing a listener leaves no key");
        }
        // A filter for another room, author or kind holds no key of it.
        for f in [
            r##"{"#h":["hall"],"kinds":[9]}"##.to_string(),
            format!(r#"{{"authors":["{other}"]}}"#),
            r#"{"kinds":[1]}"#.to_string(),
        ] {
            let f = filter(&f);
            assert!(!f.match_event(&ev, Default::default()));
            let keys = hasher.keys_of(&f);
            assert!(!keys.iter().any(|k| ev_keys.contains(k)), "{f:?} shares a key");
        }
    }

    #[test]
    fn holders_are_listed_once_whatever_keys_they_share() {
        let mut index = Index::default();
        index.add(2, &[Key::Any, Key::Kind(1)]);
        index.add(1, &[Key::Kind(1)]);
        index.add(3, &[Key::Kind(7)]);
        assert_eq!(index.holders(&[Key::Any, Key::Kind(1)]), vec![1, 2]);
        index.remove(2, &[Key::Any, Key::Kind(1)]);
        assert_eq!(index.holders(&[Key::Any, Key::Kind(1)]), vec![1]);
    }
}
