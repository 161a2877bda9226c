//! How long a branch may run before the supervisor force-returns it.

use std::time::Duration;

use serde::Deserialize;

use crate::InvalidInput;

/// Defaults and caps for `timeout_seconds`; operators may change them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutPolicy {
    /// Used when a create names no timeout.
    pub default_seconds: u32,
    /// Longer requests are silently capped to this.
    pub max_seconds: u32,
}

impl Default for TimeoutPolicy {
    fn default() -> Self {
        Self { default_seconds: 300, max_seconds: 600 }
    }
}

impl TimeoutPolicy {
    /// Checks that the policy itself makes sense (operator input).
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if self.default_seconds == 0 || self.max_seconds == 0 {
            return Err("timeouts must be at least 1 second".into());
        }
        if self.default_seconds > self.max_seconds {
            return Err(format!(
                "default timeout ({}s) exceeds the maximum ({}s)",
                self.default_seconds, self.max_seconds
            )
            .into());
        }
        Ok(())
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
            None => policy.default_seconds,
            Some(s) if s < 1 => {
                return Err(InvalidInput::new("timeout_seconds", "must be at least 1"));
            }
            Some(s) => u32::try_from(s).unwrap_or(u32::MAX).min(policy.max_seconds),
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
        assert!(TimeoutPolicy::default().validate().is_ok());
        assert!(TimeoutPolicy { default_seconds: 700, max_seconds: 600 }.validate().is_err());
        assert!(TimeoutPolicy { default_seconds: 0, max_seconds: 600 }.validate().is_err());
    }
}
