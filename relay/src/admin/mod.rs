//! Administration: communities and their hosts (`communities`),
//! management in one transaction with its notice (`manage`: NIP-86 and
//! ours), and the dashboard's reads (`overview`).
//!
//! May use: `delivery` (retry and cancel are edges of its machine),
//! `events`, `persistence`, `refusal`, `admission`, `config`.

pub mod communities;
pub mod manage;
pub mod overview;
