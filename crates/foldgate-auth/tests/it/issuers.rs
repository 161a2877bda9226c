//! Several trusted issuers (`[[auth.issuers]]`), each with its own key
//! source, audience and tenant claim, served on random ports.

use foldgate_auth::IssuerConfig;

use super::{discovery::Idp, *};

const AUDIENCE_A: &str = "https://gw.test/mcp";
const AUDIENCE_B: &str = "api://foldgate";

/// Issuer A by discovery (audience A, tenant in `tenant`), issuer B by its
/// JWKS URL (audience B, tenant in `org`).
fn two_issuers(a: &Idp, b: &Idp) -> AuthConfig {
    AuthConfig {
        issuers: vec![
            IssuerConfig {
                issuer: a.issuer.clone(),
                discovery: true,
                jwks_url: None,
                public_key_file: None,
                jwks_allow_http: false,
                audience: Some(AUDIENCE_A.into()),
                tenant_claim: "tenant".into(),
            },
            IssuerConfig {
                issuer: b.issuer.clone(),
                discovery: false,
                jwks_url: Some(format!("{}/jwks", b.base)),
                public_key_file: None,
                jwks_allow_http: false,
                audience: Some(AUDIENCE_B.into()),
                tenant_claim: "org".into(),
            },
        ],
        ..AuthConfig::default()
    }
}

struct Two {
    a: Idp,
    b: Idp,
    key_a: TestKey,
    key_b: TestKey,
}

impl Two {
    async fn start() -> Self {
        let (key_a, key_b) = (TestKey::p256(), TestKey::ed25519());
        let a = Idp::start("a", vec![key_a.jwk(Some("a-1"))]).await;
        let b = Idp::start("b", vec![key_b.jwk(Some("b-1"))]).await;
        Self { a, b, key_a, key_b }
    }

    /// Claims as issuer A issues them.
    fn claims_a(&self, clock: &ManualClock) -> Value {
        patch(claims(clock), &json!({"iss": self.a.issuer, "aud": AUDIENCE_A, "tenant": "acme"}))
    }

    /// Claims as issuer B issues them: its tenant is in `org`.
    fn claims_b(&self, clock: &ManualClock) -> Value {
        patch(
            claims(clock),
            &json!({"iss": self.b.issuer, "aud": AUDIENCE_B, "tenant": null, "org": "globex"}),
        )
    }

    fn fetches(&self) -> usize {
        self.a.requests().len() + self.b.requests().len()
    }
}

#[tokio::test]
async fn each_issuer_verifies_its_own_tokens_with_its_own_audience_and_tenant_claim() {
    // Arrange
    let clock = clock();
    let two = Two::start().await;
    let auth = authenticator(&two_issuers(&two.a, &two.b), &clock).await;
    assert_eq!(two.a.requests(), [two.a.openid_path(), "/jwks".to_owned()]);
    assert_eq!(two.b.requests(), ["/jwks"]);
    let (a, b) = (two.claims_a(&clock), two.claims_b(&clock));

    // Act and assert: each issuer's own token, and its tenant from its claim.
    let from_a = auth.authenticate(&two.key_a.sign(Some("a-1"), &a)).await.unwrap();
    assert_eq!(from_a.principal.tenant.as_str(), "acme");
    let from_b = auth.authenticate(&two.key_b.sign(Some("b-1"), &b)).await.unwrap();
    assert_eq!(from_b.principal.tenant.as_str(), "globex");

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "issuer A's token with issuer B's audience",
            two.key_a.sign(Some("a-1"), &patch(a.clone(), &json!({"aud": AUDIENCE_B}))),
            "wrong_audience",
        ),
        (
            "issuer B's token with issuer A's audience",
            two.key_b.sign(Some("b-1"), &patch(b.clone(), &json!({"aud": AUDIENCE_A}))),
            "wrong_audience",
        ),
        (
            "issuer B's token with its tenant in A's claim",
            two.key_b.sign(Some("b-1"), &patch(b.clone(), &json!({"org": null, "tenant": "acme"}))),
            "bad_claims",
        ),
        (
            "issuer A's token with its tenant in B's claim",
            two.key_a.sign(Some("a-1"), &patch(a.clone(), &json!({"tenant": null, "org": "acme"}))),
            "bad_claims",
        ),
        (
            "signed with A's key, claiming to be B (A's kid)",
            two.key_a.sign(Some("a-1"), &patch(a.clone(), &json!({"iss": two.b.issuer}))),
            "unknown_key",
        ),
        (
            "signed with A's key, claiming to be B (B's kid)",
            two.key_a.sign(Some("b-1"), &patch(a.clone(), &json!({"iss": two.b.issuer}))),
            "unsupported_algorithm",
        ),
    ];
    for (why, token, expected) in cases {
        assert_eq!(kind(&auth.authenticate(&token).await), Err(expected), "{why}");
    }
}

