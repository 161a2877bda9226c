//! Time, injected so that deadlines can be tested without sleeping.

use std::{
    fmt::Debug,
    sync::{Arc, Mutex, PoisonError},
};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

/// The current time, at millisecond precision (what both stores keep).
pub trait Clock: Send + Sync + Debug {
    fn now(&self) -> DateTime<Utc>;
}

fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(t)
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        to_millis(Utc::now())
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Arc::new(Mutex::new(to_millis(start))) }
    }

    /// Starts at the current wall-clock time.
    pub fn starting_now() -> Self {
        Self::new(Utc::now())
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX);
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = to_millis(*now + by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::starting_now();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.advance(std::time::Duration::from_millis(1500));
        assert_eq!(clock.now() - t0, TimeDelta::milliseconds(1500));
    }

    #[test]
    fn system_clock_has_millisecond_precision() {
        let now = SystemClock.now();
        assert_eq!(now.timestamp_subsec_nanos() % 1_000_000, 0);
    }
}
