//! Tokens verified with a PEM public key, and PEM files that cannot serve.

use super::*;

#[tokio::test]
async fn pem_public_keys() {
    let clock = clock();
    let base = claims(&clock);
    let keys = [
        ("RS256", &*RSA, None),
        ("ES256", &TestKey::p256(), Some(TestKey::p256())),
        ("EdDSA", &TestKey::ed25519(), Some(TestKey::ed25519())),
    ];
    for (name, key, other_key_of_same_type) in keys {
        // Arrange
        let file = key.public_key_file();
        let config = AuthConfig { public_key_file: Some(file.path().to_owned()), ..hs_config() };
        let config = AuthConfig { jwt_secret: None, ..config };
        let auth = authenticator(&config, &clock).await;
        let valid = key.sign(None, &base);
        let foreign_alg =
            if key.alg == Algorithm::ES256 { TestKey::ed25519() } else { TestKey::p256() };

        let mut cases: Vec<(&str, String, Result<(), &str>)> = vec![
            ("valid", valid.clone(), Ok(())),
            ("valid with a kid", key.sign(Some("any"), &base), Ok(())),
            (
                "tampered payload",
                with_payload(&valid, &patch(base.clone(), &json!({"tenant": "globex"}))),
                Err("bad_signature"),
            ),
            ("tampered signature", with_flipped_signature(&valid), Err("bad_signature")),
            (
                "expired",
                key.sign(None, &patch(base.clone(), &json!({"exp": now(&clock) - 3600}))),
                Err("expired"),
            ),
            ("another key type", foreign_alg.sign(None, &base), Err("unsupported_algorithm")),
            // Algorithm confusion: the public key, which anyone can read,
            // used as an HMAC secret.
            (
                "HS256 keyed with the public PEM",
                sign_hs256(&base, &key.public_pem),
                Err("unsupported_algorithm"),
            ),
            (
                "alg none",
                format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&base)),
                Err("unsupported_algorithm"),
            ),
        ];
        if let Some(other) = &other_key_of_same_type {
            cases.push((
                "another key of the same type",
                other.sign(None, &base),
                Err("bad_signature"),
            ));
        }
        if key.alg == Algorithm::RS256 {
            let enc = key.encoding_key();
            cases.push((
                "RS384 with the same key",
                sign(Algorithm::RS384, None, &base, &enc),
                Err("unsupported_algorithm"),
            ));
            cases.push((
                "PS256 with the same key",
                sign(Algorithm::PS256, None, &base, &enc),
                Err("unsupported_algorithm"),
            ));
        }
        for (why, token, expected) in cases {
            // Act
            let result = auth.authenticate(&token).await;
            // Assert
            assert_eq!(kind(&result), expected, "{name}: {why}");
        }
    }
}

#[tokio::test]
async fn hs256_keyed_with_the_rsa_public_key_is_refused() {
    // Arrange: the configured source is the RSA public key; the attacker
    // knows its PEM and uses it as an HMAC secret.
    let clock = clock();
    let file = RSA.public_key_file();
    let config =
        AuthConfig { public_key_file: Some(file.path().to_owned()), ..AuthConfig::default() };
    let auth = authenticator(&config, &clock).await;
    let forged = claims(&clock);
    let variants = [
        ("PEM text", RSA.public_pem.clone()),
        ("PEM text without trailing newline", RSA.public_pem.trim_end().to_owned()),
    ];
    for (why, secret) in variants {
        let token = sign_hs256(&forged, &secret);
        // Act
        let result = auth.authenticate(&token).await;
        // Assert
        assert_eq!(kind(&result), Err("unsupported_algorithm"), "{why}");
    }
    // The same claims signed with the real key pass, so the refusal above is
    // about the algorithm and nothing else.
    assert!(auth.authenticate(&RSA.sign(None, &forged)).await.is_ok());
}

#[tokio::test]
async fn unusable_pem_files_stop_startup() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let private = TestKey::p256().private_pem;
    let cases = [
        (dir.path().join("missing.pem"), "cannot read public_key_file"),
        (write("garbage.pem", "not a key"), "no PEM block"),
        (write("private.pem", &private), "private key"),
        (
            write("cert.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            "expected a PUBLIC KEY",
        ),
        (
            write("broken.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
            "expected an RSA",
        ),
    ];
    for (path, needle) in cases {
        let config = AuthConfig { public_key_file: Some(path.clone()), ..AuthConfig::default() };
        let err = Authenticator::new(&config).await.unwrap_err();
        assert!(
            matches!(err, AuthSetupError::ReadKey { .. } | AuthSetupError::BadKey { .. }),
            "{}: {err:?}",
            path.display()
        );
        assert!(err.to_string().contains(needle), "{}: {err} lacks {needle:?}", path.display());
    }
    let err = Authenticator::new(&AuthConfig::default()).await.unwrap_err();
    assert!(matches!(err, AuthSetupError::Config(_)), "no key source is a configuration error");
}
