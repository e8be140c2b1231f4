//! Channels (NIP-29) and who is in them: membership, roles, invites and
//! the relay-signed metadata (`rules`), and managed agents registered by
//! their owner's attestation (`agents`, NIP-OA).
//!
//! May use: `workflow` (a channel message starts runs; a removed owner's
//! workflows pause), `events`, `persistence`, `refusal`, `config`.

pub mod agents;
pub mod rules;
