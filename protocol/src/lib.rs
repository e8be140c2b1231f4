//! Wire types and pure logic shared by the relay and the agent.
//!
//! Nothing in this crate performs I/O: it parses, validates, renders and
//! signs. Keeping it pure is what lets the relay and the agent share one
//! definition of every rule (and lets fuzzers drive it directly).

pub mod api;
pub mod approval;
pub mod condition;
pub mod dashboard;
pub mod host;
pub mod kinds;
pub mod message;
pub mod nip29;
pub mod nip42;
pub mod nip86;
pub mod nip98;
pub mod nip_oa;
pub mod schedule;
pub mod search;
pub mod sign;
pub mod template;
pub mod trace;
pub mod webhook;
pub mod workflow;

pub use nostr;
