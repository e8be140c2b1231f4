//! This process's clock, in the unit every rule uses: unix seconds.
//!
//! (The database clock, which every relay process on one PostgreSQL
//! database shares, is read through `crate::persistence::db::Tx::now`.)

/// Unix seconds now (0 if the system clock is before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unix milliseconds now (0 if the system clock is before 1970).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
