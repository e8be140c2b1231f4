//! NIP-29 group kinds and the `h` tag, as this relay's channels use them
//! (shared by the relay's rules, its configuration and clients in tests).

use nostr::prelude::Event;

pub const PUT_USER: u16 = 9000;
pub const REMOVE_USER: u16 = 9001;
pub const EDIT_METADATA: u16 = 9002;
/// An admin removes an event from the channel (`e` tags).
pub const DELETE_EVENT: u16 = 9005;
pub const CREATE_GROUP: u16 = 9007;
pub const DELETE_GROUP: u16 = 9008;
/// An admin creates an invite code (`code` tag) for a closed channel.
pub const CREATE_INVITE: u16 = 9009;
pub const JOIN_REQUEST: u16 = 9021;
pub const LEAVE_REQUEST: u16 = 9022;
/// Relay-signed channel metadata (NIP-29 39000-39003).
pub const GROUP_METADATA: u16 = 39000;
pub const GROUP_ADMINS: u16 = 39001;
pub const GROUP_MEMBERS: u16 = 39002;
/// The roles a channel knows and what each may do.
pub const GROUP_ROLES: u16 = 39003;

/// Longest invite code accepted, in bytes.
pub const MAX_INVITE_CODE_BYTES: usize = 64;

/// How many of a channel's latest events a `previous` tag may name.
pub const PREVIOUS_WINDOW: usize = 50;

/// Longest channel id accepted.
pub const MAX_CHANNEL_ID_BYTES: usize = 128;

/// The channel an event belongs to: its `h` tag.
pub fn h_tag(event: &Event) -> Option<&str> {
    event
        .tags
        .iter()
        .find(|t| t.kind() == "h")
        .and_then(|t| t.content())
}

/// Whether `kind` changes a channel's membership or metadata (caches of
/// channel state must forget the channel when one is published).
pub fn changes_channel(kind: u16) -> bool {
    matches!(kind, PUT_USER..=LEAVE_REQUEST | GROUP_METADATA..=GROUP_ROLES)
}

/// The channel an event belongs to for read rules: its `h` tag, or the `d`
/// tag of channel metadata (39000-39003).
pub fn channel_of(event: &Event) -> Option<&str> {
    if (GROUP_METADATA..=GROUP_ROLES).contains(&event.kind.as_u16()) {
        return event
            .tags
            .iter()
            .find(|t| t.kind() == "d")
            .and_then(|t| t.content());
    }
    h_tag(event)
}
