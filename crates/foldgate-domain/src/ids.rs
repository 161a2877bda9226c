//! Identifiers. Each is built only through `parse` (or, for branch ids,
//! `generate`), so an invalid one cannot exist past the edge.

use std::fmt;

use crate::InvalidInput;

/// Longest tenant, session or subject identifier accepted.
const MAX_ID_LEN: usize = 128;
/// Subjects come from identity providers, which use longer ids (emails, URLs).
const MAX_SUBJECT_LEN: usize = 256;

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

fn parse_id(field: &'static str, raw: &str) -> Result<String, InvalidInput> {
    if raw.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if raw.chars().count() > MAX_ID_LEN {
        return Err(InvalidInput::new(field, format!("must be at most {MAX_ID_LEN} characters")));
    }
    if let Some(bad) = raw.chars().find(|c| !is_id_char(*c)) {
        return Err(InvalidInput::new(
            field,
            format!("contains {bad:?}; allowed are letters, digits and . _ : -"),
        ));
    }
    Ok(raw.to_owned())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $field:literal, $parse:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Parses a client- or token-supplied value.
            pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
                let parse: fn(&str) -> Result<String, InvalidInput> = $parse;
                parse(raw).map(Self)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// The tenant a request acts for. It comes from a verified token claim,
    /// never from a request body; every store query is scoped by it.
    TenantId,
    "tenant",
    |raw| parse_id("tenant", raw)
);

string_id!(
    /// A client-chosen folding session id: 1–128 characters of
    /// `[A-Za-z0-9._:-]`, unique within a tenant.
    SessionId,
    "session_id",
    |raw| parse_id("session_id", raw)
);

string_id!(
    /// The token's `sub`: who, within a tenant, owns a session.
    Subject,
    "sub",
    |raw| {
        if raw.is_empty() {
            return Err(InvalidInput::new("sub", "must not be empty"));
        }
        if raw.chars().count() > MAX_SUBJECT_LEN {
            return Err(InvalidInput::new(
                "sub",
                format!("must be at most {MAX_SUBJECT_LEN} characters"),
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(InvalidInput::new("sub", "must not contain control characters"));
        }
        Ok(raw.to_owned())
    }
);

/// Who is calling: a tenant and a subject within it. Sessions belong to one
/// principal; another principal sees them as nonexistent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub tenant: TenantId,
    pub subject: Subject,
}

impl Principal {
    pub fn new(tenant: TenantId, subject: Subject) -> Self {
        Self { tenant, subject }
    }
}

/// An id of a UUID behind a prefix (`br_<uuid>`): new ids are UUIDv7, so
/// they sort by creation time and index well; only the canonical hyphenated
/// form parses.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(::uuid::Uuid);

        impl $name {
            const PREFIX: &'static str = $prefix;

            /// A fresh, time-ordered id.
            pub fn generate() -> Self {
                Self(::uuid::Uuid::now_v7())
            }

            #[doc = concat!("Parses `", $prefix, "` followed by a hyphenated UUID.")]
            pub fn parse(raw: &str) -> Result<Self, $crate::InvalidInput> {
                let bad = || {
                    $crate::InvalidInput::new(
                        $field,
                        concat!("must be `", $prefix, "` followed by a UUID"),
                    )
                };
                let rest = raw.strip_prefix(Self::PREFIX).ok_or_else(bad)?;
                // `Uuid::parse_str` also accepts braced and URN forms.
                if rest.len() != 36 {
                    return Err(bad());
                }
                ::uuid::Uuid::parse_str(rest).map(Self).map_err(|_| bad())
            }

            /// Rebuilds an id read back from the store.
            pub fn from_uuid(uuid: ::uuid::Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> ::uuid::Uuid {
                self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}{}", Self::PREFIX, self.0.hyphenated())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::InvalidInput;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    };
}
pub(crate) use uuid_id;

uuid_id!(
    /// A branch id, `br_<uuid>`.
    BranchId,
    "br_",
    "branch_id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids() {
        let long = "a".repeat(129);
        let max = "a".repeat(128);
        let cases: &[(&str, bool, &str)] = &[
            ("s1", true, "simple"),
            ("A.b_c:d-9", true, "every allowed punctuation"),
            (max.as_str(), true, "128 characters"),
            ("", false, "empty"),
            (long.as_str(), false, "129 characters"),
            ("has space", false, "space"),
            ("slash/y", false, "slash"),
            ("ünï", false, "non-ASCII"),
            ("nl\n", false, "control character"),
        ];
        for (raw, ok, why) in cases {
            assert_eq!(SessionId::parse(raw).is_ok(), *ok, "{why}: {raw:?}");
        }
        assert_eq!(SessionId::parse("x y").unwrap_err().field, "session_id");
    }

    #[test]
    fn branch_ids_round_trip_and_reject_other_forms() {
        let id = BranchId::generate();
        let text = id.to_string();
        assert!(text.starts_with("br_"));
        assert_eq!(BranchId::parse(&text).unwrap(), id);

        let uuid = id.as_uuid();
        let cases = [
            (uuid.hyphenated().to_string(), "no prefix"),
            (format!("br_{}", uuid.simple()), "unhyphenated"),
            (format!("br_{}", uuid.braced()), "braced"),
            (format!("BR_{}", uuid.hyphenated()), "upper-case prefix"),
            ("br_".to_owned(), "prefix only"),
            ("br_zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz".to_owned(), "not hex"),
        ];
        for (raw, why) in cases {
            let err = BranchId::parse(&raw).expect_err(why);
            assert_eq!(err.field, "branch_id", "{why}");
        }
    }

    #[test]
    fn new_branch_ids_sort_by_creation() {
        let a = BranchId::generate();
        let b = BranchId::generate();
        assert!(a < b);
    }

    #[test]
    fn subjects() {
        assert!(Subject::parse("user@example.com").is_ok());
        assert!(Subject::parse("https://idp.example/u/1").is_ok());
        assert!(Subject::parse("").is_err());
        assert!(Subject::parse("a\u{7}").is_err());
        assert!(Subject::parse(&"x".repeat(257)).is_err());
    }
}
