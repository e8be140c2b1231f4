//! The relay: a multi-community Nostr relay with durable agent delivery.
//!
//! See `docs/ARCHITECTURE.md` for the map of modules and their invariants.

pub mod admin;
pub mod admission;
pub mod api;
pub mod budget;
pub mod channels;
pub mod clock;
pub mod community;
pub mod engine;
pub mod events;

pub mod config;
pub mod dedicated;
pub mod delivery;
pub mod faults;

pub mod http;
pub mod hub;
pub mod keys;
pub mod listen;
pub mod livesearch;
pub mod manage;
pub mod moderation;
pub mod neg;
pub mod outbound;
pub mod outcall;
pub mod persistence;
pub mod ratelimit;
pub mod refusal;
pub mod req;
pub mod routes;
pub mod secrets;
pub mod server;
pub mod shares;
pub mod spans;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod ui;
pub mod verify;
pub mod workflow;
pub mod ws;
