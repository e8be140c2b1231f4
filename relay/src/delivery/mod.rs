//! Deliveries to managed agents: the state machine, one pure function
//! (`machine`), a row as stored and shown (`rows`), claims written from the
//! machine's claim rule (`claim`), and the calls that apply what the
//! machine decides (`deliveries`: renew, operations, finish; `sweep`: the
//! sweeper; `operator`: an operator's retry and cancel; `cancel`: the
//! bulk cancellation of open rows).
//!
//! May use: `events`, `persistence`, `refusal`, `config`.

pub mod cancel;
pub mod claim;
pub mod deliveries;
pub mod machine;
pub mod operator;
pub mod rows;
pub mod sweep;
