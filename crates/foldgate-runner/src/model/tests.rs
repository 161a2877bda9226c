//! Model configuration and provider errors.

use super::*;

#[test]
fn retry_after_is_read_in_seconds_or_milliseconds() {
    let mut h = http::HeaderMap::new();
    assert_eq!(retry_after(&h), None);
    h.insert("retry-after", "3".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
    h.insert("retry-after-ms", "250".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_millis(250)), "the finer one wins");
}

#[test]
fn jitter_stays_within_half() {
    for _ in 0..100 {
        let d = jitter(Duration::from_millis(1_000));
        assert!(d >= Duration::from_millis(500) && d < Duration::from_millis(1_500), "{d:?}");
    }
}

#[test]
fn declarations_are_checked_and_keys_never_print() {
    let good: ModelConfig = toml_like(
        r#"{"name": "default", "provider": "openai", "base_url": "http://127.0.0.1:8000/v1",
            "model": "qwen3-32b", "api_key": "sk-secret"}"#,
    );
    good.validate().unwrap();
    assert_eq!(good.max_output_tokens, 2_048);
    assert_eq!(good.timeout, Duration::from_secs(120));
    assert_eq!(good.endpoint(), "http://127.0.0.1:8000/v1/");
    assert!(!format!("{good:?}").contains("sk-secret"));
    for (bad, why) in [
        (ModelConfig { name: "a b".into(), ..good.clone() }, "name"),
        (ModelConfig { base_url: "ftp://x".into(), ..good.clone() }, "base_url"),
        (ModelConfig { base_url: "not a url".into(), ..good.clone() }, "base_url"),
        (ModelConfig { model: String::new(), ..good.clone() }, "model"),
        (ModelConfig { tenants: Some(Vec::new()), ..good.clone() }, "tenants"),
        (ModelConfig { max_output_tokens: 0, ..good.clone() }, "max_output_tokens"),
        (ModelConfig { timeout: Duration::ZERO, ..good.clone() }, "timeout must be from 1s to 1h"),
        (
            ModelConfig { timeout: Duration::from_secs(3_601), ..good.clone() },
            "timeout must be from 1s to 1h, got 1h 1s",
        ),
        (
            ModelConfig { provider: Provider::Anthropic, embeddings: true, ..good.clone() },
            "embeddings = true needs provider = \"openai\"",
        ),
        (ModelConfig { stream: true, embeddings: true, ..good.clone() }, "stream"),
    ] {
        let err = bad.validate().unwrap_err();
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}

#[test]
fn tenants_see_their_models_first_one_default() {
    let base = ModelConfig {
        name: "a".into(),
        provider: Provider::Openai,
        base_url: "http://127.0.0.1:1/v1".into(),
        model: "m".into(),
        api_key: Some("${KEY}".into()),
        tenants: Some(vec!["acme".into()]),
        max_output_tokens: 100,
        timeout: Duration::from_secs(5),
        stream: false,
        embeddings: false,
    };
    let configs = [
        base.clone(),
        ModelConfig { name: "b".into(), tenants: None, ..base.clone() },
        ModelConfig { name: "e".into(), tenants: None, embeddings: true, ..base.clone() },
    ];
    let models = Models::new(&configs, |v| (v == "KEY").then(|| "k".to_owned())).unwrap();
    let acme = TenantId::parse("acme").unwrap();
    let other = TenantId::parse("other").unwrap();
    assert_eq!(models.for_tenant(&acme, None).unwrap().config.name, "a");
    assert_eq!(models.for_tenant(&other, None).unwrap().config.name, "b");
    assert!(models.for_tenant(&other, Some("a")).is_none(), "not another tenant's model");
    assert!(models.for_tenant(&acme, Some("e")).is_none(), "embeddings do not chat");
    assert_eq!(models.names_for(&acme), ["a", "b"]);
    let missing = Models::new(&configs, |_| None).unwrap_err();
    assert!(missing.contains("api_key"), "{missing}");
    let twice = Models::new(&[base.clone(), base], |_| Some("k".into())).unwrap_err();
    assert!(twice.contains("twice"), "{twice}");
}

#[test]
fn the_first_embeddings_model_serving_a_tenant_serves_its_memory() {
    use foldgate_store::TenantScope;
    let t = |s: &str| TenantId::parse(s).unwrap();
    let base = ModelConfig {
        name: "chat".into(),
        provider: Provider::Openai,
        base_url: "http://127.0.0.1:1/v1".into(),
        model: "gpt".into(),
        api_key: None,
        tenants: None,
        max_output_tokens: 100,
        timeout: Duration::from_secs(5),
        stream: false,
        embeddings: false,
    };
    let embed = |name: &str, model: &str, tenants: Option<&[&str]>| ModelConfig {
        name: name.into(),
        model: model.into(),
        tenants: tenants.map(|list| list.iter().map(|s| (*s).to_owned()).collect()),
        embeddings: true,
        ..base.clone()
    };
    let none = Models::new(std::slice::from_ref(&base), |_| None).unwrap();
    assert!(none.embedder(crate::RunMetrics::noop()).is_none(), "no embeddings model");
    let configs = [
        base.clone(),
        embed("e1", "small", Some(&["acme"])),
        embed("e2", "large", None),
        embed("e3", "never", Some(&["globex"])),
    ];
    let models = Models::new(&configs, |_| None).unwrap();
    let embedder = models.embedder(crate::RunMetrics::noop()).unwrap();
    assert_eq!(embedder.model_for(&t("acme")), Some("small"));
    assert_eq!(embedder.model_for(&t("globex")), Some("large"), "e2 comes before e3");
    assert_eq!(
        embedder.scopes(),
        vec![
            ("small".to_owned(), TenantScope { only: Some(vec![t("acme")]), except: vec![] }),
            ("large".to_owned(), TenantScope { only: None, except: vec![t("acme")] }),
        ],
        "e3 serves no one: e2 serves every tenant before it"
    );
}

fn toml_like(json: &str) -> ModelConfig {
    serde_json::from_str(json).unwrap()
}
