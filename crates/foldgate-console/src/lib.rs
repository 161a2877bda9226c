//! The web console, under `/console` on the MCP listener: the front end
//! built from `console/` (a Preact application) and embedded in the binary
//! at compile time, so that `cargo build` needs no Node toolchain and the
//! gateway serves the console with no files beside it.
//!
//! - `/console` redirects to `/console/`, which is `index.html`;
//! - `/console/<file>` is the built file (`assets/…` are fingerprinted by
//!   content and cached for a year; the rest revalidate every time, with an
//!   ETag);
//! - any other path under `/console/` without a file extension is
//!   `index.html` too, so that the console's own links (`/console/session?…`)
//!   load it; a missing file is a 404.
//!
//! - `/console/config.json` tells the page how operators sign in: with a
//!   pasted token only, or also with the deployment's OpenID Connect
//!   provider (see [`oidc`]).
//!
//! Every answer carries a strict `Content-Security-Policy` (scripts, styles
//! and requests from this origin only, no inline script; with sign-in at a
//! provider, requests to its origins too), `nosniff`, no framing and no
//! referrer. The page itself is public: it holds no data, and it calls the
//! admin API with the token the operator pastes or the provider issues.

pub mod oidc;

use std::sync::Arc;

use axum::{
    Router,
    body::Body,
    extract::{OriginalUri, State},
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
pub use oidc::{ConsoleConfig, OidcSignIn, OidcToken};

/// Where the console is mounted (the front end is built for this base).
pub const PREFIX: &str = "/console";

/// The policy every answer carries. The console's scripts and styles are
/// files of this origin; it reads the admin API of this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; font-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The policy every answer carries: [`CONTENT_SECURITY_POLICY`] as it is
/// without sign-in at a provider; with it, the page may also connect to the
/// provider's origins (discovery and the code exchange run in the browser).
pub fn content_security_policy(sign_in: Option<&OidcSignIn>) -> String {
    match sign_in {
        Some(sign_in) if !sign_in.connect_origins.is_empty() => CONTENT_SECURITY_POLICY.replacen(
            "connect-src 'self'",
            &format!("connect-src 'self' {}", sign_in.connect_origins.join(" ")),
            1,
        ),
        _ => CONTENT_SECURITY_POLICY.to_owned(),
    }
}

/// Fingerprinted files: their names change with their content.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// Everything else: kept, but checked with the gateway before each use.
const REVALIDATE: &str = "no-cache";

/// One built file.
#[derive(Debug)]
struct Asset {
    /// Relative to the console's base, `/`-separated: `index.html`,
    /// `assets/index-Cpgn4Crr.js`.
    path: &'static str,
    body: &'static [u8],
    /// A quoted hash of the body.
    etag: &'static str,
}

/// The built front end (`assets/`), listed by `build.rs`.
static FILES: &[Asset] = include!(concat!(env!("OUT_DIR"), "/assets.rs"));

fn find(path: &str) -> Option<&'static Asset> {
    FILES.iter().find(|a| a.path == path)
}

/// What the deployment's settings make of the console: the policy its
/// answers carry and what `/console/config.json` says.
#[derive(Debug)]
struct Served {
    policy: HeaderValue,
    settings: String,
}

/// What `/console/config.json` holds: how operators sign in. Nothing in it
/// is secret (a public client has no secret).
#[derive(serde::Serialize)]
struct PageSettings<'a> {
    oidc: Option<&'a OidcSignIn>,
}

/// The console's routes, under [`PREFIX`] (merged into the gateway's
/// router rather than nested: a nested router's `/` does not answer the
/// prefix with a trailing slash, which is the console's address).
/// `sign_in`: the deployment's OpenID Connect provider, if operators sign
/// in there.
pub fn router<S: Clone + Send + Sync + 'static>(sign_in: Option<OidcSignIn>) -> Router<S> {
    let policy = content_security_policy(sign_in.as_ref());
    let served = Served {
        // Origins are ASCII serializations and the rest is constant.
        policy: HeaderValue::from_str(&policy)
            .unwrap_or_else(|_| HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        settings: serde_json::to_string(&PageSettings { oidc: sign_in.as_ref() })
            .unwrap_or_else(|_| "{\"oidc\":null}".to_owned()),
    };
    Router::new()
        .route(PREFIX, get(root))
        .route(&format!("{PREFIX}/"), get(root))
        .route(&format!("{PREFIX}/config.json"), get(settings))
        .route(&format!("{PREFIX}/{{*path}}"), get(file))
        .with_state(Arc::new(served))
}

