//! What `check-config` checks beyond parsing, and prints of a
//! configuration: names, URLs and tenants, never a credential.
//!
//! Everything `serve` would refuse at startup is refused here: the scrub
//! rules and the memory's injection screen are compiled and the public key
//! file is read. With `--connect`, the database is reached (and its schema
//! checked against this build) and each trusted issuer's discovery document
//! and JWKS fetched.

use anyhow::Context as _;
use foldgate_store::ConnectOptions;

use foldgate_api::upstream::identity::{IdentityMode, Signer};

use crate::config::{AuthMode, Config};

/// Checks what parsing cannot; one line per thing checked, or the first
/// failure, naming what failed.
pub async fn deep_check(config: &Config, connect: bool) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let rules = config.scrub.rules_file.as_ref().map_or_else(
        || "built-in rules".to_owned(),
        |path| format!("built-in rules and {}", path.display()),
    );
    foldgate_engine::scrubber_from_config(&config.scrub)
        .context("scrub: the secret-scrubbing rules do not load")?;
    lines.push(format!("scrub: {rules} compile"));
    if config.memory.enabled {
        config.memory.screen().context("memory: the injection screen does not compile")?;
        lines.push("memory: the injection screen compiles".to_owned());
    }
    if config.auth_mode == AuthMode::Jwt && config.has_key_source() {
        lines.extend(check_auth(config, connect).await?);
    }
    lines.extend(check_identity(config)?);
    if connect {
        let shown = config.database_url.to_string();
        let options = ConnectOptions { max_connections: 1, ..config.connect_options() };
        let store = foldgate_store::connect(&options, false)
            .await
            .with_context(|| format!("database {shown}"))?;
        store.ready().await.with_context(|| format!("database {shown}"))?;
        store.close().await;
        lines.push(format!("database {shown}: reachable, schema current"));
    }
    Ok(lines)
}

/// One line per trusted issuer's key source (`auth: …`, or `auth: issuer
/// <iss>: …` with several); every issuer is checked, and any that cannot be
/// used fails the whole check, with every issuer's line.
async fn check_auth(config: &Config, connect: bool) -> anyhow::Result<Vec<String>> {
    let checks = foldgate_api::auth::check_key_sources(&config.auth, connect)
        .await
        .map_err(|e| anyhow::anyhow!("auth: {e}"))?;
    let line = |check: &foldgate_api::auth::KeySourceCheck, text: &str| match &check.issuer {
        Some(issuer) => format!("auth: issuer {issuer}: {text}"),
        None => format!("auth: {text}"),
    };
    let failed = checks.iter().filter(|c| c.outcome.is_err()).count();
    if failed == 0 {
        return Ok(checks
            .iter()
            .map(|c| line(c, c.outcome.as_deref().unwrap_or_default()))
            .collect());
    }
    if let [only] = checks.as_slice()
        && only.issuer.is_none()
        && let Err(e) = &only.outcome
    {
        anyhow::bail!("auth: {e}");
    }
    let each: Vec<String> = checks
        .iter()
        .map(|c| match &c.outcome {
            Ok(text) => format!("  {}", line(c, text)),
            Err(e) => format!("  {} (cannot be used)", line(c, e)),
        })
        .collect();
    Err(anyhow::anyhow!(
        "auth: {failed} of {} trusted issuers cannot be used:\n{}",
        checks.len(),
        each.join("\n")
    ))
}

/// The key that signs the tokens minted for upstreams, read as `serve`
/// reads it: a line on it when one is configured or an upstream wants
/// tokens.
fn check_identity(config: &Config) -> anyhow::Result<Option<String>> {
    let signer = Signer::load(&config.identity).map_err(|e| anyhow::anyhow!("identity: {e}"))?;
    let minted = config.upstreams.iter().any(|u| u.identity == IdentityMode::Token);
    let previous = if config.identity.previous_key_file.is_some() {
        ", the previous key published too"
    } else {
        ""
    };
    Ok(if !signer.is_ephemeral() {
        Some(format!(
            "identity: upstream tokens are signed with {:?} key {}{previous}",
            signer.algorithm(),
            signer.key_id()
        ))
    } else if minted {
        Some(
            "identity: upstream tokens are signed with a key each process makes at start-up \
             (set [identity] signing_key_file to share one)"
                .to_owned(),
        )
    } else {
        None
    })
}

/// `check-config`'s line on the upstreams: names, URLs and tenants, never
/// their credentials.
pub fn describe_upstreams(config: &Config) -> String {
    let each = config.upstreams.iter().map(|u| {
        format!(
            "{} ({}, {})",
            u.name,
            u.url.as_deref().map_or_else(|| u.shown_target(), shown_url),
            tenant_scope(u.tenants.as_deref())
        )
    });
    format!("upstreams: {}", list_or_none(each))
}

/// `check-config`'s line on the models: what serves which tenants, never
/// the key.
pub fn describe_models(config: &Config) -> String {
    let each = config.models.iter().map(|m| {
        let kind = if m.embeddings { "embeddings, " } else { "" };
        format!(
            "{} ({}, {}, model {}, {kind}{})",
            m.name,
            m.provider.as_str(),
            shown_url(&m.base_url),
            m.model,
            tenant_scope(m.tenants.as_deref()),
        )
    });
    format!("models: {}", list_or_none(each))
}

/// `check-config`'s line on how operators sign in to the web console.
pub fn describe_console(config: &Config) -> String {
    match config.console_sign_in() {
        Ok(Some(sign_in)) => format!(
            "console: sign-in with {} (client {}, scopes {}, sends the {}{}), or a pasted token; \
             connect-src adds {}",
            sign_in.issuer,
            sign_in.client_id,
            sign_in.scopes.join(" "),
            sign_in.token.as_str().replace('_', " "),
            sign_in.resource.map(|r| format!(", resource {r}")).unwrap_or_default(),
            sign_in.connect_origins.join(" "),
        ),
        // `load` has checked it already.
        Ok(None) | Err(_) => "console: pasted tokens only".to_owned(),
    }
}

fn tenant_scope(tenants: Option<&[String]>) -> String {
    tenants.map_or_else(|| "every tenant".to_owned(), |t| format!("tenants: {}", t.join(", ")))
}

/// A URL without its user information or query (either may carry a key).
fn shown_url(url: &str) -> String {
    let (base, query) = url.split_at(url.find(['?', '#']).unwrap_or(url.len()));
    let mut shown = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://***@{host}{path}"),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    if !query.is_empty() {
        shown.push_str("?…");
    }
    shown
}

fn list_or_none(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() { "none".to_owned() } else { items.join("; ") }
}
