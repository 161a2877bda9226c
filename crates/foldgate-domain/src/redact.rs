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

/// Text with every URL in it redacted as [`redact_url`] does, for a
/// message that quotes a value an operator gave (which may be, or hold, a
/// URL with a password). A URL runs from its scheme to the first blank,
/// quote, backslash, comma, semicolon or bracket.
pub fn redact_urls_in(text: &str) -> String {
    let starts = |c: char| c.is_whitespace() || "\"'`(<=,;".contains(c);
    let ends = |c: char| c.is_whitespace() || "\"'`)>,;\\".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| starts(*c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at + 3..].find(ends).map_or(rest.len(), |i| at + 3 + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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
    fn urls_in_a_message_are_redacted() {
        assert_eq!(
            redact_urls_in(
                r#"invalid type: string "x,\" http://u:s3cret@h/db\"", expected struct"#
            ),
            r#"invalid type: string "x,\" http://u:***@h/db\"", expected struct"#
        );
        assert_eq!(redact_urls_in("a\u{3000}postgres://u:pw@h b"), "a\u{3000}postgres://u:***@h b");
        assert_eq!(redact_urls_in("no url here, ://"), "no url here, ://");
        assert_eq!(redact_urls_in("(https://h/x?token=t)"), "(https://h/x?token=***)");
        assert_eq!(redact_urls_in("é://u:p@h"), "é://u:***@h");
    }

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