#[tokio::test]
async fn a_token_of_an_unknown_issuer_is_refused_without_any_fetch() {
    // Arrange: a third server that would record being asked for anything.
    let clock = clock();
    let two = Two::start().await;
    let attacker = Idp::start("evil", vec![two.key_a.jwk(Some("evil"))]).await;
    let auth = authenticator(&two_issuers(&two.a, &two.b), &clock).await;
    let before = two.fetches();
    // Well past the refresh interval: an unknown key could be fetched now.
    clock.advance(Duration::from_secs(3600));
    let base = two.claims_a(&clock);

    let cases: Vec<(&str, String)> = vec![
        (
            "an issuer that serves its own keys",
            two.key_a.sign(Some("evil"), &patch(base.clone(), &json!({"iss": attacker.issuer}))),
        ),
        (
            "an issuer that differs by a trailing slash",
            two.key_a.sign(
                Some("unknown"),
                &patch(base.clone(), &json!({"iss": format!("{}/", two.a.issuer)})),
            ),
        ),
        ("no issuer", two.key_a.sign(Some("unknown"), &patch(base.clone(), &json!({"iss": null})))),
        (
            "an issuer that is not a string",
            two.key_a.sign(Some("unknown"), &patch(base.clone(), &json!({"iss": [two.a.issuer]}))),
        ),
    ];
    for (why, token) in cases {
        // Act
        let err = auth.authenticate(&token).await.unwrap_err();
        // Assert: the same refusal as another issuer in the single form.
        assert_eq!(err.kind(), "wrong_issuer", "{why}");
        assert_eq!(err.status(), StatusCode::UNAUTHORIZED, "{why}");
        assert_eq!(err.reason(), "the token was not issued by an accepted issuer", "{why}");
    }
    assert_eq!(two.fetches(), before, "nothing was fetched from the trusted issuers");
    assert!(attacker.requests().is_empty(), "nor from the issuer the tokens named");
}

#[tokio::test]
async fn an_unknown_issuer_gets_the_same_401_as_any_bad_token() {
    let clock = clock();
    let two = Two::start().await;
    let auth = authenticator(&two_issuers(&two.a, &two.b), &clock).await;
    let state = AuthState::new(AuthMode::Jwt(auth), METADATA_URL);
    let app = Router::new()
        .route("/mcp", post(|| async { "reached" }))
        .layer(from_fn_with_state(state, authenticate_request));
    let unknown = two
        .key_a
        .sign(Some("a-1"), &patch(two.claims_a(&clock), &json!({"iss": "https://evil.test"})));

    let request = Request::post("/mcp")
        .header(header::AUTHORIZATION, format!("Bearer {unknown}"))
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()[header::WWW_AUTHENTICATE].to_str().unwrap().to_owned();
    assert_eq!(
        challenge,
        format!(
            "Bearer resource_metadata=\"{METADATA_URL}\", error=\"invalid_token\", \
             error_description=\"the token was not issued by an accepted issuer\""
        )
    );
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["message"], "the token was not issued by an accepted issuer");
    assert!(!body.to_string().contains("evil"), "the token's issuer is not echoed: {body}");
}

