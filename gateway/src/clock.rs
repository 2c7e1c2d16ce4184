//! The loop's clock: read once per iteration and passed in.
//!
//! A [`Now`] carries both clocks the shell needs: wall milliseconds (what
//! the core, the store and agents see: run start times, timers, leases) and
//! a monotonic instant (what paces the loop: cycle spacing, commit spacing,
//! waits), so a wall-clock step never stalls or races the loop. Tests make
//! their own [`Now`]s ([`Now::at`], [`Now::later`]) and drive the loop
//! through time without sleeping.

use std::time::{Duration, Instant};

/// One reading of the clock.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Wall-clock milliseconds since the epoch.
    pub ms: u64,
    /// The same moment on the monotonic clock.
    pub at: Instant,
}

impl Now {
    /// Reads both clocks.
    pub fn read() -> Now {
        Now {
            ms: wall_ms(),
            at: Instant::now(),
        }
    }

    /// A given moment (for tests and replays).
    pub fn at(ms: u64, at: Instant) -> Now {
        Now { ms, at }
    }

    /// This moment moved on by `d`.
    pub fn later(self, d: Duration) -> Now {
        Now {
            ms: self.ms + d.as_millis() as u64,
            at: self.at + d,
        }
    }

    /// The monotonic instant of a wall-clock deadline (the core's timers);
    /// one already past is due now.
    pub fn instant_of(&self, ms: u64) -> Instant {
        self.at + Duration::from_millis(ms.saturating_sub(self.ms))
    }
}

/// Wall-clock milliseconds since the epoch. Handlers stamp what they send
/// with it (audit entries, client-mode leases); the loop reads [`Now`].
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_in_wall_time_map_onto_the_monotonic_clock() {
        let base = Instant::now();
        let now = Now::at(10_000, base);
        assert_eq!(now.instant_of(10_250), base + Duration::from_millis(250));
        assert_eq!(now.instant_of(10_000), base);
        // A deadline already past is due now.
        assert_eq!(now.instant_of(9_000), base);
        let later = now.later(Duration::from_millis(40));
        assert_eq!(later.ms, 10_040);
        assert_eq!(later.at, base + Duration::from_millis(40));
    }
}
