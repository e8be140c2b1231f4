//! The managed-agent runtime: claims workflow deliveries from the relay,
//! verifies each one completely (docs/agent.md, "`agent run`"), runs a handler, and
//! finishes with its reply. See `docs/agent.md`.

pub mod api;
pub mod config;
pub mod faults;
pub mod handler;
pub mod relay;
pub mod runtime;
pub mod telemetry;
pub mod verify;
