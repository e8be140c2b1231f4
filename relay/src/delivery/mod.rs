//! Deliveries to managed agents: the state machine, one pure function
//! (`machine`), and the calls that apply what it decides (`deliveries`:
//! claim, renew, operations, finish, the sweeper, the views).
//!
//! May use: `workflow` (a finish wakes its run), `events`, `persistence`,
//! `refusal`, `config`.

pub mod deliveries;
pub mod machine;
