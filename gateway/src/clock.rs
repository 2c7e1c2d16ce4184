//! The wall clock, read by the loop once per iteration and by the edges
//! (the core is given the time, never reads it).

/// Wall-clock milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
