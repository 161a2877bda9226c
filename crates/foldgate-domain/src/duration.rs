//! Durations in settings: text with units (`"30s"`, `"500ms"`, `"5m"`,
//! `"1h"`, `"1m30s"`, `"2 days"`), or a bare whole number counted in the
//! unit the setting had before units were accepted, so that configuration
//! files and environments written for that keep their meaning.
//!
//! Every duration setting is read by [`deserialize`], through one of the
//! helpers named after its unit ([`seconds`], [`millis`], [`days`],
//! [`whole_seconds`]). Text is parsed by `humantime`. Refused, each with a
//! message that says which forms are accepted: text that is no duration, a
//! negative number, a number with a fraction (a TOML or JSON float), a
//! duration too long to represent, and, for a setting kept in whole seconds
//! ([`WholeSeconds`]), a duration that is not a whole number of seconds:
//! nothing is rounded.

use std::{fmt, marker::PhantomData, time::Duration};

use serde::{Deserializer, Serializer, de};

use crate::ConfigError;

/// What a bare number counts in a setting, and the finest step the
/// setting keeps.
pub trait Unit {
    /// How errors name the unit: `"seconds"`.
    const NAME: &'static str;
    /// One unit.
    const ONE: Duration;
    /// Whether the setting keeps only whole units; a duration that is not
    /// one is refused rather than rounded.
    const WHOLE: bool;
    /// Examples of text the setting accepts, as errors show them.
    const EXAMPLES: &'static str;
}

/// A bare number counts seconds; any duration is kept.
#[derive(Debug)]
pub enum Seconds {}

/// A bare number counts milliseconds; any duration is kept.
#[derive(Debug)]
pub enum Millis {}

/// A bare number counts days; any duration is kept.
#[derive(Debug)]
pub enum Days {}

/// A bare number counts seconds, and the setting keeps whole seconds only:
/// `"1500ms"` is refused.
#[derive(Debug)]
pub enum WholeSeconds {}

const ANY_EXAMPLES: &str = r#""30s", "500ms" or "5m""#;

impl Unit for Seconds {
    const NAME: &'static str = "seconds";
    const ONE: Duration = Duration::from_secs(1);
    const WHOLE: bool = false;
    const EXAMPLES: &'static str = ANY_EXAMPLES;
}

impl Unit for Millis {
    const NAME: &'static str = "milliseconds";
    const ONE: Duration = Duration::from_millis(1);
    const WHOLE: bool = false;
    const EXAMPLES: &'static str = ANY_EXAMPLES;
}

impl Unit for Days {
    const NAME: &'static str = "days";
    const ONE: Duration = Duration::from_secs(24 * 3600);
    const WHOLE: bool = false;
    const EXAMPLES: &'static str = r#""30d", "12h" or "2w""#;
}

impl Unit for WholeSeconds {
    const NAME: &'static str = "seconds";
    const ONE: Duration = Duration::from_secs(1);
    const WHOLE: bool = true;
    const EXAMPLES: &'static str = r#""30s", "5m" or "1h""#;
}

/// The text [`parse`] accepts, as a regular expression (ECMA-262 and Rust
/// syntax alike) for the documents that describe settings: the admin API's
/// OpenAPI document and the Helm chart's values schema.
pub const TEXT_PATTERN: &str = r"^\s*([0-9]+\s*|([0-9]+(\.[0-9]+)?\s*(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+)$";

/// Reads a duration setting: text with units, or a whole number of `U`.
/// The error says which forms are accepted; the configuration loader (or
/// the admin API) adds the setting's name.
pub fn deserialize<'de, U: Unit, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor::<U>(PhantomData))
}

/// [`deserialize`] for a setting whose bare numbers count seconds.
pub fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    deserialize::<Seconds, D>(d)
}

/// [`deserialize`] for a setting whose bare numbers count milliseconds.
pub fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    deserialize::<Millis, D>(d)
}

/// [`deserialize`] for a setting whose bare numbers count days.
pub fn days<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    deserialize::<Days, D>(d)
}

/// [`deserialize`] for a setting kept in whole seconds.
pub fn whole_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    deserialize::<WholeSeconds, D>(d)
}

/// Writes a duration as text that [`deserialize`] reads back whatever the
/// unit (`"1m 30s"`, `"500ms"`), for declarations kept in the database.
pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&show(*value))
}

