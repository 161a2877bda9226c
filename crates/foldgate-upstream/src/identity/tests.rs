use std::{collections::BTreeSet, sync::Arc};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use foldgate_domain::{BranchId, Principal, Subject, TenantId};
use jsonwebtoken::{DecodingKey, Validation, jwk::JwkSet};
use serde_json::Value;

use super::*;

/// A key written to a file, and the settings that name it.
struct KeyFile {
    _dir: tempfile::TempDir,
    config: IdentityConfig,
}

fn key_file(pem: &str) -> KeyFile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key.pem");
    std::fs::write(&path, pem).unwrap();
    let config = IdentityConfig { signing_key_file: Some(path), ..IdentityConfig::default() };
    KeyFile { _dir: dir, config }
}

fn ed25519_pem() -> String {
    use ed25519_dalek::pkcs8::{EncodePrivateKey, spki::der::pem::LineEnding};
    let key = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
    // PKCS #8 v2, with the public key, as OpenSSL 3 writes it.
    key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

fn p256_pem() -> String {
    use p256::pkcs8::{EncodePrivateKey, LineEnding};
    p256::SecretKey::random(&mut rand_core::OsRng).to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

fn rsa_pem() -> String {
    use rsa::{RsaPrivateKey, pkcs1::EncodeRsaPrivateKey, pkcs8::LineEnding};
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
    key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string()
}

/// A token's claims, verified as an upstream would: with the key of the
/// served set that its `kid` names, for `audience`.
fn verify(keys: &JwkSet, token: &str, audience: &str) -> Value {
    let header = jsonwebtoken::decode_header(token).unwrap();
    let kid = header.kid.as_deref().expect("a kid");
    let jwk = keys.find(kid).expect("the kid is in the key set");
    let key = DecodingKey::from_jwk(jwk).unwrap();
    let mut validation = Validation::new(header.alg);
    validation.set_audience(&[audience]);
    validation.set_issuer(&["foldgate"]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    jsonwebtoken::decode::<Value>(token, &key, &validation).unwrap().claims
}

fn alice() -> Principal {
    Principal::new(TenantId::parse("acme").unwrap(), Subject::parse("alice").unwrap())
}

#[test]
fn tokens_of_each_key_type_verify_with_the_served_key_set() {
    for (pem, alg) in [(ed25519_pem(), "EdDSA"), (p256_pem(), "ES256"), (rsa_pem(), "RS256")] {
        let file = key_file(&pem);
        let signer = Signer::load(&file.config).unwrap();
        assert!(!signer.is_ephemeral());
        let keys = serde_json::to_value(signer.key_set()).unwrap();
        assert_eq!(keys["keys"].as_array().unwrap().len(), 1, "{alg}");
        assert_eq!(keys["keys"][0]["kid"], signer.key_id(), "{alg}");
        assert_eq!(keys["keys"][0]["use"], "sig", "{alg}");
        assert_eq!(keys["keys"][0]["alg"], alg);
        assert!(keys["keys"][0].get("d").is_none(), "{alg}: no private part is published");

        let principal = alice();
        let scopes: BTreeSet<String> = ["fold:write".into(), "repo:read".into()].into();
        let branch = BranchId::generate();
        let caller = OnBehalf { principal: &principal, scopes: &scopes, branch: Some(branch) };
        let token = signer.mint("https://repo.example/mcp", Some(&caller)).unwrap();
        assert_eq!(jsonwebtoken::decode_header(&token).unwrap().alg, alg.parse().unwrap());
        let claims = verify(signer.key_set(), &token, "https://repo.example/mcp");
        assert_eq!(claims["sub"], "alice", "{alg}");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["scope"], "fold:write repo:read");
        assert_eq!(claims[BRANCH_CLAIM], branch.to_string());
        // Issued and valid from 30 s ago, against clock skew; for the lifetime from now.
        let now = chrono::Utc::now().timestamp();
        let iat = claims["iat"].as_i64().unwrap();
        assert!((now - 32..=now - 29).contains(&iat), "{iat} against {now}");
        assert_eq!(claims["nbf"], claims["iat"]);
        assert_eq!(claims["exp"].as_i64().unwrap() - iat, 330);
        let again = signer.mint("https://repo.example/mcp", Some(&caller)).unwrap();
        assert_ne!(
            verify(signer.key_set(), &again, "https://repo.example/mcp")["jti"],
            claims["jti"]
        );
    }
}

#[test]
fn the_key_id_is_the_rfc_7638_thumbprint() {
    // RFC 8037 appendix A: an Ed25519 key and its thumbprint (A.3).
    let d = URL_SAFE_NO_PAD.decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A").unwrap();
    let der = ed25519_v1(&d.try_into().unwrap());
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let file =
        key_file(&format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"));
    let signer = Signer::load(&file.config).unwrap();
    assert_eq!(signer.key_id(), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
    let jwk = serde_json::to_value(&signer.key_set().keys[0]).unwrap();
    assert_eq!(jwk["x"], "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo");
    assert_eq!((jwk["kty"].as_str(), jwk["crv"].as_str()), (Some("OKP"), Some("Ed25519")));
}

#[test]
fn without_a_key_file_a_key_is_made_and_each_start_makes_another() {
    let config = IdentityConfig::default();
    let (one, two) = (Signer::load(&config).unwrap(), Signer::load(&config).unwrap());
    assert!(one.is_ephemeral());
    assert_ne!(one.key_id(), two.key_id());
    // The gateway's own requests: the issuer as subject, no tenant.
    let token = one.mint("aud", None).unwrap();
    let claims = verify(one.key_set(), &token, "aud");
    assert_eq!(claims["sub"], "foldgate");
    assert_eq!(claims.get("tenant"), None);
    let stranger = two.key_set().find(one.key_id());
    assert!(stranger.is_none(), "another start's key set does not verify it");
}

#[test]
fn the_previous_key_is_published_but_never_signs() {
    let old_pem = p256_pem();
    let old = key_file(&old_pem);
    let old_signer = Signer::load(&old.config).unwrap();
    let minted_before = old_signer.mint("aud", None).unwrap();

    let new = key_file(&ed25519_pem());
    for previous in [old_pem.clone(), public_pem_of_p256(&old_pem)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("previous.pem");
        std::fs::write(&path, &previous).unwrap();
        let config = IdentityConfig { previous_key_file: Some(path), ..new.config.clone() };
        let signer = Signer::load(&config).unwrap();
        assert_eq!(signer.key_set().keys.len(), 2);
        assert_eq!(signer.key_set().keys[1].common.key_id.as_deref(), Some(old_signer.key_id()));
        // Tokens minted before the rotation still verify; new ones use the new key.
        verify(signer.key_set(), &minted_before, "aud");
        let minted_after = signer.mint("aud", None).unwrap();
        let kid = jsonwebtoken::decode_header(&minted_after).unwrap().kid.unwrap();
        assert_eq!(kid, signer.key_id());
        assert_ne!(kid, old_signer.key_id());
    }

    let same = IdentityConfig {
        previous_key_file: new.config.signing_key_file.clone(),
        ..new.config.clone()
    };
    let error = Signer::load(&same).unwrap_err();
    assert!(error.contains("same key"), "{error}");
}

fn public_pem_of_p256(private: &str) -> String {
    use p256::pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
    let key = p256::SecretKey::from_pkcs8_pem(private).unwrap();
    key.public_key().to_public_key_pem(LineEnding::LF).unwrap()
}

#[test]
fn unusable_keys_are_refused_clearly() {
    let not_a_key = key_file("hello\n");
    let error = Signer::load(&not_a_key.config).unwrap_err();
    assert!(error.starts_with("signing_key_file "), "{error}");
    assert!(error.contains("Ed25519, P-256 or RSA"), "{error}");

    let (p384, p384_public) = {
        use p384::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
        let key = p384::SecretKey::random(&mut rand_core::OsRng);
        let public = key.public_key().to_public_key_pem(LineEnding::LF).unwrap();
        (key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(), public)
    };
    let file = key_file(&p384);
    let error = Signer::load(&file.config).unwrap_err();
    assert!(error.contains("only P-256"), "{error}");
    // Nor as the previous key, private or public: it would be published as ES256.
    for previous in [p384, p384_public] {
        let signing = key_file(&ed25519_pem());
        let old = key_file(&previous);
        let config = IdentityConfig {
            previous_key_file: old.config.signing_key_file.clone(),
            ..signing.config.clone()
        };
        let error = Signer::load(&config).unwrap_err();
        assert!(error.starts_with("previous_key_file ") && error.contains("P-256"), "{error}");
    }

    let missing = IdentityConfig {
        signing_key_file: Some("/nonexistent/key.pem".into()),
        ..IdentityConfig::default()
    };
    let error = Signer::load(&missing).unwrap_err();
    assert!(error.starts_with("signing_key_file /nonexistent/key.pem: "), "{error}");

    let alone = IdentityConfig {
        previous_key_file: Some("/tmp/k.pem".into()),
        ..IdentityConfig::default()
    };
    assert_eq!(alone.validate().unwrap_err(), "previous_key_file is set without signing_key_file");
    let short = IdentityConfig { token_ttl: Duration::from_secs(5), ..IdentityConfig::default() };
    assert!(short.validate().unwrap_err().contains("token_ttl"));
}

#[test]
fn headers_name_the_caller_percent_encoded() {
    let principal =
        Principal::new(TenantId::parse("acme").unwrap(), Subject::parse("Zoë 100%|ok").unwrap());
    let scopes: BTreeSet<String> = ["a:b".into(), "fold:write".into()].into();
    let branch = BranchId::generate();
    let caller = OnBehalf { principal: &principal, scopes: &scopes, branch: Some(branch) };
    let identity = Identity { mode: IdentityMode::Headers, audience: String::new(), signer: None };
    let headers = identity.headers(Some(&caller)).unwrap();
    assert_eq!(headers[&TENANT_HEADER], "acme");
    assert_eq!(headers[&SUBJECT_HEADER], "Zo%C3%AB%20100%25|ok");
    assert_eq!(headers[&SCOPE_HEADER], "a:b fold:write");
    assert_eq!(headers[&IDENTITY_BRANCH_HEADER], branch.to_string().as_str());
    assert!(identity.headers(None).unwrap().is_empty(), "the gateway's own requests");

    let outside = OnBehalf { branch: None, ..caller };
    assert!(!identity.headers(Some(&outside)).unwrap().contains_key(&IDENTITY_BRANCH_HEADER));
    let none = Identity { mode: IdentityMode::None, ..identity };
    assert!(none.headers(Some(&caller)).unwrap().is_empty());
}

#[test]
fn a_token_goes_in_authorization_for_the_upstreams_audience() {
    let signer = Arc::new(Signer::load(&IdentityConfig::default()).unwrap());
    let identity = Identity {
        mode: IdentityMode::Token,
        audience: "urn:repo".into(),
        signer: Some(Arc::clone(&signer)),
    };
    let principal = alice();
    let scopes = BTreeSet::new();
    let caller = OnBehalf { principal: &principal, scopes: &scopes, branch: None };
    let headers = identity.headers(Some(&caller)).unwrap();
    let bearer = headers[header::AUTHORIZATION].to_str().unwrap();
    assert!(headers[header::AUTHORIZATION].is_sensitive());
    let claims = verify(signer.key_set(), bearer.strip_prefix("Bearer ").unwrap(), "urn:repo");
    assert_eq!((claims["sub"].as_str(), claims["scope"].as_str()), (Some("alice"), Some("")));
    assert_eq!(claims.get(BRANCH_CLAIM), None);
    assert!(headers.get(&TENANT_HEADER).is_none(), "no identity headers with a token");
}

#[test]
fn identity_headers_go_only_over_tls_or_to_this_host() {
    for (url, private) in [
        ("https://repo.example/mcp", true),
        ("http://127.0.0.1:9000/mcp", true),
        ("http://127.8.0.1/mcp", true),
        ("http://localhost:8000/mcp", true),
        ("http://[::1]:8000/mcp", true),
        ("http://repo.example/mcp", false),
        ("http://10.0.0.5/mcp", false),
        ("http://localhost.example.com/mcp", false),
    ] {
        assert_eq!(private_path(&reqwest::Url::parse(url).unwrap()), private, "{url}");
    }
}
