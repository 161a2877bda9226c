//! A cached JSON Web Key Set.
//!
//! The set is fetched at startup (a failure there is logged, not fatal) and
//! again when a token names a key the cache does not hold, which is how a
//! key rotated in at the identity provider becomes usable. Every fetch, for
//! whatever reason, counts against one minimum interval: a flood of tokens
//! with made-up `kid`s costs the provider at most one request per interval.
//! Keys older than the maximum age are refreshed in the background while the
//! cached ones keep serving, so that a withdrawn key stops being accepted.
//!
//! The set is found either at a configured URL or through the issuer's
//! discovery document ([`discovery`](super::discovery)), which is read
//! before the first fetch, again with every refresh for age (so that a
//! provider that moves its key set is followed), and again after a failed
//! fetch.

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use foldgate_background::{
    Activation, Activator, BackgroundTask, BoxFuture, Driver, OnStop, StopOrder, TaskDef,
};
use foldgate_domain::Clock;
use jsonwebtoken::{
    Algorithm, AlgorithmFamily, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse},
};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

use super::{AuthConfig, AuthError, AuthSetupError, KeySourceError, discovery};

/// Largest JWKS document read; real ones are a few kilobytes.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Most keys tried for one token that does not say which key signed it.
const MAX_CANDIDATES: usize = 8;

/// How the key set is fetched and cached.
#[derive(Debug, Clone)]
pub(crate) struct JwksSettings {
    pub location: Location,
    pub timeout: Duration,
    pub min_refresh: TimeDelta,
    pub max_age: TimeDelta,
}

/// Where the key set is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A configured `jwks_url`.
    Url(String),
    /// The `jwks_uri` of the issuer's discovery document; `allow_http`
    /// accepts plain http on any host for both.
    Discovery { issuer: String, allow_http: bool },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(url) => write!(f, "the JWKS at {url}"),
            Self::Discovery { issuer, .. } => write!(f, "the JWKS of {issuer} (by discovery)"),
        }
    }
}

fn delta(value: Duration) -> TimeDelta {
    TimeDelta::from_std(value).unwrap_or(TimeDelta::MAX)
}

impl JwksSettings {
    pub(crate) fn from_config(location: Location, config: &AuthConfig) -> Self {
        Self {
            location,
            timeout: config.jwks_timeout,
            min_refresh: delta(config.jwks_min_refresh_interval),
            max_age: delta(config.jwks_max_age),
        }
    }
}

/// One usable verification key of the set.
struct JwksKey {
    kid: Option<String>,
    /// The algorithms this key may verify: fixed by its type and curve,
    /// narrowed to one when the key declares its `alg`.
    algorithms: Vec<Algorithm>,
    key: Arc<DecodingKey>,
}

/// The keys of one successful fetch.
#[derive(Default)]
struct KeySet {
    keys: Vec<JwksKey>,
    fetched_at: Option<DateTime<Utc>>,
    /// Bumped by every successful fetch, so that a request that waited for
    /// another one's fetch can tell that the set changed.
    generation: u64,
}

/// What the cache holds for a token's `kid` and `alg`.
enum Lookup {
    Found(Vec<Arc<DecodingKey>>),
    /// The `kid` names a key of another type than the token's `alg`.
    WrongAlgorithm,
    Missing,
}

impl KeySet {
    fn lookup(&self, alg: Algorithm, kid: Option<&str>) -> Lookup {
        let fits = |k: &&JwksKey| k.algorithms.contains(&alg);
        let chosen: Vec<Arc<DecodingKey>> = match kid {
            Some(kid) if self.keys.iter().any(|k| k.kid.is_some()) => {
                let named: Vec<&JwksKey> =
                    self.keys.iter().filter(|k| k.kid.as_deref() == Some(kid)).collect();
                if !named.is_empty() && !named.iter().any(fits) {
                    return Lookup::WrongAlgorithm;
                }
                named.into_iter().filter(|k| fits(k)).map(|k| Arc::clone(&k.key)).collect()
            }
            // A token without `kid`, or a provider that publishes no `kid`s:
            // any key of the right type may have signed it.
            _ => self
                .keys
                .iter()
                .filter(fits)
                .take(MAX_CANDIDATES)
                .map(|k| Arc::clone(&k.key))
                .collect(),
        };
        if chosen.is_empty() { Lookup::Missing } else { Lookup::Found(chosen) }
    }
}