/// A duration as settings write it, from days down to nanoseconds:
/// `"30s"`, `"1m 30s"`, `"500ms"`, `"365d"`, `"0s"`. (`humantime`'s own
/// format counts months and years of fractional days, which no setting
/// means.)
pub fn show(value: Duration) -> String {
    if value.is_zero() {
        return "0s".to_owned();
    }
    let seconds = value.as_secs();
    let nanos = value.subsec_nanos();
    let parts = [
        (seconds / 86_400, "d"),
        (seconds / 3600 % 24, "h"),
        (seconds / 60 % 60, "m"),
        (seconds % 60, "s"),
        (u64::from(nanos / 1_000_000), "ms"),
        (u64::from(nanos / 1000 % 1000), "us"),
        (u64::from(nanos % 1000), "ns"),
    ];
    let shown: Vec<String> =
        parts.iter().filter(|(n, _)| *n > 0).map(|(n, unit)| format!("{n}{unit}")).collect();
    shown.join(" ")
}

/// Parses a duration setting's text: a duration with units, or digits
/// alone, counted in `U`.
pub fn parse<U: Unit>(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let parsed = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        match trimmed.parse::<u64>() {
            Ok(n) => count::<U>(n).ok_or(Problem::TooLong),
            Err(_) => Err(Problem::TooLong),
        }
    } else if trimmed.starts_with('-') {
        Err(Problem::Negative)
    } else {
        humantime::parse_duration(trimmed).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => Problem::TooLong,
            _ => Problem::NotADuration,
        })
    };
    parsed.and_then(whole::<U>).map_err(|problem| problem.message::<U>(&format!("{text:?}")))
}

/// `n` units, if that is representable.
fn count<U: Unit>(n: u64) -> Option<Duration> {
    let nanos = U::ONE.as_nanos().checked_mul(u128::from(n))?;
    let seconds = u64::try_from(nanos / 1_000_000_000).ok()?;
    let rest = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(seconds, rest))
}

/// The duration, if the setting keeps it as it is.
fn whole<U: Unit>(value: Duration) -> Result<Duration, Problem> {
    if U::WHOLE && !value.as_nanos().is_multiple_of(U::ONE.as_nanos()) {
        return Err(Problem::NotWhole);
    }
    Ok(value)
}

/// Why a value is not a duration the setting accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    NotADuration,
    Negative,
    /// A number with a fraction, and what it would be written with units
    /// (when the setting keeps fractions of its unit).
    Fraction(Option<Duration>),
    TooLong,
    NotWhole,
}

impl Problem {
    fn message<U: Unit>(self, got: &str) -> String {
        let why = match self {
            Self::NotADuration => String::new(),
            Self::Negative => ", which is negative".to_owned(),
            Self::Fraction(Some(written))
                if written.as_nanos().is_multiple_of(U::ONE.as_nanos()) =>
            {
                format!(
                    ", a decimal number: write it as a whole number, or with units, as {:?}",
                    show(written)
                )
            }
            Self::Fraction(Some(written)) => {
                format!(
                    ", which is not a whole number: write it with units, as {:?}",
                    show(written)
                )
            }
            Self::Fraction(None) => format!(", which is not a whole number of {}", U::NAME),
            Self::TooLong => ", which is too long".to_owned(),
            Self::NotWhole => format!(", which is not a whole number of {}", U::NAME),
        };
        format!("{}; got {got}{why}", Expected::<U>(PhantomData))
    }
}

/// "expected a duration such as …": what a setting of unit `U` accepts.
struct Expected<U>(PhantomData<U>);

impl<U: Unit> fmt::Display for Expected<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = if U::WHOLE { format!(" in whole {}", U::NAME) } else { String::new() };
        write!(
            f,
            "expected a duration{whole} such as {}, or a whole number of {}",
            U::EXAMPLES,
            U::NAME
        )
    }
}

struct DurationVisitor<U>(PhantomData<U>);

impl<U: Unit> DurationVisitor<U> {
    fn refuse<E: de::Error>(problem: Problem, got: impl fmt::Display) -> E {
        E::custom(problem.message::<U>(&got.to_string()))
    }
}

impl<U: Unit> de::Visitor<'_> for DurationVisitor<U> {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Expected::<U>(PhantomData), f)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        count::<U>(n).ok_or_else(|| Self::refuse(Problem::TooLong, n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Err(Self::refuse(Problem::Negative, n)),
        }
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Duration, E> {
        let problem = if n < 0.0 {
            Problem::Negative
        } else {
            let written = Duration::try_from_secs_f64(n * U::ONE.as_secs_f64()).ok();
            Problem::Fraction(written.filter(|w| whole::<U>(*w).is_ok()))
        };
        // `{:?}` keeps the decimal point: 30.0, not 30.
        Err(Self::refuse(problem, format!("{n:?}")))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse::<U>(text).map_err(E::custom)
    }
}

