//! The relay's client side, one copy for the agent and `relayctl`: NIP-98
//! signed HTTP calls whose answers are read into `protocol`'s types and
//! whose refusals keep the relay's status and code (`http`), management
//! calls (NIP-86, same module), WebSocket sessions authenticated with
//! NIP-42 (`ws`: the handshake, then an event's `OK`), and secret key
//! files (`keyfile`: read from a variable or a file, written 0600 and
//! never over another).

pub mod http;
pub mod keyfile;
pub mod ws;
