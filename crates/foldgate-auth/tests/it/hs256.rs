//! Tokens signed with a shared secret (HS256): claims, scopes, leeway, minting.

use super::*;

#[tokio::test]
async fn hs256_tokens() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let t = now(&clock);
    let base = claims(&clock);
    let valid = sign_hs256(&base, SECRET);
    let none_token = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&base));
    let none_with_signature = format!("{}.{}.{}", b64(&json!({"alg": "none"})), b64(&base), "c2ln");
    let other_tenant = patch(base.clone(), &json!({"tenant": "globex"}));

    let cases: Vec<(&str, String, Result<(), &str>)> = vec![
        ("valid", valid.clone(), Ok(())),
        ("empty token", String::new(), Err("malformed")),
        ("not a JWT", "opaque-token".into(), Err("malformed")),
        (
            "expired",
            sign_hs256(&patch(base.clone(), &json!({"exp": t - 3600})), SECRET),
            Err("expired"),
        ),
        (
            "not yet valid",
            sign_hs256(&patch(base.clone(), &json!({"nbf": t + 3600})), SECRET),
            Err("not_yet_valid"),
        ),
        (
            "no exp",
            sign_hs256(&patch(base.clone(), &json!({"exp": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "wrong issuer",
            sign_hs256(&patch(base.clone(), &json!({"iss": "https://evil.test"})), SECRET),
            Err("wrong_issuer"),
        ),
        (
            "wrong audience",
            sign_hs256(&patch(base.clone(), &json!({"aud": "https://other.test/mcp"})), SECRET),
            Err("wrong_audience"),
        ),
        ("alg none", none_token, Err("unsupported_algorithm")),
        ("alg none with a signature", none_with_signature, Err("unsupported_algorithm")),
        (
            "HS512 with the right secret",
            sign(Algorithm::HS512, None, &base, &EncodingKey::from_secret(SECRET.as_bytes())),
            Err("unsupported_algorithm"),
        ),
        ("tampered payload", with_payload(&valid, &other_tenant), Err("bad_signature")),
        ("tampered signature", with_flipped_signature(&valid), Err("bad_signature")),
        (
            "signature removed",
            with_payload(&valid, &base).rsplit_once('.').unwrap().0.to_owned() + ".",
            Err("bad_signature"),
        ),
        (
            "wrong secret",
            sign_hs256(&base, "another-secret-of-sufficient-length-000"),
            Err("bad_signature"),
        ),
        (
            "no tenant",
            sign_hs256(&patch(base.clone(), &json!({"tenant": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "invalid tenant",
            sign_hs256(&patch(base.clone(), &json!({"tenant": "acme/../globex"})), SECRET),
            Err("bad_claims"),
        ),
        (
            "no sub",
            sign_hs256(&patch(base.clone(), &json!({"sub": null})), SECRET),
            Err("bad_claims"),
        ),
        (
            "invalid sub",
            sign_hs256(&patch(base.clone(), &json!({"sub": "a\u{0}b"})), SECRET),
            Err("bad_claims"),
        ),
    ];
    for (why, token, expected) in cases {
        // Act
        let result = auth.authenticate(&token).await;
        // Assert
        assert_eq!(kind(&result), expected, "{why}");
        if let Err(e) = &result {
            assert!(!e.is_unavailable(), "{why}: a bad token is never a key-source outage");
            if !token.is_empty() {
                assert!(!e.reason().contains(&token), "{why}: the reason must not echo the token");
            }
        }
    }

    let ok = auth.authenticate(&valid).await.unwrap();
    assert_eq!(ok.principal.tenant.as_str(), "acme");
    assert_eq!(ok.principal.subject.as_str(), "alice@acme.test");
    assert!(ok.has_scope(SCOPE_READ) && ok.has_scope(SCOPE_WRITE));
    assert_eq!(ok.expires_at.map(|e| e.timestamp()), Some(t + 600));
}

#[tokio::test]
async fn bad_claims_say_which_claim() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let cases = [
        (json!({"tenant": null}), "`tenant` claim is required"),
        (json!({"tenant": "has space"}), "`tenant` claim is not a valid tenant id"),
        (json!({"sub": 7}), "`sub` claim must be a string"),
        (json!({"scope": {"a": 1}}), "`scope` claim must be"),
    ];
    for (changes, needle) in cases {
        let token = sign_hs256(&patch(claims(&clock), &changes), SECRET);
        let err = auth.authenticate(&token).await.unwrap_err();
        assert!(err.reason().contains(needle), "{changes}: {:?} lacks {needle:?}", err.reason());
    }
}

#[tokio::test]
async fn custom_tenant_claim() {
    let clock = clock();
    let config = AuthConfig { tenant_claim: "https://acme.test/org".into(), ..hs_config() };
    let auth = authenticator(&config, &clock).await;
    let custom = patch(claims(&clock), &json!({"tenant": null, "https://acme.test/org": "org-42"}));
    let default_only = claims(&clock);

    let ok = auth.authenticate(&sign_hs256(&custom, SECRET)).await.unwrap();
    assert_eq!(
        ok.principal.tenant.as_str(),
        "org-42",
        "the tenant comes from the configured claim"
    );

    let err = auth.authenticate(&sign_hs256(&default_only, SECRET)).await.unwrap_err();
    assert_eq!(err.kind(), "bad_claims", "the default `tenant` claim is not consulted");
}

#[tokio::test]
async fn scopes_from_scope_and_scp() {
    let clock = clock();
    let auth = authenticator(&hs_config(), &clock).await;
    let cases: Vec<(Value, Vec<&str>, &str)> = vec![
        (json!({"scope": "fold:read"}), vec!["fold:read"], "scope string"),
        (json!({"scope": "fold:read fold:write"}), vec!["fold:read", "fold:write"], "two in scope"),
        (json!({"scope": null, "scp": ["fold:write"]}), vec!["fold:write"], "scp array"),
        (
            json!({"scope": null, "scp": "fold:read fold:write"}),
            vec!["fold:read", "fold:write"],
            "scp string",
        ),
        (
            json!({"scope": "fold:read", "scp": ["fold:write"]}),
            vec!["fold:read", "fold:write"],
            "both",
        ),
        (json!({"scope": null}), vec![], "none"),
        (json!({"scope": ""}), vec![], "empty string"),
    ];
    for (changes, expected, why) in cases {
        let token = sign_hs256(&patch(claims(&clock), &changes), SECRET);
        let auth = auth.authenticate(&token).await.unwrap();
        assert_eq!(auth.scopes.iter().map(String::as_str).collect::<Vec<_>>(), expected, "{why}");
    }
}

#[tokio::test]
async fn leeway_is_honoured_on_the_injected_clock() {
    let clock = clock();
    let config = AuthConfig { leeway: Duration::from_secs(30), ..hs_config() };
    let auth = authenticator(&config, &clock).await;
    let t = now(&clock);
    let expiring = sign_hs256(&patch(claims(&clock), &json!({"exp": t + 10})), SECRET);
    let future = sign_hs256(&patch(claims(&clock), &json!({"nbf": t + 20})), SECRET);

    assert!(auth.authenticate(&future).await.is_ok(), "nbf 20 s ahead is within 30 s of leeway");
    assert!(auth.authenticate(&expiring).await.is_ok(), "fresh token");

    clock.advance(Duration::from_secs(35));
    assert!(auth.authenticate(&expiring).await.is_ok(), "expired 25 s ago: within the leeway");

    clock.advance(Duration::from_secs(6));
    let err = auth.authenticate(&expiring).await.unwrap_err();
    assert_eq!(err.kind(), "expired", "expired 31 s ago: beyond the leeway");

    let strict = authenticator(&AuthConfig { leeway: Duration::ZERO, ..hs_config() }, &clock).await;
    let err = strict.authenticate(&future).await;
    assert!(err.is_ok(), "nbf has passed by now");
    let ahead = sign_hs256(&patch(claims(&clock), &json!({"nbf": now(&clock) + 1})), SECRET);
    assert_eq!(kind(&strict.authenticate(&ahead).await), Err("not_yet_valid"), "no leeway");
}

#[tokio::test]
async fn minted_tokens_verify() {
    let clock = ManualClock::starting_now();
    let auth = authenticator(&hs_config(), &clock).await;
    let secret = Secret::new(SECRET);
    let tenant = TenantId::parse("acme").unwrap();
    let subject = Subject::parse("dev").unwrap();

    let token = mint_hs256(
        &secret,
        &tenant,
        &subject,
        [SCOPE_READ],
        Duration::from_secs(3600),
        Some(ISSUER),
        Some(AUDIENCE),
    )
    .unwrap();
    let ok = auth.authenticate(&token).await.unwrap();
    assert_eq!(ok.principal.tenant, tenant);
    assert_eq!(ok.principal.subject, subject);
    assert!(ok.has_scope(SCOPE_READ) && !ok.has_scope(SCOPE_WRITE));

    let no_audience = mint_hs256(
        &secret,
        &tenant,
        &subject,
        [SCOPE_READ],
        Duration::from_secs(60),
        Some(ISSUER),
        None,
    )
    .unwrap();
    assert_eq!(kind(&auth.authenticate(&no_audience).await), Err("wrong_audience"));

    let refusals: Vec<(Result<String, MintError>, &str)> = vec![
        (
            mint_hs256(
                &Secret::new("short"),
                &tenant,
                &subject,
                [SCOPE_READ],
                Duration::from_secs(60),
                None,
                None,
            ),
            "weak secret",
        ),
        (
            mint_hs256(
                &secret,
                &tenant,
                &subject,
                ["fold:read fold:write"],
                Duration::from_secs(60),
                None,
                None,
            ),
            "scope with a space",
        ),
        (
            mint_hs256(&secret, &tenant, &subject, [""], Duration::from_secs(60), None, None),
            "empty scope",
        ),
        (
            mint_hs256(&secret, &tenant, &subject, [SCOPE_READ], Duration::ZERO, None, None),
            "zero ttl",
        ),
    ];
    for (result, why) in refusals {
        assert!(result.is_err(), "{why}");
    }
}