/// The last fetch attempt, kept under the lock that serialises fetches.
#[derive(Default)]
struct FetchState {
    last_attempt: Option<DateTime<Utc>>,
    /// Why the last attempt failed; cleared by a successful one.
    last_error: Option<Arc<KeySourceError>>,
    /// With discovery: the `jwks_uri` the discovery document named last.
    discovered: Option<String>,
}

impl FetchState {
    /// How long until the next fetch is allowed, if it is not allowed now.
    fn wait(&self, now: DateTime<Utc>, min_refresh: TimeDelta) -> Option<Duration> {
        let next = self.last_attempt? + min_refresh;
        (next > now).then(|| (next - now).to_std().unwrap_or(Duration::ZERO))
    }
}

/// The cached key set of one JWKS URL.
pub(crate) struct Jwks {
    settings: JwksSettings,
    client: reqwest::Client,
    clock: Arc<dyn Clock>,
    /// The keys in use, replaced whole by each successful fetch. Read on
    /// every request, so never held across an await.
    keys: RwLock<Arc<KeySet>>,
    /// Held while fetching, so that concurrent requests for an unknown key
    /// wait for one fetch instead of starting their own.
    fetch: Arc<Mutex<FetchState>>,
    /// Asks the background refresh ([`JwksRefresh`]) for a fetch.
    refresh: Activator,
}

impl fmt::Debug for Jwks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jwks")
            .field("location", &self.settings.location)
            .field("keys", &self.snapshot().keys.len())
            .finish_non_exhaustive()
    }
}

impl Jwks {
    pub(crate) fn new(
        settings: JwksSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, AuthSetupError> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .build()
            .map_err(AuthSetupError::HttpClient)?;
        Ok(Arc::new(Self {
            settings,
            client,
            clock,
            keys: RwLock::new(Arc::default()),
            fetch: Arc::new(Mutex::new(FetchState::default())),
            refresh: Activator::new(),
        }))
    }

    /// The first fetch, at startup. A failure is logged and retried when a
    /// token needs the keys.
    pub(crate) async fn warm_up(&self) {
        let mut state = self.fetch.lock().await;
        // Already logged; requests report it as `Unavailable`.
        let _failed = self.fetch_locked(&mut state, false).await;
    }

