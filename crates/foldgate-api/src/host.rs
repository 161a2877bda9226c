//! What `api.allowed_hosts` and `api.allowed_origins` accept, and how a
//! request's `Host` and `Origin` are matched against them.
//!
//! A host is `*`, a DNS name, an IPv4 address or an IPv6 address (bare,
//! `::1`, or bracketed, `[::1]`), optionally with a port; a name may start
//! with `*.` to accept every name below it. An origin is `*` or
//! `scheme://host[:port]`. Anything else, a path, a user or a password
//! included, is refused when the configuration is read.

use std::net::{Ipv4Addr, Ipv6Addr};

/// One accepted `Host` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPattern {
    name: NamePattern,
    port: PortRule,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NamePattern {
    /// `*`: any host.
    Any,
    /// A name or address, lower-cased, an IPv6 address without brackets.
    Exact(String),
    /// `*.example.com`, kept as `.example.com`: any name ending with it.
    Below(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortRule {
    Any,
    Exactly(Option<u16>),
}

impl HostPattern {
    /// A pattern of `api.allowed_hosts`: without a port it accepts the
    /// name on any port.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Self { name: NamePattern::Any, port: PortRule::Any });
        }
        if text.contains("://") {
            return Err("is a URL: list its host (and port) alone".into());
        }
        if text.contains(['/', '@', '?', '#']) {
            return Err("is not a host: it has a path, a query or a user".into());
        }
        let (name, port) = split_authority(text)?;
        let name = if let Some(parent) = name.strip_prefix("*.") {
            check_dns_name(parent)?;
            NamePattern::Below(format!(".{}", parent.to_ascii_lowercase()))
        } else {
            check_host(name)?;
            NamePattern::Exact(name.to_ascii_lowercase())
        };
        Ok(Self { name, port: port.map_or(PortRule::Any, |p| PortRule::Exactly(Some(p))) })
    }

    /// Whether a request's `Host` (or an origin's authority) matches.
    pub(crate) fn accepts(&self, authority: &str) -> bool {
        let Ok((name, port)) = split_authority(authority) else { return false };
        let name_matches = match &self.name {
            NamePattern::Any => true,
            NamePattern::Exact(exact) => exact.eq_ignore_ascii_case(name),
            NamePattern::Below(suffix) => {
                name.len() > suffix.len()
                    && name.is_char_boundary(name.len() - suffix.len())
                    && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        };
        name_matches
            && match self.port {
                PortRule::Any => true,
                PortRule::Exactly(p) => p == port,
            }
    }
}

/// One accepted `Origin` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OriginPattern {
    /// `*`: any origin, `null` included.
    Any,
    /// `scheme://host[:port]`; without a port, only the scheme's default
    /// port (an origin without one) is accepted.
    Site { scheme: String, host: HostPattern },
}

impl OriginPattern {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Self::Any);
        }
        let (scheme, authority) = split_origin(text.strip_suffix('/').unwrap_or(text))
            .ok_or("is not an origin, scheme://host[:port]")?;
        let mut host = HostPattern::parse(authority)?;
        if host.port == PortRule::Any && host.name != NamePattern::Any {
            host.port = PortRule::Exactly(None);
        }
        Ok(Self::Site { scheme: scheme.to_ascii_lowercase(), host })
    }

    pub(crate) fn accepts(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Site { scheme, host } => split_origin(origin).is_some_and(|(s, authority)| {
                s.eq_ignore_ascii_case(scheme) && host.accepts(authority)
            }),
        }
    }
}

/// `scheme://authority`, with a scheme as RFC 3986 spells one and nothing
/// after the authority.
pub(crate) fn split_origin(origin: &str) -> Option<(&str, &str)> {
    let (scheme, authority) = origin.split_once("://")?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (scheme_ok && !authority.is_empty() && !authority.contains(['/', '?', '#', '@']))
        .then_some((scheme, authority))
}

