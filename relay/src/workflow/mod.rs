//! Workflows: definitions and their triggers (`definitions`), the run
//! interpreter, one transaction per step (`runs`, over what every step
//! shares in `step`), a step's message and delivery rows (`message`), one
//! file for each step kind that waits or calls out (`ask_agent`,
//! `request_approval`, `call_webhook`), runs as listed and shown (`views`),
//! approvals decided by reactions (`approvals`), webhook calls recorded
//! before they are sent (`outcalls`). Each rule decides inside the writing
//! transaction.
//!
//! May use: `delivery`, `events`, `persistence`, `refusal`, `admission`,
//! `config`.

pub mod approvals;
pub mod ask_agent;
pub mod call_webhook;
pub mod definitions;
pub mod message;
pub mod outcalls;
pub mod request_approval;
pub mod runs;
pub mod step;
pub mod triggers;
pub mod views;
