//! Channels (NIP-29) and who is in them: the rules of each kind (`rules`:
//! membership, roles, invites, deletions, `previous`), a channel as stored
//! (`state`), the relay-signed metadata (`metadata`), and managed agents
//! registered by their owner's attestation (`agents`, NIP-OA), and where
//! their owners turned mentions on, with the delivery row a mention makes
//! (`mentions`).
//!
//! May use: `workflow` (a channel message starts runs; a removed owner's
//! workflows pause), `events`, `persistence`, `refusal`, `config`.
//! A mention's delivery row is written here (its columns are the
//! delivery table's; `delivery` decides everything after).

pub mod agents;
pub mod mentions;
pub mod metadata;
pub mod rules;
pub mod state;