#[tokio::test]
async fn a_remembered_token_stays_with_its_issuer() {
    // Arrange: the verified-token cache on; issuer A's token verified once.
    let clock = clock();
    let two = Two::start().await;
    let auth = authenticator(&two_issuers(&two.a, &two.b), &clock).await;
    let a_token = two.key_a.sign(Some("a-1"), &two.claims_a(&clock));
    let b_token = two.key_b.sign(Some("b-1"), &two.claims_b(&clock));
    assert_eq!(auth.authenticate(&a_token).await.unwrap().principal.tenant.as_str(), "acme");
    assert_eq!(auth.authenticate(&b_token).await.unwrap().principal.tenant.as_str(), "globex");

    // Act: A's signature under a payload naming B (and B's tenant).
    let moved = patch(two.claims_a(&clock), &json!({"iss": two.b.issuer, "org": "globex"}));
    let forged = with_payload(&a_token, &moved);

    // Assert: not the remembered token, so verified, with B's keys.
    assert_eq!(kind(&auth.authenticate(&forged).await), Err("unknown_key"));
    assert_eq!(auth.authenticate(&a_token).await.unwrap().principal.tenant.as_str(), "acme");
    assert_eq!(auth.authenticate(&b_token).await.unwrap().principal.tenant.as_str(), "globex");
}

#[tokio::test]
async fn a_pem_issuer_beside_a_jwks_one() {
    let clock = clock();
    let two = Two::start().await;
    let pem_key = TestKey::p256();
    let file = pem_key.public_key_file();
    let mut config = two_issuers(&two.a, &two.b);
    config.issuers[1] = IssuerConfig {
        issuer: "https://pem.test".into(),
        discovery: false,
        jwks_url: None,
        public_key_file: Some(file.path().to_owned()),
        jwks_allow_http: false,
        audience: Some(AUDIENCE_B.into()),
        tenant_claim: "org".into(),
    };
    let auth = authenticator(&config, &clock).await;
    let pem_claims = patch(two.claims_b(&clock), &json!({"iss": "https://pem.test"}));
    let caller = auth.authenticate(&pem_key.sign(None, &pem_claims)).await.unwrap();
    assert_eq!(caller.principal.tenant.as_str(), "globex");
    assert!(auth.authenticate(&two.key_a.sign(Some("a-1"), &two.claims_a(&clock))).await.is_ok());
    assert_eq!(
        config.authorization_servers(),
        [two.a.issuer.clone(), "https://pem.test".to_owned()],
        "the metadata lists every issuer"
    );
}

#[tokio::test]
async fn check_config_reports_each_issuer() {
    let two = Two::start().await;
    let mut config = two_issuers(&two.a, &two.b);
    let offline = check_key_sources(&config, false).await.unwrap();
    assert_eq!(
        offline.iter().map(|c| c.issuer.clone().unwrap()).collect::<Vec<_>>(),
        [two.a.issuer.clone(), two.b.issuer.clone()]
    );
    assert!(offline.iter().all(|c| c.outcome.as_ref().unwrap().contains("not fetched")));
    assert_eq!(two.fetches(), 0, "nothing is fetched without connect");

    let online = check_key_sources(&config, true).await.unwrap();
    assert_eq!(
        online[0].outcome.as_deref(),
        Ok(format!(
            "the JWKS of {} at {}/jwks (by discovery): 1 usable signing keys",
            two.a.issuer, two.a.base
        )
        .as_str())
    );
    assert_eq!(
        online[1].outcome.as_deref(),
        Ok(format!("the JWKS at {}/jwks: 1 usable signing keys", two.b.base).as_str())
    );

    // One issuer that cannot be used is reported as such, the other still.
    config.issuers[0].issuer = format!("{}/", two.a.issuer);
    let mixed = check_key_sources(&config, true).await.unwrap();
    assert!(mixed[0].outcome.as_ref().unwrap_err().contains("names the issuer"), "{mixed:?}");
    assert!(mixed[1].outcome.is_ok(), "{mixed:?}");
}
