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
/// URL with a password). A URL's authority (where a password is) runs from
/// its scheme to the first blank, double quote, backslash, `/`, `?` or
/// `#`: quotes, brackets, commas and semicolons may be part of a password.
/// Its path and query run on to the first blank, quote, backslash, comma,
/// semicolon or closing bracket. A URL ends where another begins.
pub fn redact_urls_in(text: &str) -> String {
    let starts = |c: char| c.is_whitespace() || "\"'`(<=,;".contains(c);
    let authority_ends = |c: char| c.is_whitespace() || "\"\\/?#".contains(c);
    let in_scheme = |c: char| c.is_ascii_alphanumeric() || "+.-".contains(c);
    let ends = |c: char| c.is_whitespace() || "\"'`)>,;\\".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| starts(*c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let after = &rest[at + 3..];
        let authority = after.find(authority_ends).unwrap_or(after.len());
        let tail = &after[authority..];
        let tail = if tail.starts_with(['/', '?', '#']) {
            tail.find(ends).unwrap_or(tail.len())
        } else {
            0
        };
        let mut len = authority + tail;
        if let Some(next) = after[..len].find("://") {
            len = after[..next]
                .char_indices()
                .rev()
                .find(|(_, c)| !in_scheme(*c))
                .map_or(0, |(i, c)| i + c.len_utf8());
        }
        let end = at + 3 + len;
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
        // Quotes and brackets may be part of a password; quoted URLs keep
        // their quotes.
        assert_eq!(
            redact_urls_in(r#"issuers[0] "http://a'''b:p'w(d)@/realms": empty host"#),
            r#"issuers[0] "http://a'''b:***@/realms": empty host"#
        );
        assert_eq!(
            redact_urls_in("'http://u:pw@h' and (http://v:q@k)"),
            "'http://u:***@h' and (http://v:***@k)"
        );
        assert_eq!(
            redact_urls_in("http://u:p@h,http://v:q@k/x, https://w:r@l/y?token=t"),
            "http://u:***@h,http://v:***@k/x, https://w:***@l/y?token=***"
        );
        assert_eq!(redact_urls_in("http://u:a,b;c@h/x"), "http://u:***@h/x");
        assert_eq!(redact_urls_in("<http://a>b:p<q>@h>"), "<http://a>b:***@h>");
        assert_eq!(redact_urls_in("x://://y://u:p@h"), "x://://y://u:***@h");
        assert_eq!(redact_urls_in("a://u:p@hé://v:q@k"), "a://u:***@hé://v:***@k");
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
