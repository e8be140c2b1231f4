//! Workflows: definitions and their triggers (`definitions`), the run
//! interpreter, one transaction per step (`runs`, over what every step
//! shares in `step`), one file per step kind (its `start` and `resume`:
//! `send_message`, `ask_agent`, `delay`, `request_approval`,
//! `call_webhook`, declared from `protocol::step_kinds!`), a step's
//! message and delivery rows (`message`), runs as listed and shown
//! (`views`), approvals decided by reactions (`approvals`), webhook calls
//! recorded before they are sent (`outcalls`), reruns of ended runs from
//! the step they ended at (`rerun`), revisions of agents' answers that do
//! not fit an `ask_agent` step's output (`revision`). Each rule decides
//! inside the writing transaction.
//!
//! May use: `delivery`, `events`, `persistence`, `refusal`, `admission`,
//! `config`.

pub mod approvals;
pub mod definitions;
pub mod message;
pub mod outcalls;
pub mod rerun;
pub mod revision;
pub mod runs;
pub mod step;
pub mod triggers;
pub mod views;

/// One module per step kind, named as the kind.
macro_rules! kind_modules {
    ($($file:ident: $Kind:ident,)*) => {
        $(pub mod $file;)*
    };
}

protocol::step_kinds!(kind_modules);
