//! Free text that crosses the folding boundary: a branch's description and
//! prompt going in, its return message coming out.
//!
//! Control characters other than `\n` and `\t` are removed (they hide text
//! from humans reviewing transcripts and confuse terminals); limits are
//! counted in characters after that removal.

use crate::InvalidInput;

/// Removes control characters except newline and tab. Carriage returns go
/// too, so `\r\n` becomes `\n`.
pub fn strip_control(raw: &str) -> String {
    raw.chars().filter(|c| !c.is_control() || matches!(c, '\n' | '\t')).collect()
}

pub(crate) fn parse_text(
    field: &'static str,
    raw: &str,
    max_chars: usize,
    required: bool,
) -> Result<String, InvalidInput> {
    let text = strip_control(raw);
    let len = text.chars().count();
    if len > max_chars {
        return Err(InvalidInput::new(
            field,
            format!("must be at most {max_chars} characters, got {len}"),
        ));
    }
    if required && text.trim().is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    Ok(text)
}

macro_rules! bounded_text {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr, $required:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            /// Longest accepted value, in characters.
            pub const MAX_CHARS: usize = $max;

            /// Strips control characters, then checks the length.
            pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
                $crate::text::parse_text($field, raw, Self::MAX_CHARS, $required).map(Self)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl ::std::fmt::Debug for $name {
            // Free text can be long and may carry secrets before scrubbing:
            // debug output shows only its size.
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({} chars)", stringify!($name), self.0.chars().count())
            }
        }
    };
}
pub(crate) use bounded_text;

bounded_text!(
    /// What a branch is for, in a sentence: required, at most 500 characters.
    Description,
    "description",
    500,
    true
);

bounded_text!(
    /// The instructions a branch starts from: optional, at most 10,000
    /// characters. Its tokens are charged to the branch at creation.
    Prompt,
    "prompt",
    10_000,
    false
);

bounded_text!(
    /// The summary a branch returns to its parent, before scrubbing: at most
    /// 50,000 characters.
    Message,
    "message",
    50_000,
    false
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_stripped_except_newline_and_tab() {
        assert_eq!(strip_control("a\u{0}b\u{7}c\r\nd\te\u{1b}[31m\u{7f}"), "abc\nd\te[31m");
        assert_eq!(strip_control("héllo\u{85}wörld"), "héllowörld", "C1 controls go too");
    }

    #[test]
    fn limits_count_characters_after_stripping() {
        let at_limit = "é".repeat(500);
        assert!(Description::parse(&at_limit).is_ok(), "500 two-byte characters fit");
        let over = "é".repeat(501);
        let err = Description::parse(&over).unwrap_err();
        assert_eq!(err.field, "description");
        assert!(err.reason.contains("500"), "{}", err.reason);

        let padded = format!("{}{}", "a".repeat(500), "\u{0}".repeat(20));
        assert!(Description::parse(&padded).is_ok(), "stripped characters do not count");

        assert!(Prompt::parse(&"p".repeat(10_000)).is_ok());
        assert_eq!(Prompt::parse(&"p".repeat(10_001)).unwrap_err().field, "prompt");
        assert!(Message::parse(&"m".repeat(50_000)).is_ok());
        assert_eq!(Message::parse(&"m".repeat(50_001)).unwrap_err().field, "message");
    }

    #[test]
    fn description_is_required_prompt_and_message_are_not() {
        assert!(Description::parse("").is_err());
        assert!(Description::parse(" \n\t\u{0}").is_err(), "only blanks after stripping");
        assert!(Prompt::parse("").is_ok());
        assert!(Message::parse("").is_ok());
    }

    #[test]
    fn debug_does_not_print_the_text() {
        let m = Message::parse("password=hunter2").unwrap();
        assert_eq!(format!("{m:?}"), "Message(16 chars)");
    }
}