/// Checks that a duration setting is within `min..=max`, naming it and
/// both bounds with units: `jwks_timeout must be from 1s to 1m, got 2m`.
pub fn check_range(
    name: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(format!(
            "{name} must be from {} to {}, got {}",
            show(min),
            show(max),
            show(value)
        )
        .into());
    }
    Ok(())
}

/// A setting's former name, still accepted: in the configuration file, in
/// `FOLDGATE_…` variables and in the admin API's JSON. Setting both names
/// at once is an error naming both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The name before durations took units (`jwks_timeout_seconds`).
    pub old: &'static str,
    /// The name (`jwks_timeout`).
    pub new: &'static str,
}

impl Renamed {
    pub const fn new(old: &'static str, new: &'static str) -> Self {
        Self { old, new }
    }
}

/// The first setting of `renamed` that `has` says is given under both its
/// names, as an error naming both, each after `at` (`"auth."`, `""`).
pub fn both_names(renamed: &[Renamed], at: &str, has: impl Fn(&str) -> bool) -> Result<(), String> {
    match renamed.iter().find(|r| has(r.old) && has(r.new)) {
        Some(r) => Err(format!(
            "{at}{new} and {at}{old} are one setting ({old} is its former name): set only {new}",
            new = r.new,
            old = r.old
        )),
        None => Ok(()),
    }
}