/// `/console/` is the page; `/console` redirects there, so that the page's
/// relative URLs resolve under the base.
async fn root(
    State(served): State<Arc<Served>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Response {
    let response =
        if uri.path().ends_with('/') { serve_index(&headers) } else { redirect_to_slash(&uri) };
    secure(response, &served)
}

async fn file(
    State(served): State<Arc<Served>>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let response = if let Some(asset) = find(&path).filter(|_| path != "index.html") {
        serve(asset, &headers)
    } else if path == "index.html" || is_page(&path) {
        serve_index(&headers)
    } else {
        not_found()
    };
    secure(response, &served)
}

/// `/console/config.json`: how operators sign in, read by the page when
/// it loads. Checked with the gateway each time (a deployment may change
/// it).
async fn settings(State(served): State<Arc<Served>>) -> Response {
    let mut response = Response::new(Body::from(served.settings.clone()));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(REVALIDATE));
    secure(response, &served)
}

/// Whether a path names a page of the console rather than a file: it is not
/// under `assets/` and its last segment has no extension.
fn is_page(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or(path);
    !path.starts_with("assets/") && !last.contains('.')
}

fn serve_index(headers: &HeaderMap) -> Response {
    match find("index.html") {
        Some(index) => serve(index, headers),
        None => not_found(),
    }
}

fn serve(asset: &'static Asset, request: &HeaderMap) -> Response {
    let cache = if asset.path.starts_with("assets/") { IMMUTABLE } else { REVALIDATE };
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').map(str::trim).any(|tag| tag == asset.etag || tag == "*"));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = Response::new(Body::from(asset.body));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(asset.path)));
        response
    };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::ETAG, HeaderValue::from_static(asset.etag));
    response
}

