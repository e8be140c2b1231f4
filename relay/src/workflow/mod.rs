//! Workflows: definitions and their triggers (`definitions`), the run
//! interpreter, one transaction per step (`runs`), approvals decided by
//! reactions (`approvals`), webhook calls recorded before they are sent
//! (`outcalls`). Each rule decides inside the writing transaction.
//!
//! May use: `events`, `persistence`, `refusal`, `admission`, `config`.

pub mod approvals;
pub mod definitions;
pub mod outcalls;
pub mod runs;
