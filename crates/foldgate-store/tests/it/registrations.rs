//! Registrations of upstreams and models, on each backend: added once per
//! kind and name with their audit entry in the same transaction, read back
//! as written, removed once.

use chrono::{DateTime, Utc};
use foldgate_domain::{Principal, Subject, TenantId};
use foldgate_store::{AuditEntry, AuditPage, Registration, RegistrationKind, Store};
use foldgate_testkit::{Backend, TestDb, on_both_backends};
use serde_json::json;
use uuid::Uuid;

fn entry(action: &str, target: &str, at: DateTime<Utc>) -> AuditEntry {
    AuditEntry {
        id: Uuid::now_v7(),
        at,
        actor: root(),
        tenant: None,
        action: action.into(),
        target: target.into(),
        detail: json!({}),
    }
}

fn root() -> Principal {
    Principal::new(TenantId::parse("ops").unwrap(), Subject::parse("root").unwrap())
}

async fn audit_actions(store: &dyn Store) -> Vec<String> {
    let page = AuditPage { tenant: None, limit: 50, before: None };
    store.audit(&page).await.unwrap().into_iter().map(|e| e.action).collect()
}

async fn registrations_are_kept_once_per_kind_and_name(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.connect().await;
    let at = DateTime::<Utc>::from_timestamp_millis(1_700_000_000_123).unwrap();
    let files = Registration {
        kind: RegistrationKind::Upstream,
        name: "files".into(),
        spec: json!({"name": "files", "url": "http://files/mcp", "headers": {"A": "${X_Y}"}}),
        created_at: at,
        created_by: root(),
    };
    assert!(
        store.add_registration(&files, &entry("upstream.register", "files", at)).await.unwrap()
    );
    // A model may share an upstream's name; a second upstream may not.
    let model = Registration {
        kind: RegistrationKind::Model,
        spec: json!({"name": "files", "provider": "openai"}),
        ..files.clone()
    };
    assert!(store.add_registration(&model, &entry("model.register", "files", at)).await.unwrap());
    let twice = Registration { spec: json!({"other": true}), ..files.clone() };
    assert!(
        !store.add_registration(&twice, &entry("upstream.register", "files", at)).await.unwrap()
    );
    assert_eq!(
        store.registrations().await.unwrap(),
        [model.clone(), files.clone()],
        "by kind, then name"
    );
    assert_eq!(
        audit_actions(&*store).await,
        ["model.register", "upstream.register"],
        "no entry for a refusal"
    );

    let remove = entry("upstream.remove", "files", at);
    assert!(store.remove_registration(RegistrationKind::Upstream, "files", &remove).await.unwrap());
    assert!(
        !store.remove_registration(RegistrationKind::Upstream, "files", &remove).await.unwrap()
    );
    assert_eq!(store.registrations().await.unwrap(), [model]);
    assert_eq!(audit_actions(&*store).await.len(), 3);
    store.close().await;
    db.cleanup().await;
}

on_both_backends!(registrations_are_kept_once_per_kind_and_name);
