//! What `check-config` prints of a configuration: names, URLs and tenants,
//! never a credential.

use crate::config::Config;

/// `check-config`'s line on the upstreams: names, URLs and tenants, never
/// their credentials.
pub fn describe_upstreams(config: &Config) -> String {
    let each = config.upstreams.iter().map(|u| {
        format!("{} ({}, {})", u.name, shown_url(&u.url), tenant_scope(u.tenants.as_deref()))
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
