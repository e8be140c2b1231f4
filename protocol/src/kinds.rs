//! Event kinds the relay gives meaning to, and the NIP-01 kind ranges.

/// NIP-09 deletion request.
pub const DELETION: u16 = 5;
/// NIP-42 client authentication.
pub const CLIENT_AUTH: u16 = 22242;
/// Wake hint for a managed agent (docs/protocol.md, "Wake hints"). p-gated by default.
pub const WAKE_HINT: u16 = 24620;
/// What became of a mention, for its sender (docs/protocol.md,
/// "Mentions"): relay-signed, ephemeral, p-gated by default.
pub const MENTION_STATUS: u16 = 24621;
/// NIP-04 encrypted direct message (deprecated by NIP-17, still sent).
/// p-gated by default: only its sender and recipient read it.
pub const ENCRYPTED_DM: u16 = 4;
/// NIP-59 gift wrap (NIP-17 private messages). p-gated by default: who
/// receives private messages, and when, is itself private.
pub const GIFT_WRAP: u16 = 1059;

/// NIP-32 label: the relay's management notices (namespace `nip86`).
pub const LABEL: u16 = 1985;

/// How NIP-01 says a kind is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Stored as is; every event is kept.
    Regular,
    /// Only the newest event per (pubkey, kind) is kept.
    Replaceable,
    /// Fanned out to live subscribers, never stored.
    Ephemeral,
    /// Only the newest event per (pubkey, kind, `d` tag) is kept.
    Addressable,
}

/// Classifies a kind by the NIP-01 ranges.
pub fn storage_of(kind: u16) -> Storage {
    match kind {
        0 | 3 | 10_000..=19_999 => Storage::Replaceable,
        20_000..=29_999 => Storage::Ephemeral,
        30_000..=39_999 => Storage::Addressable,
        _ => Storage::Regular,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(storage_of(1), Storage::Regular);
        assert_eq!(storage_of(0), Storage::Replaceable);
        assert_eq!(storage_of(3), Storage::Replaceable);
        assert_eq!(storage_of(10_002), Storage::Replaceable);
        assert_eq!(storage_of(19_999), Storage::Replaceable);
        assert_eq!(storage_of(20_000), Storage::Ephemeral);
        assert_eq!(storage_of(WAKE_HINT), Storage::Ephemeral);
        assert_eq!(storage_of(MENTION_STATUS), Storage::Ephemeral);
        assert_eq!(storage_of(30_023), Storage::Addressable);
        assert_eq!(storage_of(39_999), Storage::Addressable);
        assert_eq!(storage_of(40_000), Storage::Regular);
        assert_eq!(storage_of(DELETION), Storage::Regular);
    }
}