/// `name[:port]`, `[v6][:port]` or a bare IPv6 address → the name (an IPv6
/// address without brackets) and the port.
fn split_authority(authority: &str) -> Result<(&str, Option<u16>), String> {
    if authority.parse::<Ipv6Addr>().is_ok() {
        return Ok((authority, None));
    }
    let (name, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (address, after) = rest.split_once(']').ok_or("has a `[` without its `]`")?;
        if address.parse::<Ipv6Addr>().is_err() {
            return Err("has no IPv6 address between its brackets".into());
        }
        match after {
            "" => (address, None),
            _ => (address, Some(after.strip_prefix(':').ok_or("has text after its `]`")?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        }
    };
    let port = port
        .map(|p| match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err("has a port that is not a number from 1 to 65535"),
        })
        .transpose()?;
    Ok((name, port))
}

fn check_host(name: &str) -> Result<(), String> {
    if name.parse::<Ipv6Addr>().is_ok() || name.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    check_dns_name(name)
}

/// Labels of letters, digits, `-` and `_`, each 1 to 63 long, 253 in all.
fn check_dns_name(name: &str) -> Result<(), String> {
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err("is not a host name, an IP address or `*` (a name may start with `*.`)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(text: &str) -> HostPattern {
        HostPattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn names_addresses_and_ports() {
        assert!(host("localhost").accepts("localhost:8080"));
        assert!(host("localhost").accepts("LOCALHOST"));
        assert!(host("api.example.com:8443").accepts("api.example.com:8443"));
        assert!(!host("api.example.com:8443").accepts("api.example.com"));
        assert!(!host("api.example.com:8443").accepts("api.example.com:443"));
        assert!(host("127.0.0.1").accepts("127.0.0.1:3000"));
        assert!(host("::1").accepts("[::1]:80"));
        assert!(host("::1").accepts("[::1]"));
        assert!(host("[::1]:80").accepts("[::1]:80"));
        assert!(!host("[::1]:80").accepts("[::1]:81"));
        assert!(host("*").accepts("anything.example:1"));
        assert!(!host("example.com").accepts("example.com.evil.example"));
        assert!(!host("example.com").accepts("evilexample.com"));
        assert!(!host("localhost").accepts("localhost:99999"));
    }

    #[test]
    fn wildcards_accept_names_below_only() {
        let p = host("*.example.com");
        assert!(p.accepts("a.example.com"));
        assert!(p.accepts("a.b.EXAMPLE.com:443"));
        assert!(!p.accepts("example.com"), "the parent itself is not below it");
        assert!(!p.accepts("aexample.com"));
        assert!(!p.accepts("a.example.com.evil.example"));
        assert!(host("*.example.com:8443").accepts("a.example.com:8443"));
        assert!(!host("*.example.com:8443").accepts("a.example.com"));
    }

    #[test]
    fn what_is_not_a_host_is_refused() {
        for bad in [
            "",
            "https://example.com",
            "user:password@example.com",
            "example.com/path",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:http",
            "example.com:+80",
            "exa mple.com",
            "a..b",
            "example.com.",
            "*example.com",
            "*.*.example.com",
            "a.*.example.com",
            "[::1",
            "[example.com]",
            "[::1]x",
            "::1:80:",
            &"a".repeat(64),
            "é.example",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn origins() {
        let p = OriginPattern::parse("https://app.example.com").unwrap();
        assert!(p.accepts("https://app.example.com"));
        assert!(p.accepts("HTTPS://App.Example.com"));
        assert!(!p.accepts("https://app.example.com:8443"), "another port is another origin");
        assert!(!p.accepts("http://app.example.com"));
        assert!(!p.accepts("https://evil.example"));
        assert!(!p.accepts("null"));
        assert!(
            OriginPattern::parse("https://app.example.com/")
                .unwrap()
                .accepts("https://app.example.com")
        );
        let below = OriginPattern::parse("https://*.example.com").unwrap();
        assert!(below.accepts("https://a.example.com"));
        assert!(!below.accepts("https://example.com"));
        let port = OriginPattern::parse("http://localhost:5173").unwrap();
        assert!(port.accepts("http://localhost:5173"));
        assert!(!port.accepts("http://localhost"));
        assert!(
            OriginPattern::parse("chrome-extension://abcdef")
                .unwrap()
                .accepts("chrome-extension://abcdef")
        );
        assert!(OriginPattern::parse("*").unwrap().accepts("null"));
        for bad in [
            "",
            "app.example.com",
            "https://",
            "https://u:p@x.example",
            "https://x.example/app",
            "1http://x",
            "null",
        ] {
            assert!(OriginPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
