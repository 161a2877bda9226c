//! `foldgate check-config` as a process: what it reports of a valid
//! configuration (never a credential), and how it refuses a bad one.

use std::process::{Command, Output};

const FOLDGATE: &str = env!("CARGO_BIN_EXE_foldgate");

/// Runs `check-config` on `toml` with exactly `env` as the environment.
fn check_config(toml: &str, env: &[(&str, &str)]) -> Output {
    check_config_in(&tempfile::tempdir().unwrap(), toml, env, &[])
}

/// Runs `check-config` in `dir` on `toml`, with `args` added.
fn check_config_in(
    dir: &tempfile::TempDir,
    toml: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let path = dir.path().join("foldgate.toml");
    std::fs::write(&path, toml).unwrap();
    Command::new(FOLDGATE)
        .args(["check-config", "--config"])
        .arg(&path)
        .args(args)
        .current_dir(dir.path())
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A failed check's standard error.
fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "accepted: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn refuses_what_serve_would_refuse_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    // Scrub rules whose regex does not compile.
    std::fs::write(
        dir.path().join("rules.toml"),
        "[[rules]]\nid = \"broken\"\nregex = '''(unclosed'''\n",
    )
    .unwrap();
    let scrub = "[scrub]\nrules_file = \"rules.toml\"\n";
    let stderr = refused(&check_config_in(&dir, scrub, &[], &[]));
    assert!(stderr.contains("scrub") && stderr.contains("broken"), "{stderr}");
    // A public key file that is not there, or holds no public key.
    let missing = "[auth]\npublic_key_file = \"missing.pem\"\n";
    let stderr = refused(&check_config_in(&dir, missing, &[], &[]));
    assert!(stderr.contains("auth") && stderr.contains("missing.pem"), "{stderr}");
    std::fs::write(dir.path().join("not-a-key.pem"), "hello").unwrap();
    let bad = "[auth]\npublic_key_file = \"not-a-key.pem\"\n";
    let stderr = refused(&check_config_in(&dir, bad, &[], &[]));
    assert!(stderr.contains("not-a-key.pem") && stderr.contains("PEM"), "{stderr}");
}

#[test]
fn connect_reaches_the_database_and_the_jwks() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("check.db").display());
    let toml = format!("database_url = \"{db}\"\n");
    // Without --connect nothing is contacted; with it, the schema is checked.
    let out = check_config_in(&dir, &toml, &[], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = refused(&check_config_in(&dir, &toml, &[], &["--connect"]));
    assert!(stderr.contains("check.db") && stderr.contains("migrat"), "{stderr}");
    let migrated =
        Command::new(FOLDGATE).args(["migrate", "--database-url", &db]).output().unwrap();
    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    let out = check_config_in(&dir, &toml, &[], &["--connect"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("reachable, schema current"), "{stdout}");
    // An unreachable database and JWKS are named.
    let away = "database_url = \"postgres://u:hunter2@127.0.0.1:1/db\"\n";
    let stderr = refused(&check_config_in(&dir, away, &[], &["--connect"]));
    assert!(stderr.contains("127.0.0.1:1") && !stderr.contains("hunter2"), "{stderr}");
    let jwks = format!("{toml}[auth]\njwks_url = \"http://127.0.0.1:1/jwks.json\"\n");
    let out = check_config_in(&dir, &jwks, &[], &[]);
    assert!(out.status.success(), "not fetched without --connect");
    let stderr = refused(&check_config_in(&dir, &jwks, &[], &["--connect"]));
    assert!(stderr.contains("JWKS") && stderr.contains("127.0.0.1:1"), "{stderr}");
}

const MODELS: &str = r#"
[[upstreams]]
name = "files"
url = "http://127.0.0.1:9000/mcp"
tenants = ["acme"]
[upstreams.headers]
Authorization = "Bearer ${FILES_TOKEN}"

[[models]]
name = "default"
provider = "openai"
base_url = "http://127.0.0.1:8000/v1"
model = "test-model"
api_key = "${LLM_API_KEY}"
tenants = ["acme", "beta"]

[[models]]
name = "claude"
provider = "anthropic"
base_url = "https://llm:url-password@llm.example.com/v1?key=query-secret"
model = "claude-test"
api_key = "${LLM_API_KEY}"

[[models]]
name = "embed"
provider = "openai"
base_url = "http://127.0.0.1:8000/v1"
model = "embed-model"
embeddings = true
"#;

#[test]
fn names_the_models_and_upstreams_per_tenant_and_never_a_credential() {
    let out = check_config(
        MODELS,
        &[("LLM_API_KEY", "sk-model-key-never-shown"), ("FILES_TOKEN", "files-token-never-shown")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "configuration is valid (database sqlite://foldgate.db)",
            "scrub: built-in rules compile",
            "memory: the injection screen compiles",
            "upstreams: files (http://127.0.0.1:9000/mcp, tenants: acme)",
            "models: default (openai, http://127.0.0.1:8000/v1, model test-model, tenants: acme, beta); \
             claude (anthropic, https://***@llm.example.com/v1?…, model claude-test, every tenant); \
             embed (openai, http://127.0.0.1:8000/v1, model embed-model, embeddings, every tenant)",
            "console: pasted tokens only",
        ],
        "{stdout}"
    );
    for secret in
        ["sk-model-key-never-shown", "files-token-never-shown", "url-password", "query-secret"]
    {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} shown:\n{stdout}{stderr}"
        );
    }
}

