//! How long a branch may run before the supervisor force-returns it.

use std::time::Duration;

use serde::Deserialize;

use crate::{
    InvalidInput,
    duration::{self, Renamed},
};

/// Defaults and caps for a branch's `timeout_seconds` (`[folding.timeout]`);
/// operators may change them. Kept in whole seconds, as branches count
/// their timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutPolicy {
    /// Used when a create names no timeout.
    #[serde(alias = "default_seconds", deserialize_with = "duration::whole_seconds")]
    pub default: Duration,
    /// Longer requests are silently capped to this.
    #[serde(alias = "max_seconds", deserialize_with = "duration::whole_seconds")]
    pub max: Duration,
}

impl Default for TimeoutPolicy {
    fn default() -> Self {
        Self { default: Duration::from_secs(300), max: Duration::from_secs(600) }
    }
}

/// The longest branch timeout a policy may set: a year, far below what
/// the whole seconds of a timeout can count.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

impl TimeoutPolicy {
    /// The former names of its settings.
    pub const RENAMED: &'static [Renamed] =
        &[Renamed::new("default_seconds", "default"), Renamed::new("max_seconds", "max")];

    /// Checks that the policy itself makes sense (operator input).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        for (name, value) in [("default", self.default), ("max", self.max)] {
            duration::check_range(
                &format!("timeout.{name}"),
                value,
                Duration::from_secs(1),
                LONGEST,
            )?;
        }
        if self.default > self.max {
            return Err(format!(
                "timeout.default ({}) exceeds timeout.max ({})",
                duration::show(self.default),
                duration::show(self.max)
            )
            .into());
        }
        Ok(())
    }

    fn default_seconds(&self) -> u32 {
        u32::try_from(self.default.as_secs()).unwrap_or(u32::MAX)
    }

    fn max_seconds(&self) -> u32 {
        u32::try_from(self.max.as_secs()).unwrap_or(u32::MAX)
    }
}

/// A branch timeout, already defaulted and capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutRequest {
    seconds: u32,
}

impl TimeoutRequest {
    /// `None` means the policy default; values above the cap are capped.
    pub fn parse(requested: Option<i64>, policy: &TimeoutPolicy) -> Result<Self, InvalidInput> {
        let seconds = match requested {
            None => policy.default_seconds(),
            Some(s) if s < 1 => {
                return Err(InvalidInput::new("timeout_seconds", "must be at least 1"));
            }
            Some(s) => u32::try_from(s).unwrap_or(u32::MAX).min(policy.max_seconds()),
        };
        Ok(Self { seconds })
    }

    pub fn seconds(&self) -> u32 {
        self.seconds
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs(u64::from(self.seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_caps_and_rejections() {
        let p = TimeoutPolicy::default();
        let cases: &[(Option<i64>, Option<u32>, &str)] = &[
            (None, Some(300), "default"),
            (Some(1), Some(1), "minimum"),
            (Some(600), Some(600), "at cap"),
            (Some(601), Some(600), "capped"),
            (Some(i64::MAX), Some(600), "huge is capped"),
            (Some(0), None, "zero"),
            (Some(-5), None, "negative"),
        ];
        for (req, want, why) in cases {
            let got = TimeoutRequest::parse(*req, &p).ok().map(|t| t.seconds());
            assert_eq!(got, *want, "{why}");
        }
    }

    #[test]
    fn policy_validation() {
        let policy = |default: u64, max: u64| TimeoutPolicy {
            default: Duration::from_secs(default),
            max: Duration::from_secs(max),
        };
        assert!(TimeoutPolicy::default().validate().is_ok());
        let e = policy(700, 600).validate().unwrap_err().to_string();
        assert_eq!(e, "timeout.default (11m 40s) exceeds timeout.max (10m)");
        let e = policy(0, 600).validate().unwrap_err().to_string();
        assert_eq!(e, "timeout.default must be from 1s to 365d, got 0s");
        assert!(policy(600, 400 * 24 * 3600).validate().is_err(), "over a year");
    }

    #[test]
    fn settings_read_with_units_or_their_former_names() {
        let read = |json: &str| serde_json::from_str::<TimeoutPolicy>(json);
        let policy = read(r#"{"default": "2m", "max": 900}"#).unwrap();
        assert_eq!((policy.default.as_secs(), policy.max.as_secs()), (120, 900));
        let policy = read(r#"{"default_seconds": 60, "max_seconds": "1h"}"#).unwrap();
        assert_eq!((policy.default.as_secs(), policy.max.as_secs()), (60, 3600));
        let e = read(r#"{"default": "1500ms"}"#).unwrap_err().to_string();
        assert!(e.contains("not a whole number of seconds"), "{e}");
    }
}
