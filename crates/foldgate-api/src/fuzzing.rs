//! The MCP guard as the fuzz targets in `fuzz/` drive it: compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets.

use std::sync::Arc;

use foldgate_auth::Authenticated;
use foldgate_engine::{FoldingConfig, TenantRules};
use foldgate_upstream::Upstreams;
use http::HeaderMap;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::{
    args::Parsed,
    call::{Checked, Read},
    guard::{self, GuardState},
};

/// What the guard made of a posted body.
#[derive(Debug)]
pub enum Verdict {
    /// Let through to rmcp, with a folding tool's arguments parsed.
    Passed(Option<Parsed>),
    /// Answered by the guard itself.
    Refused { status: u16, body: Vec<u8> },
}

/// The guard of a gateway on the default configuration, with no
/// upstreams, called by a token that holds every scope.
#[derive(Debug)]
pub struct Guard {
    state: GuardState,
    who: Authenticated,
    config: Arc<FoldingConfig>,
}

impl Default for Guard {
    fn default() -> Self {
        let config = Arc::new(FoldingConfig::default());
        let state = GuardState {
            folding: Arc::clone(&config),
            tenants: Arc::new(TenantRules::new(&config)),
            upstreams: Upstreams::none(),
            resource_metadata: Arc::from("http://127.0.0.1/.well-known/oauth-protected-resource"),
        };
        Self { state, who: Authenticated::local(), config }
    }
}

impl Guard {
    /// The folding configuration the guard checks against.
    pub fn config(&self) -> &FoldingConfig {
        &self.config
    }

    /// Reads and checks a body as the exchange layer does.
    pub fn check(&self, body: &[u8]) -> Verdict {
        let message = serde_json::from_slice::<Value>(body);
        let headers = HeaderMap::new();
        let read = message
            .as_ref()
            .ok()
            .and_then(|m| Read::new(m, &headers, Some(&self.who), &self.state.upstreams));
        match guard::check_message(&self.state, Some(&self.who), &message, read.as_ref()) {
            Ok(Some(Checked::Folding(parsed))) => Verdict::Passed(Some(parsed)),
            Ok(_) => Verdict::Passed(None),
            Err(response) => {
                let (parts, body) = response.into_parts();
                let body = futures::executor::block_on(body.collect())
                    .map(|b| b.to_bytes().to_vec())
                    .unwrap_or_default();
                Verdict::Refused { status: parts.status.as_u16(), body }
            }
        }
    }
}
