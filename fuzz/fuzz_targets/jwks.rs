//! JSON Web Key Set documents, as the key cache reads an identity
//! provider's.
//!
//! Invariants:
//! - reading never panics, whatever the document holds;
//! - a set keeps exactly the keys that each alone would keep;
//! - a key kept can verify signatures: its `use`, if any, is `sig`; its
//!   `key_ops`, if any, include `verify`; it is never a symmetric key (anyone
//!   who can read the set could sign with it); its algorithms are those of
//!   its type and curve, narrowed to its `alg` when it declares one.
#![no_main]

use foldgate_auth::fuzzing::key_set;
use jsonwebtoken::Algorithm;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn allowed(key: &Value) -> Vec<Algorithm> {
    use Algorithm::*;
    match (key["kty"].as_str(), key["crv"].as_str()) {
        (Some("RSA"), _) => vec![RS256, RS384, RS512, PS256, PS384, PS512],
        (Some("EC"), Some("P-256")) => vec![ES256],
        (Some("EC"), Some("P-384")) => vec![ES384],
        (Some("OKP"), Some("Ed25519")) => vec![EdDSA],
        _ => Vec::new(),
    }
}

fuzz_target!(|body: &[u8]| {
    let whole = key_set(body);
    let Ok(document) = serde_json::from_slice::<Value>(body) else {
        assert!(whole.is_err(), "a document that is not JSON was read");
        return;
    };
    let Some(keys) = document.get("keys").and_then(Value::as_array) else { return };
    let mut kept = Vec::new();
    for key in keys {
        let Ok(alone) = key_set(json!({"keys": [key]}).to_string().as_bytes()) else { continue };
        assert_eq!(alone.len(), 1);
        let (kid, algorithms) = alone.into_iter().next().expect("one key");
        assert_eq!(kid.as_deref(), key.get("kid").and_then(Value::as_str));
        if let Some(usage) = key.get("use") {
            assert_eq!(usage, "sig", "a key for {usage} was kept");
        }
        if let Some(ops) = key.get("key_ops") {
            assert!(ops.as_array().is_some_and(|o| o.contains(&json!("verify"))), "key_ops {ops}");
        }
        let allowed = allowed(key);
        assert!(!algorithms.is_empty());
        assert!(algorithms.iter().all(|a| allowed.contains(a)), "{algorithms:?} for {key}");
        if let Some(alg) = key.get("alg").and_then(Value::as_str) {
            assert_eq!(algorithms.len(), 1);
            assert_eq!(format!("{:?}", algorithms[0]), alg);
        }
        kept.push((kid, algorithms));
    }
    match whole {
        Ok(whole) => assert_eq!(whole, kept, "the set kept other keys than each alone"),
        Err(_) => assert!(kept.is_empty() || document["keys"].as_array().is_none()),
    }
});
