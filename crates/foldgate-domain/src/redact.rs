//! Text that may hold a secret, made safe to print.

/// A URL with any password replaced, safe to print.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{user}:***@{host}")
        }
        _ => authority.to_owned(),
    };
    // A password may also be a query parameter (`?password=…`,
    // `sslpassword=…` for a client key, `?token=…`).
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _))
                        if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Query parameters whose values are secrets: a database URL's password or
/// client key password, a service's token or key.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "sslpassword",
    "token",
    "access_token",
    "api_key",
    "apikey",
    "key",
    "secret",
    "client_secret",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(redact_url("http://u:pw@h?x=1"), "http://u:***@h?x=1");
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=secret"),
            "postgres://u@h/db?sslmode=require&password=***"
        );
        assert_eq!(
            redact_url("postgres://u:a@h/db?Password=b&sslpassword=c&x=1"),
            "postgres://u:***@h/db?Password=***&sslpassword=***&x=1"
        );
        assert_eq!(
            redact_url("https://bot:t0k@mcp.example/mcp?token=a&api_key=b&page=2"),
            "https://bot:***@mcp.example/mcp?token=***&api_key=***&page=2"
        );
    }
}
