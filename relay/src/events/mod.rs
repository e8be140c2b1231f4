//! Events: the NIP-01/09/40 rules applied inside the writing transaction
//! (`rules`), filters turned into SQL with the read rules and NIP-50 search
//! (`query`), the relay-signed notices (`notices`), and the types a stored
//! or read event crosses the store in. Knows nothing of workflows.
//!
//! May use: `persistence`, `refusal`, `admission`, `config`.

use nostr::prelude::{Event, PublicKey};

pub mod notices;
pub mod query;
pub mod rules;
pub mod windows;

/// What happened to an event offered for storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Newly committed.
    Stored,
    /// Already stored (same id in the same community); nothing changed.
    Duplicate,
    /// Refused by a storage rule; the text is the full machine-readable
    /// answer (`prefix: reason`).
    Rejected(String),
}

/// Who is reading, for read-side access rules.
#[derive(Debug, Clone)]
pub struct ReadScope {
    /// NIP-42 authenticated pubkey of the reader, if any.
    pub viewer: Option<PublicKey>,
    /// Kinds served only to a reader named in the event's `p` tags.
    pub gated_kinds: Vec<u16>,
    /// Unix seconds used for NIP-40 expiry.
    pub now: u64,
    /// The standby the read goes to (`persistence::standbys`); `None`: the
    /// primary (or SQLite). The caller decides which reads may go there.
    pub from: Option<crate::persistence::standbys::Replica>,
}

/// One event read back, newest-first order is the caller's to keep.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub created_at: i64,
    pub id: [u8; 32],
    /// The event's JSON exactly as stored.
    pub raw: String,
}

/// Which part of one filter's stored events a REQ reads next.
#[derive(Debug, Clone)]
pub struct Page {
    /// The filter's (clamped) `limit`: the statement's `LIMIT`, the same
    /// on every page, so that a filter's pages share two statements.
    pub limit: usize,
    /// Rows wanted now, at most (what is left of `limit`).
    pub rows: usize,
    /// Where the page starts: after an event in REQ order (`None` for the
    /// first page), or, for a search filter, after the rows read.
    pub position: query::Position,
    /// Bytes of event JSON the page may hold (at least one event is
    /// returned, whatever its size).
    pub max_bytes: usize,
}

/// A page read.
#[derive(Debug)]
pub struct PageRows {
    pub events: Vec<StoredEvent>,
    /// No event follows these (the page did not stop for its bounds).
    pub end: bool,
}

/// The `d` tag value that names an addressable event ("" when absent), or
/// "" for replaceable kinds, or `None` for kinds that are not replaced.
pub fn replacement_key(event: &Event) -> Option<String> {
    use protocol::kinds::{storage_of, Storage};
    match storage_of(event.kind.as_u16()) {
        Storage::Replaceable => Some(String::new()),
        Storage::Addressable => Some(event.tags.identifier().unwrap_or_default()),
        _ => None,
    }
}

/// NIP-40 expiration as unix seconds, if the event carries one.
pub fn expiration(event: &Event) -> Option<i64> {
    event
        .tags
        .expiration()
        .map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX))
}

/// Single-letter tags with a value: the (name, first value) pairs a filter
/// can match, each indexed once.
pub fn indexed_tags(event: &Event) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for tag in event.tags.iter() {
        let slice = tag.as_slice();
        if slice.len() < 2 || slice[0].chars().count() != 1 {
            continue;
        }
        let Some(c) = slice[0].chars().next() else {
            continue;
        };
        if !c.is_ascii_alphabetic() {
            continue;
        }
        let pair = (slice[0].clone(), slice[1].clone());
        if !out.contains(&pair) {
            out.push(pair);
        }
    }
    out
}

/// What a kind 5 asks to delete (NIP-09), restricted to the author's own events.
#[derive(Debug, Default)]
pub struct DeletionTargets {
    /// Event ids (`e` tags).
    pub ids: Vec<[u8; 32]>,
    /// Addresses (`a` tags) `kind:pubkey:d` whose pubkey is the author.
    pub addresses: Vec<(u16, String)>,
}

/// Parses the targets of a NIP-09 deletion request.
pub fn deletion_targets(event: &Event) -> DeletionTargets {
    let mut t = DeletionTargets::default();
    let author = event.pubkey.to_hex();
    for tag in event.tags.iter() {
        let s = tag.as_slice();
        if s.len() < 2 {
            continue;
        }
        match s[0].as_str() {
            "e" => {
                if let Ok(bytes) = hex::decode(&s[1]) {
                    if let Ok(id) = <[u8; 32]>::try_from(bytes.as_slice()) {
                        t.ids.push(id);
                    }
                }
            }
            "a" => {
                let mut parts = s[1].splitn(3, ':');
                let (Some(k), Some(pk), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
                    continue;
                };
                if pk != author {
                    continue;
                }
                if let Ok(kind) = k.parse::<u16>() {
                    t.addresses.push((kind, d.to_string()));
                }
            }
            _ => {}
        }
    }
    t
}

/// The text form of an address used in the deletions table.
pub fn address_key(kind: u16, d: &str) -> String {
    format!("a:{kind}:{d}")
}