fn redirect_to_slash(uri: &Uri) -> Response {
    let target = match uri.query() {
        Some(q) => format!("{}/?{q}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
    if let Ok(location) = HeaderValue::from_str(&target) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

fn not_found() -> Response {
    let mut response = (StatusCode::NOT_FOUND, "not found\n").into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(REVALIDATE));
    response
}

/// The headers every answer of the console carries.
fn secure(mut response: Response, served: &Served) -> Response {
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, served.policy.clone());
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    response
}

/// The media type of a built file, by its extension.
fn content_type(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map_or("", |(_, e)| e);
    match extension {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use axum::{body::to_bytes, http::Request};
    use tower::ServiceExt;

    use super::*;

    /// Mounted as the gateway mounts it.
    fn app() -> Router {
        app_with(None)
    }

    fn app_with(sign_in: Option<OidcSignIn>) -> Router {
        Router::new().merge(router(sign_in)).route("/healthz", get(|| async { "ok" }))
    }

    async fn get_path(path: &str, headers: &[(&str, &str)]) -> Response {
        get_from(app(), path, headers).await
    }

    async fn get_from(app: Router, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        app.oneshot(request.body(Body::empty()).unwrap()).await.unwrap()
    }

    /// Sign-in at a provider whose token endpoint is on another origin.
    fn provider() -> OidcSignIn {
        ConsoleConfig {
            oidc_client_id: Some("foldgate-console".into()),
            oidc_connect_origins: vec!["https://oauth2.idp.example".into()],
            ..ConsoleConfig::default()
        }
        .sign_in(Some("https://idp.example/realms/ops"))
        .unwrap()
        .unwrap()
    }

    fn header_of<'a>(response: &'a Response, name: &str) -> &'a str {
        response.headers().get(name).map_or("", |v| v.to_str().unwrap())
    }

    async fn text(response: Response) -> String {
        String::from_utf8(to_bytes(response.into_body(), 1 << 22).await.unwrap().to_vec()).unwrap()
    }

    fn built(extension: &str) -> &'static Asset {
        FILES.iter().find(|a| a.path.starts_with("assets/") && a.path.ends_with(extension)).unwrap()
    }

    fn assert_secured(response: &Response) {
        assert_eq!(header_of(response, "content-security-policy"), CONTENT_SECURITY_POLICY);
        assert_eq!(header_of(response, "x-content-type-options"), "nosniff");
        assert_eq!(header_of(response, "x-frame-options"), "DENY");
        assert_eq!(header_of(response, "referrer-policy"), "no-referrer");
    }

    #[test]
    fn the_build_is_embedded_and_the_page_loads_only_files_of_its_own() {
        let index = std::str::from_utf8(find("index.html").unwrap().body).unwrap();
        for asset in [built(".js"), built(".css")] {
            assert!(
                index.contains(&format!("{PREFIX}/{}", asset.path)),
                "{} not in index",
                asset.path
            );
        }
        // No inline script and nothing from elsewhere.
        assert!(!index.contains("<script>") && !index.contains("<style"));
        assert!(!index.contains("http://") && !index.contains("https://"));
    }

    #[tokio::test]
    async fn the_bare_prefix_redirects_to_the_slash_keeping_the_query() {
        let response = get_path("/console", &[]).await;
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header_of(&response, "location"), "/console/");
        assert_secured(&response);
        let response = get_path("/console?x=1", &[]).await;
        assert_eq!(header_of(&response, "location"), "/console/?x=1");
    }

    #[tokio::test]
    async fn the_index_is_html_revalidated_every_time() {
        for path in ["/console/", "/console/index.html"] {
            let response = get_path(path, &[]).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(header_of(&response, "content-type"), "text/html; charset=utf-8");
            assert_eq!(header_of(&response, "cache-control"), "no-cache");
            assert_secured(&response);
            assert!(text(response).await.contains("<div id=\"app\">"));
        }
    }

    #[tokio::test]
    async fn built_files_have_their_types_and_fingerprinted_ones_are_immutable() {
        for (asset, kind) in [
            (built(".js"), "text/javascript; charset=utf-8"),
            (built(".css"), "text/css; charset=utf-8"),
        ] {
            let response = get_path(&format!("/console/{}", asset.path), &[]).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(header_of(&response, "content-type"), kind);
            assert_eq!(header_of(&response, "cache-control"), IMMUTABLE);
            assert_secured(&response);
            assert_eq!(to_bytes(response.into_body(), 1 << 22).await.unwrap(), asset.body);
        }
        let icon = get_path("/console/favicon.svg", &[]).await;
        assert_eq!(header_of(&icon, "content-type"), "image/svg+xml");
        assert_eq!(header_of(&icon, "cache-control"), "no-cache");
    }

    #[tokio::test]
    async fn pages_of_the_console_fall_back_to_the_index() {
        for path in ["/console/session?tenant=a&id=s1", "/console/audit", "/console/a/b/c/"] {
            let response = get_path(path, &[]).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(header_of(&response, "content-type"), "text/html; charset=utf-8");
            assert_eq!(header_of(&response, "cache-control"), "no-cache");
            assert_secured(&response);
        }
    }

    #[tokio::test]
    async fn missing_files_are_not_found_never_the_page() {
        for path in ["/console/assets/index-gone.js", "/console/assets/x", "/console/app.js"] {
            let response = get_path(path, &[]).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
            assert_secured(&response);
        }
        // Outside the prefix the console answers nothing.
        assert_eq!(get_path("/consoles", &[]).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(get_path("/healthz", &[]).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_known_etag_is_not_modified() {
        let first = get_path("/console/", &[]).await;
        let etag = header_of(&first, "etag").to_owned();
        assert!(etag.starts_with('"') && etag.len() == 18, "{etag}");
        let again = get_path("/console/", &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(header_of(&again, "etag"), etag);
        assert_secured(&again);
        assert!(text(again).await.is_empty());
        let other = get_path("/console/", &[("if-none-match", "\"0\"")]).await;
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn only_reads_are_answered() {
        let response =
            app().oneshot(Request::post("/console/").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn without_a_provider_the_policy_allows_this_origin_alone() {
        assert_eq!(content_security_policy(None), CONTENT_SECURITY_POLICY);
        assert!(CONTENT_SECURITY_POLICY.contains("connect-src 'self';"));
        let response = get_path("/console/config.json", &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header_of(&response, "content-type"), "application/json");
        assert_eq!(header_of(&response, "cache-control"), "no-cache");
        assert_secured(&response);
        assert_eq!(text(response).await, r#"{"oidc":null}"#);
    }

    #[tokio::test]
    async fn with_a_provider_the_page_may_reach_its_origins_and_nothing_else_changes() {
        let expected = CONTENT_SECURITY_POLICY.replace(
            "connect-src 'self';",
            "connect-src 'self' https://idp.example https://oauth2.idp.example;",
        );
        assert_eq!(content_security_policy(Some(&provider())), expected);
        for path in [
            "/console",
            "/console/",
            "/console/callback?code=c&state=s",
            "/console/config.json",
            "/console/gone.js",
        ] {
            let response = get_from(app_with(Some(provider())), path, &[]).await;
            assert_eq!(header_of(&response, "content-security-policy"), expected, "{path}");
            assert_eq!(header_of(&response, "x-frame-options"), "DENY", "{path}");
        }
        let response = get_from(app_with(Some(provider())), "/console/config.json", &[]).await;
        let settings: serde_json::Value = serde_json::from_str(&text(response).await).unwrap();
        assert_eq!(
            settings,
            serde_json::json!({"oidc": {
                "issuer": "https://idp.example/realms/ops",
                "client_id": "foldgate-console",
                "scopes": ["openid", "foldgate:admin", "tenant:admin"],
                "token": "access_token",
                "connect_origins": ["https://idp.example", "https://oauth2.idp.example"],
            }})
        );
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("assets/a.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("assets/a.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("favicon.svg"), "image/svg+xml");
        assert_eq!(content_type("assets/font.woff2"), "font/woff2");
        assert_eq!(content_type("LICENSE"), "application/octet-stream");
    }
}
