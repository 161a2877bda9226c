//! Keeps this replica's upstreams and models as the registrations in the
//! database say: a background task, `registrations`, reads them every
//! [`SYNC_INTERVAL`] (and at once when this replica's admin API changed
//! one), and builds or drops clients; so a registration made on one replica
//! is live on every replica within seconds, without a restart.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use foldgate_background::{Activation, BackgroundTask, BoxFuture, Driver, StopOrder, TaskDef};
use foldgate_runner::{ModelConfig, Models};
use foldgate_store::{Registration, RegistrationKind, Store};
use foldgate_upstream::{UpstreamConfig, Upstreams};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::AdminState;

/// How often every replica reads the registrations.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// Registers the task; the state's `registrations_changed` wakes it at once.
pub fn register(driver: &mut Driver, state: &AdminState) {
    let def = TaskDef::new("registrations", StopOrder::SERVING)
        .period(SYNC_INTERVAL)
        .trigger(state.registrations_changed.clone());
    let task = RegistrationSync {
        store: Arc::clone(state.service.store()),
        upstreams: Arc::clone(&state.upstreams),
        models: Arc::clone(&state.models),
        prefix: state.config.credential_env_prefix.clone(),
        unreadable: BTreeSet::new(),
    };
    driver.register(def, task);
}

/// The task.
struct RegistrationSync {
    store: Arc<dyn Store>,
    upstreams: Arc<Upstreams>,
    models: Arc<Models>,
    /// What credentials may reference (`[admin] credential_env_prefix`).
    prefix: String,
    /// Registrations already reported as unusable, so each is logged once.
    unreadable: BTreeSet<(RegistrationKind, String)>,
}

impl RegistrationSync {
    async fn pass(&mut self) -> Activation {
        let rows = match self.store.registrations().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "reading the registrations failed; kept as they were");
                return Activation::failed(e, json!({}));
            }
        };
        let mut unreadable = BTreeSet::new();
        let upstreams: Vec<UpstreamConfig> = self.declarations(
            &rows,
            RegistrationKind::Upstream,
            |c: &UpstreamConfig| c.validate_registered(&self.prefix).map_err(|e| e.to_string()),
            &mut unreadable,
        );
        let models: Vec<ModelConfig> = self.declarations(
            &rows,
            RegistrationKind::Model,
            |c: &ModelConfig| c.validate_registered(&self.prefix).map_err(|e| e.to_string()),
            &mut unreadable,
        );
        self.unreadable = unreadable;
        let env = |var: &str| std::env::var(var).ok();
        let failed = self
            .upstreams
            .apply(&upstreams, env)
            .into_iter()
            .map(|e| ("upstream", e))
            .chain(self.models.apply(&models, env).into_iter().map(|e| ("model", e)));
        for (kind, (name, error)) in failed {
            tracing::warn!(kind, name = %name, error = %error,
                "a registration cannot be used on this replica");
        }
        Activation::ok(json!({"upstreams": upstreams.len(), "models": models.len()}))
    }

    /// The declarations of one kind that read and pass the checks; the
    /// others are logged (once each) and left out.
    fn declarations<T: DeserializeOwned>(
        &self,
        rows: &[Registration],
        kind: RegistrationKind,
        check: impl Fn(&T) -> Result<(), String>,
        unreadable: &mut BTreeSet<(RegistrationKind, String)>,
    ) -> Vec<T> {
        rows.iter()
            .filter(|r| r.kind == kind)
            .filter_map(|r| {
                let read = serde_json::from_value::<T>(r.spec.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|declared| check(&declared).map(|()| declared));
                match read {
                    Ok(declared) => Some(declared),
                    Err(error) => {
                        let key = (kind, r.name.clone());
                        if !self.unreadable.contains(&key) {
                            tracing::warn!(kind = kind.as_str(), name = %r.name, %error,
                                "a registration cannot be read; it is left out");
                        }
                        unreadable.insert(key);
                        None
                    }
                }
            })
            .collect()
    }
}

impl BackgroundTask for RegistrationSync {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.pass())
    }
}