/// The schema of a duration in the admin API's OpenAPI document.
#[cfg(feature = "openapi")]
#[derive(Debug)]
pub struct DurationSchema;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for DurationSchema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .description(Some(
                "A duration: text with units (`ms`, `s`, `m`, `h`, `d`), such as \"30s\", \
                 \"500ms\", \"5m\" or \"1m30s\"; or a whole number, counted in the unit the \
                 field's description names.",
            ))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(TEXT_PATTERN))
                    .examples(["30s", "500ms", "1m30s"]),
            )
            .item(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for DurationSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Duration")
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Setting {
        #[serde(deserialize_with = "seconds")]
        seconds: Duration,
    }

    fn read<U: Unit>(json: &str) -> Result<Duration, String> {
        let mut de = serde_json::Deserializer::from_str(json);
        deserialize::<U, _>(&mut de).map_err(|e| e.to_string())
    }

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn every_form_of_a_duration() {
        let cases: &[(&str, Duration, &str)] = &[
            ("30", 30 * S, "a bare number counts the unit"),
            ("\"30\"", 30 * S, "digits as text count the unit too"),
            ("\"30s\"", 30 * S, "seconds"),
            ("\"500ms\"", 500 * MS, "milliseconds"),
            ("\"5m\"", 300 * S, "minutes"),
            ("\"1h\"", 3600 * S, "hours"),
            ("\"1m30s\"", 90 * S, "combined"),
            ("\"1m 30s\"", 90 * S, "combined, spaced"),
            ("\"2 days\"", 2 * 86_400 * S, "long names"),
            ("\"1.5s\"", 1500 * MS, "a fraction with a unit"),
            ("\"0s\"", Duration::ZERO, "zero"),
            ("0", Duration::ZERO, "bare zero"),
        ];
        for (json, expected, why) in cases {
            assert_eq!(read::<Seconds>(json).as_ref(), Ok(expected), "{why}: {json}");
        }
        assert_eq!(read::<Millis>("500"), Ok(500 * MS), "a bare number in milliseconds");
        assert_eq!(read::<Millis>("\"2s\""), Ok(2000 * MS));
        assert_eq!(read::<Days>("30"), Ok(30 * 86_400 * S), "a bare number in days");
        assert_eq!(read::<Days>("\"12h\""), Ok(12 * 3600 * S));
        assert_eq!(read::<WholeSeconds>("\"2m\""), Ok(120 * S));
        assert_eq!(read::<Seconds>(&u64::MAX.to_string()), Ok(Duration::from_secs(u64::MAX)));
    }

    #[test]
    fn every_mistake_is_refused_saying_what_is_accepted() {
        let seconds =
            r#"expected a duration such as "30s", "500ms" or "5m", or a whole number of seconds"#;
        let cases: &[(&str, &str)] = &[
            ("\"5 parsecs\"", "got \"5 parsecs\""),
            ("\"\"", "got \"\""),
            ("\"soon\"", "got \"soon\""),
            ("-5", "got -5, which is negative"),
            ("\"-5s\"", "got \"-5s\", which is negative"),
            ("-1.5", "got -1.5, which is negative"),
            ("1.5", "got 1.5, which is not a whole number: write it with units, as \"1s 500ms\""),
            ("\"99999999999999999999h\"", "which is too long"),
            ("\"99999999999999999999\"", "which is too long"),
            ("true", "invalid type: boolean `true`"),
        ];
        for (json, detail) in cases {
            let e = read::<Seconds>(json).unwrap_err();
            assert!(e.contains(seconds) && e.contains(detail), "{json}: {e}");
        }
        let e = read::<Millis>("\"5 parsecs\"").unwrap_err();
        assert!(e.contains("or a whole number of milliseconds; got \"5 parsecs\""), "{e}");
        let e = read::<Days>(&u64::MAX.to_string()).unwrap_err();
        assert!(e.contains("whole number of days; got 18446744073709551615, which is too long"));
        let e = read::<Seconds>("30.0").unwrap_err();
        assert!(
            e.contains(
                r#"got 30.0, a decimal number: write it as a whole number, or with units, as "30s""#
            ),
            "{e}"
        );
        let e = read::<WholeSeconds>("1.5").unwrap_err();
        assert!(e.contains("got 1.5, which is not a whole number of seconds"), "{e}");
    }

    #[test]
    fn a_setting_kept_in_whole_seconds_refuses_what_it_would_round() {
        for json in ["\"1500ms\"", "\"1.5s\"", "\"1s 1ns\""] {
            let e = read::<WholeSeconds>(json).unwrap_err();
            assert!(
                e.contains(r#"expected a duration in whole seconds such as "30s", "5m" or "1h""#)
                    && e.contains("which is not a whole number of seconds"),
                "{json}: {e}"
            );
        }
        assert_eq!(read::<WholeSeconds>("\"2000ms\""), Ok(2 * S), "whole, however written");
    }

    #[test]
    fn the_published_pattern_accepts_what_the_parser_does() {
        let pattern = regex::Regex::new(TEXT_PATTERN).unwrap();
        for text in [
            "30",
            " 30 ",
            "30s",
            "500ms",
            "5m",
            "1h",
            "1m30s",
            "1m 30s",
            "2 days",
            "1.5s",
            "1hour 12min 5s",
            "3w",
            "1µs",
            "0s",
            "10 M",
            "5 parsecs",
            "",
            "s",
            "-5s",
            "1.s",
            "1.5",
            "30 s x",
            "1m,30s",
            "+5s",
            "1e3s",
        ] {
            assert_eq!(pattern.is_match(text), parse::<Seconds>(text).is_ok(), "{text:?}");
        }
    }

    #[test]
    fn written_as_read() {
        for value in [
            Duration::ZERO,
            500 * MS,
            30 * S,
            90 * S,
            86_400 * S,
            1500 * MS,
            Duration::new(90_061, 1_001_001),
        ] {
            let text = show(value);
            assert_eq!(parse::<Seconds>(&text), Ok(value), "{text}");
            assert_eq!(parse::<Millis>(&text), Ok(value), "{text}");
        }
        assert_eq!(show(90 * S), "1m 30s");
        assert_eq!(show(500 * MS), "500ms");
        assert_eq!(show(365 * 86_400 * S), "365d");
        assert_eq!(show(Duration::new(3661, 1_000_001)), "1h 1m 1s 1ms 1ns");
    }

    #[test]
    fn through_serde_derive() {
        let s: Setting = serde_json::from_str(r#"{"seconds": "1m"}"#).unwrap();
        assert_eq!(s.seconds, 60 * S);
    }

    #[test]
    fn ranges_are_reported_with_units() {
        check_range("t", 5 * S, S, 60 * S).unwrap();
        let e = check_range("jwks_timeout", 120 * S, S, 60 * S).unwrap_err();
        assert_eq!(e.to_string(), "jwks_timeout must be from 1s to 1m, got 2m");
        let e = check_range("poll", Duration::ZERO, MS, S).unwrap_err();
        assert_eq!(e.to_string(), "poll must be from 1ms to 1s, got 0s");
    }

    #[test]
    fn both_names_are_refused() {
        let renamed = [Renamed::new("timeout_seconds", "timeout")];
        both_names(&renamed, "", |n| n == "timeout").unwrap();
        both_names(&renamed, "", |n| n == "timeout_seconds").unwrap();
        let e = both_names(&renamed, "x.", |_| true).unwrap_err();
        assert_eq!(
            e,
            "x.timeout and x.timeout_seconds are one setting (timeout_seconds is its former \
             name): set only timeout"
        );
    }
}