    fn snapshot(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The keys that may have signed a token with this `alg` and `kid`.
    pub(crate) async fn keys_for(
        self: &Arc<Self>,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Vec<Arc<DecodingKey>>, AuthError> {
        let seen = self.snapshot();
        match seen.lookup(alg, kid) {
            Lookup::Found(keys) => {
                self.refresh_if_stale(&seen);
                return Ok(keys);
            }
            Lookup::WrongAlgorithm => return Err(AuthError::UnsupportedAlgorithm),
            Lookup::Missing => {}
        }

        let mut state = self.fetch.lock().await;
        // While this request waited for the lock, another may have fetched.
        let latest = self.snapshot();
        if latest.generation != seen.generation {
            match latest.lookup(alg, kid) {
                Lookup::Found(keys) => return Ok(keys),
                Lookup::WrongAlgorithm => return Err(AuthError::UnsupportedAlgorithm),
                Lookup::Missing => {}
            }
        }
        if let Some(retry_after) = state.wait(self.clock.now(), self.settings.min_refresh) {
            return Err(match &state.last_error {
                Some(source) => AuthError::Unavailable { retry_after, source: Arc::clone(source) },
                None => AuthError::UnknownKey,
            });
        }
        match self.fetch_locked(&mut state, false).await {
            Ok(fresh) => match fresh.lookup(alg, kid) {
                Lookup::Found(keys) => Ok(keys),
                Lookup::WrongAlgorithm => Err(AuthError::UnsupportedAlgorithm),
                Lookup::Missing => Err(AuthError::UnknownKey),
            },
            Err(source) => Err(AuthError::Unavailable {
                retry_after: self.settings.min_refresh.to_std().unwrap_or(Duration::ZERO),
                source,
            }),
        }
    }

    /// Asks for a background refresh when the cached keys are past their
    /// maximum age, unless a fetch is running or was attempted too recently.
    fn refresh_if_stale(&self, seen: &KeySet) {
        if self.stale(seen) {
            self.refresh.activate();
        }
    }

    /// Whether the keys `seen` are past their maximum age and a fetch may
    /// start now.
    fn stale(&self, seen: &KeySet) -> bool {
        let now = self.clock.now();
        let Some(fetched_at) = seen.fetched_at else { return false };
        if now - fetched_at < self.settings.max_age {
            return false;
        }
        self.fetch
            .try_lock()
            .is_ok_and(|state| state.wait(now, self.settings.min_refresh).is_none())
    }

    /// Registers the background refresh, named `name` (`jwks_refresh`, or
    /// `jwks_refresh:<issuer>` with several issuers): activated when a
    /// request finds the cached keys stale. It stops with the tasks serving
    /// requests, dropping a fetch in flight.
    pub(crate) fn register(self: &Arc<Self>, driver: &mut Driver, name: String) {
        let def = TaskDef::new(name, StopOrder::SERVING)
            .trigger(self.refresh.clone())
            .on_stop(OnStop::Abandon);
        driver.register(def, JwksRefresh(Arc::clone(self)));
    }

    /// One background refresh: fetches the set if it is still stale and no
    /// fetch is running, reading the discovery document first when there is
    /// one. A failure is logged, and the cached keys keep serving.
    async fn refresh_stale(&self) -> Activation {
        let seen = self.snapshot();
        if !self.stale(&seen) {
            return Activation::ok(json!({"fetched": false, "keys": seen.keys.len()}));
        }
        let Ok(mut state) = self.fetch.try_lock() else {
            return Activation::ok(json!({"fetched": false, "keys": seen.keys.len()}));
        };
        match self.fetch_locked(&mut state, true).await {
            Ok(fresh) => Activation::ok(json!({"fetched": true, "keys": fresh.keys.len()})),
            Err(e) => Activation::failed(ErrorChain(&*e), json!({"fetched": false})),
        }
    }

    /// Fetches the set and, on success, installs it. The caller holds the
    /// fetch lock. With discovery, the discovery document is read first when
    /// `rediscover` asks for it, when none was read yet, or when the last
    /// attempt failed.
    async fn fetch_locked(
        &self,
        state: &mut FetchState,
        rediscover: bool,
    ) -> Result<Arc<KeySet>, Arc<KeySourceError>> {
        let now = self.clock.now();
        state.last_attempt = Some(now);
        let fetched = match self.key_set_url(state, rediscover).await {
            Ok(url) => self.download(&url).await.map(|keys| (url, keys)),
            Err(e) => Err(e),
        };
        match fetched {
            Ok((url, keys)) => {
                let mut current = self.keys.write().unwrap_or_else(PoisonError::into_inner);
                let fresh = Arc::new(KeySet {
                    keys,
                    fetched_at: Some(now),
                    generation: current.generation + 1,
                });
                *current = Arc::clone(&fresh);
                drop(current);
                state.last_error = None;
                tracing::debug!(%url, keys = fresh.keys.len(), "JWKS fetched");
                Ok(fresh)
            }
            Err(e) => {
                tracing::warn!(
                    source = %self.settings.location,
                    error = %ErrorChain(&e),
                    "fetching the JWKS failed; tokens needing a new key are refused with 503 \
                     until a fetch succeeds"
                );
                let e = Arc::new(e);
                state.last_error = Some(Arc::clone(&e));
                Err(e)
            }
        }
    }

    /// The URL to fetch the set from: the configured one, or the one the
    /// discovery document names (read again when asked to, or when the last
    /// attempt failed, in case the provider moved its set).
    async fn key_set_url(
        &self,
        state: &mut FetchState,
        rediscover: bool,
    ) -> Result<String, KeySourceError> {
        let (issuer, allow_http) = match &self.settings.location {
            Location::Url(url) => return Ok(url.clone()),
            Location::Discovery { issuer, allow_http } => (issuer, *allow_http),
        };
        if let Some(known) = &state.discovered
            && !rediscover
            && state.last_error.is_none()
        {
            return Ok(known.clone());
        }
        let found = discovery::discover(&self.client, issuer, allow_http).await?;
        if let Some(previous) = &state.discovered
            && *previous != found
        {
            tracing::info!(%issuer, from = %previous, to = %found, "the issuer moved its JWKS");
        }
        state.discovered = Some(found.clone());
        Ok(found)
    }

    /// Fetches the key set once, keeping nothing (for `check-config
    /// --connect`): where it was, and how many usable signing keys it has.
    pub(crate) async fn usable_keys(&self) -> Result<(String, usize), KeySourceError> {
        let url = self.key_set_url(&mut FetchState::default(), true).await?;
        let keys = self.download(&url).await?;
        Ok((url, keys.len()))
    }

    async fn download(&self, url: &str) -> Result<Vec<JwksKey>, KeySourceError> {
        let body = get_limited(&self.client, url, MAX_JWKS_BYTES).await.map_err(|e| match e {
            Fetch::Http(e) => KeySourceError::Http(e),
            Fetch::Status(status) => KeySourceError::Status(status),
            Fetch::TooLarge => KeySourceError::TooLarge { limit: MAX_JWKS_BYTES },
        })?;
        parse_key_set(&body)
    }
}

/// Why a document could not be fetched.
pub(crate) enum Fetch {
    Http(reqwest::Error),
    Status(http::StatusCode),
    TooLarge,
}

/// GETs a JSON document of at most `limit` bytes.
pub(crate) async fn get_limited(
    client: &reqwest::Client,
    url: &str,
    limit: usize,
) -> Result<Vec<u8>, Fetch> {
    let mut response = client
        .get(url)
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(Fetch::Http)?;
    let status = response.status();
    if !status.is_success() {
        return Err(Fetch::Status(status));
    }
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(Fetch::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(Fetch::Http)? {
        if body.len() + chunk.len() > limit {
            return Err(Fetch::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The background refresh of the key set.
#[derive(Debug)]
struct JwksRefresh(Arc<Jwks>);

impl BackgroundTask for JwksRefresh {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(self.0.refresh_stale())
    }
}

/// Formats an error with its sources, for one log line.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct RawKeySet {
    keys: Vec<serde_json::Value>,
}

/// Reads a JWKS document, keeping the keys that can verify signatures.
/// Keys of unknown types are skipped one by one rather than failing the set,
/// so that a provider adding a new key type does not lock everyone out.
fn parse_key_set(body: &[u8]) -> Result<Vec<JwksKey>, KeySourceError> {
    let raw: RawKeySet = serde_json::from_slice(body).map_err(KeySourceError::Json)?;
    let keys: Vec<JwksKey> = raw.keys.into_iter().filter_map(usable_key).collect();
    if keys.is_empty() {
        return Err(KeySourceError::NoUsableKeys);
    }
    Ok(keys)
}

/// Each usable key of a JWKS document, its `kid` and algorithms: for the
/// fuzz targets in `fuzz/` (built with `--cfg fuzzing`).
#[cfg(fuzzing)]
pub(crate) fn key_summaries(
    body: &[u8],
) -> Result<Vec<(Option<String>, Vec<Algorithm>)>, KeySourceError> {
    parse_key_set(body).map(|keys| keys.into_iter().map(|k| (k.kid, k.algorithms)).collect())
}

fn usable_key(raw: serde_json::Value) -> Option<JwksKey> {
    let jwk: Jwk = serde_json::from_value(raw).ok()?;
    if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != PublicKeyUse::Signature) {
        return None;
    }
    if jwk.common.key_operations.as_ref().is_some_and(|ops| !ops.contains(&KeyOperations::Verify)) {
        return None;
    }
    let mut algorithms: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => AlgorithmFamily::Rsa.algorithms().to_vec(),
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        // Symmetric keys never come from a published key set: anyone who
        // can read it could sign tokens.
        _ => return None,
    };
    if let Some(declared) = jwk.common.key_algorithm {
        let declared = Algorithm::from_str(&declared.to_string()).ok()?;
        if !algorithms.contains(&declared) {
            return None;
        }
        algorithms = vec![declared];
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(JwksKey { kid: jwk.common.key_id, algorithms, key: Arc::new(key) })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const RSA_N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";
    const P256_X: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
    const P256_Y: &str = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";
    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    fn parsed(keys: serde_json::Value) -> Result<Vec<JwksKey>, KeySourceError> {
        parse_key_set(json!({ "keys": keys }).to_string().as_bytes())
    }

    #[test]
    fn keeps_only_signature_keys_of_supported_types() {
        let keys = parsed(json!([
            {"kty": "RSA", "kid": "rsa", "n": RSA_N, "e": "AQAB"},
            {"kty": "RSA", "kid": "rsa-ps", "alg": "PS256", "n": RSA_N, "e": "AQAB"},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": P256_X, "y": P256_Y},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": ED_X},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": RSA_N, "e": "AQAB"},
            {"kty": "RSA", "kid": "wrap", "key_ops": ["wrapKey"], "n": RSA_N, "e": "AQAB"},
            {"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": RSA_N, "e": "AQAB"},
            {"kty": "EC", "kid": "ec-mismatch", "alg": "ES384", "crv": "P-256", "x": P256_X, "y": P256_Y},
            {"kty": "OKP", "kid": "x25519", "crv": "X25519", "x": ED_X},
            {"kty": "ML-DSA", "kid": "future", "pub": "AAAA"},
            "not even an object"
        ]))
        .expect("usable keys remain");
        let summary: Vec<(Option<&str>, &[Algorithm])> =
            keys.iter().map(|k| (k.kid.as_deref(), k.algorithms.as_slice())).collect();
        assert_eq!(
            summary,
            vec![
                (Some("rsa"), AlgorithmFamily::Rsa.algorithms()),
                (Some("rsa-ps"), &[Algorithm::PS256][..]),
                (Some("ec"), &[Algorithm::ES256][..]),
                (Some("ed"), &[Algorithm::EdDSA][..]),
            ],
            "symmetric, encryption, mismatched and unknown keys are skipped"
        );
    }

    #[test]
    fn a_set_without_usable_keys_is_an_error() {
        let cases = [
            (json!({"keys": []}).to_string(), "empty set"),
            (json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}).to_string(), "only symmetric"),
            ("{}".to_owned(), "no keys member"),
            ("<html>".to_owned(), "not JSON"),
        ];
        for (body, why) in cases {
            assert!(parse_key_set(body.as_bytes()).is_err(), "{why}");
        }
    }

    #[test]
    fn lookup_by_kid_and_algorithm() {
        let set = KeySet {
            keys: parsed(json!([
                {"kty": "RSA", "kid": "a", "alg": "RS256", "n": RSA_N, "e": "AQAB"},
                {"kty": "EC", "kid": "b", "crv": "P-256", "x": P256_X, "y": P256_Y},
            ]))
            .expect("keys"),
            fetched_at: None,
            generation: 1,
        };
        let count = |lookup: Lookup| match lookup {
            Lookup::Found(keys) => Some(keys.len()),
            Lookup::WrongAlgorithm => Some(0),
            Lookup::Missing => None,
        };
        let cases = [
            (Algorithm::RS256, Some("a"), Some(1), "kid and alg match"),
            (Algorithm::ES256, Some("b"), Some(1), "EC key by kid"),
            (Algorithm::ES256, Some("a"), Some(0), "kid of an RSA key, EC alg"),
            (Algorithm::RS384, Some("a"), Some(0), "declared alg is RS256 only"),
            (Algorithm::RS256, Some("c"), None, "unknown kid"),
            (Algorithm::ES256, None, Some(1), "no kid: every key of the type"),
            (Algorithm::EdDSA, None, None, "no key of the type"),
        ];
        for (alg, kid, expected, why) in cases {
            assert_eq!(count(set.lookup(alg, kid)), expected, "{why}");
        }
    }

    #[test]
    fn a_provider_without_kids_matches_any_kid() {
        let set = KeySet {
            keys: parsed(json!([{"kty": "EC", "crv": "P-256", "x": P256_X, "y": P256_Y}]))
                .expect("keys"),
            fetched_at: None,
            generation: 1,
        };
        assert!(matches!(set.lookup(Algorithm::ES256, Some("whatever")), Lookup::Found(_)));
        assert!(matches!(set.lookup(Algorithm::ES256, None), Lookup::Found(_)));
    }

    #[test]
    fn the_refresh_interval_counts_from_the_last_attempt() {
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).expect("valid time");
        let interval = TimeDelta::seconds(30);
        let never = FetchState::default();
        assert_eq!(never.wait(t0, interval), None, "first fetch is always allowed");

        let state = FetchState { last_attempt: Some(t0), ..FetchState::default() };
        assert_eq!(state.wait(t0, interval), Some(Duration::from_secs(30)));
        assert_eq!(state.wait(t0 + TimeDelta::seconds(29), interval), Some(Duration::from_secs(1)));
        assert_eq!(state.wait(t0 + interval, interval), None);
    }
}
