//! The admin API's settings (`[admin]`).

use foldgate_domain::ConfigError;
use serde::Deserialize;

/// `[admin]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The environment variables that upstreams and models registered
    /// through the API may name in their credentials (`${VAR}`): only those
    /// whose names start with this. The secrets themselves are never kept
    /// in the database.
    pub credential_env_prefix: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { credential_env_prefix: "FOLDGATE_SECRET_".to_owned() }
    }
}

impl AdminConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let prefix = &self.credential_env_prefix;
        let valid = prefix.len() >= 2
            && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !prefix.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!(
                "credential_env_prefix {prefix:?} must be at least 2 letters, digits or '_', \
                 not starting with a digit"
            )
            .into());
        }
        // Other `FOLDGATE_` variables are read as settings.
        if prefix.starts_with("FOLDGATE_") && !prefix.starts_with("FOLDGATE_SECRET_") {
            return Err(format!(
                "credential_env_prefix {prefix:?}: variables named FOLDGATE_… are settings; \
                 use FOLDGATE_SECRET_… (never read as settings) or a prefix of your own"
            )
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_checked() {
        AdminConfig::default().validate().unwrap();
        for good in ["FOLDGATE_SECRET_TEAM_", "TEAM_SECRET_", "CARGO_PKG_"] {
            AdminConfig { credential_env_prefix: good.to_owned() }.validate().unwrap();
        }
        for bad in ["", "X", "1ABC", "FOLD-GATE_", "FOLDGATE SECRET", "FOLDGATE_TEAM_"] {
            let config = AdminConfig { credential_env_prefix: bad.to_owned() };
            assert!(config.validate().is_err(), "{bad:?}");
        }
    }
}