#[test]
fn says_when_there_are_no_models_or_upstreams() {
    let out = check_config("", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\nupstreams: none\nmodels: none\n"), "{stdout}");
}

#[test]
fn names_the_provider_operators_sign_in_to_the_console_with() {
    let toml = r#"
[auth]
jwks_url = "https://idp.example.com/jwks"
issuer = "https://idp.example.com/realms/ops"

[console]
oidc_client_id = "foldgate-console"
oidc_resource = "https://foldgate.example.com/mcp"
oidc_connect_origins = ["https://tokens.idp.example.com"]
"#;
    let out = check_config(toml, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().last(),
        Some(
            "console: sign-in with https://idp.example.com/realms/ops (client foldgate-console, \
             scopes openid foldgate:admin tenant:admin, sends the access token, resource \
             https://foldgate.example.com/mcp), or a pasted token; connect-src adds \
             https://idp.example.com https://tokens.idp.example.com"
        ),
        "{stdout}"
    );

    let out = check_config(&toml.replace("issuer = ", "# issuer = "), &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[console] oidc_client_id is set but there is no issuer to sign in with"),
        "{stderr}"
    );
}

#[test]
fn refuses_a_model_whose_key_variable_is_not_set() {
    let out = check_config(MODELS, &[("FILES_TOKEN", "t")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            r#"[[models]] "default": api_key: environment variable LLM_API_KEY is not set"#
        ),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn refuses_an_unknown_provider() {
    let toml = MODELS.replacen(r#"provider = "openai""#, r#"provider = "mistral""#, 1);
    let out = check_config(&toml, &[("LLM_API_KEY", "k"), ("FILES_TOKEN", "t")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("models") && stderr.contains("provider") && stderr.contains("mistral"),
        "{stderr}"
    );
    assert!(stderr.contains("openai") && stderr.contains("anthropic"), "{stderr}");
}

#[test]
fn refuses_a_model_declared_wrongly() {
    let toml = MODELS.replacen("http://127.0.0.1:8000/v1", "ftp://127.0.0.1/v1", 1);
    let out = check_config(&toml, &[("LLM_API_KEY", "k"), ("FILES_TOKEN", "t")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            r#"[[models]] "default": base_url "ftp://127.0.0.1/v1": must be http or https"#
        ),
        "{stderr}"
    );
}

#[test]
fn refuses_an_embeddings_model_that_does_not_speak_openai() {
    let toml = MODELS.replacen(
        "provider = \"openai\"\nbase_url = \"http://127.0.0.1:8000/v1\"\nmodel = \"embed-model\"",
        "provider = \"anthropic\"\nbase_url = \"http://127.0.0.1:8000/v1\"\nmodel = \"embed-model\"",
        1,
    );
    assert_ne!(toml, MODELS);
    let out = check_config(&toml, &[("LLM_API_KEY", "k"), ("FILES_TOKEN", "t")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"[[models]] "embed": embeddings = true needs provider = "openai""#),
        "{stderr}"
    );
    let toml = format!("{MODELS}\n[memory]\nembeddings_timeout_ms = 0\n");
    let out = check_config(&toml, &[("LLM_API_KEY", "k"), ("FILES_TOKEN", "t")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[memory] embeddings_timeout must be from 1ms to 1m, got 0s"),
        "the former name is read, and the message says the new one, with units: {stderr}"
    );
}

/// An identity provider on loopback with two realms: `a`, whose discovery
/// document is its own, and `b`, whose document names another issuer.
/// Returns its base URL.
async fn provider_with_two_realms() -> String {
    use axum::{Json, Router, routing::get};
    use rsa::{RsaPrivateKey, pkcs1::EncodeRsaPrivateKey, pkcs8::LineEnding};
    use serde_json::json;
    let key = RsaPrivateKey::new(&mut rand_core::OsRng, 2048).unwrap();
    let pem = key.to_pkcs1_pem(LineEnding::LF).unwrap();
    let encoding = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
    let jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, jsonwebtoken::Algorithm::RS256)
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let own = json!({"issuer": format!("{base}/realms/a"), "jwks_uri": format!("{base}/certs")});
    let other = json!({"issuer": format!("{base}/realms/c"), "jwks_uri": format!("{base}/certs")});
    let app = Router::new()
        .route("/realms/a/.well-known/openid-configuration", get(move || async { Json(own) }))
        .route("/realms/b/.well-known/openid-configuration", get(move || async { Json(other) }))
        .route("/certs", get(move || async move { Json(json!({"keys": [jwk]})) }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_fetches_each_trusted_issuers_discovery_document_and_keys() {
    let base = provider_with_two_realms().await;
    let (a, b) = (format!("{base}/realms/a"), format!("{base}/realms/b"));
    let toml = format!(
        "[[auth.issuers]]\nissuer = \"{a}\"\ndiscovery = true\n\n\
         [[auth.issuers]]\nissuer = \"{b}\"\ndiscovery = true\ntenant_claim = \"org\"\n"
    );
    let run = |toml: String, args: &'static [&'static str]| {
        tokio::task::spawn_blocking(move || {
            check_config_in(&tempfile::tempdir().unwrap(), &toml, &[], args)
        })
    };

    // Without --connect, each issuer is listed and nothing is fetched.
    let out = run(toml.clone(), &[]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for issuer in [&a, &b] {
        let line = format!(
            "auth: issuer {issuer}: the JWKS of {issuer} (by discovery) (not fetched; --connect \
             fetches the discovery document and the JWKS)"
        );
        assert!(stdout.lines().any(|l| l == line), "{line:?} in {stdout}");
    }

    // With it, issuer b's document is refused, and each issuer is reported.
    let stderr = refused(&run(toml.clone(), &["--connect"]).await.unwrap());
    assert!(stderr.contains("auth: 1 of 2 trusted issuers cannot be used"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "auth: issuer {a}: the JWKS of {a} at {base}/certs (by discovery): 1 usable signing \
             keys"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "auth: issuer {b}: the JWKS of {b} (by discovery): the discovery document \
             {b}/.well-known/openid-configuration names the issuer \"{base}/realms/c\", not \
             \"{b}\""
        )),
        "{stderr}"
    );

    // Issuer a alone passes (with a database that --connect can reach).
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("check.db").display());
    let migrated =
        Command::new(FOLDGATE).args(["migrate", "--database-url", &db]).output().unwrap();
    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    let only_a = format!("database_url = \"{db}\"\n{}", toml.split("\n\n").next().unwrap());
    let out = run(only_a, &["--connect"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("auth: issuer {a}: the JWKS of {a} at {base}/certs")));
}
