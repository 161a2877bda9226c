//! Structure-preserving scrubbing of JSON values.
//!
//! Every string in the value is scanned: object keys, string members, array
//! elements. A string member is also scanned in the context of its key, as
//! the text `"key": "value"`, so that a string under a `"password"` key is
//! caught by the same assignment rules that catch `password: …` in a config
//! file. Only the part of such a context finding that lies
//! inside the value is redacted.
//!
//! The walk happens twice over the same value: first to collect findings in
//! every string, then (once every secret value of the whole document is
//! known, so a secret found in one member is hidden in all others) to build
//! the redacted copy. Numbers, booleans and nulls are left as they are.

use serde_json::{Map, Value};

use crate::error::ScrubError;
use crate::report::Report;
use crate::ruleset::RuleSet;
use crate::scan::{Finding, SecretIndex, settle};

/// The result of scrubbing a JSON value.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrubbedJson {
    /// The input with every detected secret inside strings replaced by
    /// `[REDACTED:rule-id]`; still valid JSON of the same shape.
    pub value: Value,
    /// Counts of redactions per rule.
    pub report: Report,
}

/// One scanned string, in walk order.
struct Slot {
    findings: Vec<Finding>,
}

impl RuleSet {
    /// Redacts every secret inside the strings of `value`.
    ///
    /// # Errors
    /// [`ScrubError::InputTooLarge`] when the strings together exceed the
    /// size limit, [`ScrubError::TooDeep`] past the nesting limit,
    /// [`ScrubError::Internal`] if a detected value would survive.
    pub fn scrub_json(&self, value: &Value) -> Result<ScrubbedJson, ScrubError> {
        // Passes until one finds nothing, as `scrub_text` makes them.
        let once = |value: &Value| self.scrub_json_once(value).map(|s| (s.value, s.report));
        let (value, report) = settle(once(value)?, once)?;
        Ok(ScrubbedJson { value, report })
    }

    /// One pass of [`RuleSet::scrub_json`].
    fn scrub_json_once(&self, value: &Value) -> Result<ScrubbedJson, ScrubError> {
        let mut budget =
            Budget { bytes: 0, max_bytes: self.max_input_bytes, max_depth: self.max_json_depth };
        let mut strings: Vec<&str> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        self.collect(value, 0, &mut budget, &mut strings, &mut slots)?;

        let values = strings.iter().zip(&slots).flat_map(|(s, slot)| {
            slot.findings.iter().map(move |f| (s.get(f.start..f.end), f.rule))
        });
        let secrets = SecretIndex::from_values(values)?;
        let mut report = Report::default();
        let mut next = 0;
        let value = self.rebuild(value, secrets.as_ref(), &mut slots, &mut next, &mut report)?;
        if next != slots.len() {
            return Err(ScrubError::Internal("JSON walk visited strings unevenly"));
        }
        Ok(ScrubbedJson { value, report })
    }

    /// First walk: scan every string and record its findings.
    fn collect<'v>(
        &self,
        value: &'v Value,
        depth: usize,
        budget: &mut Budget,
        strings: &mut Vec<&'v str>,
        slots: &mut Vec<Slot>,
    ) -> Result<(), ScrubError> {
        budget.enter(depth)?;
        match value {
            Value::String(s) => {
                budget.add(s.len())?;
                strings.push(s);
                slots.push(Slot { findings: self.find(s) });
            }
            Value::Array(items) => {
                for item in items {
                    self.collect(item, depth + 1, budget, strings, slots)?;
                }
            }
            Value::Object(map) => {
                for (key, member) in map {
                    budget.add(key.len())?;
                    strings.push(key);
                    slots.push(Slot { findings: self.find(key) });
                    if let Value::String(s) = member {
                        budget.enter(depth + 1)?;
                        budget.add(s.len())?;
                        let mut findings = self.find(s);
                        self.find_in_key_context(key, s, &mut findings);
                        strings.push(s);
                        slots.push(Slot { findings });
                    } else {
                        self.collect(member, depth + 1, budget, strings, slots)?;
                    }
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        Ok(())
    }

    /// Scans `"key": "value"` and keeps the parts of findings that fall
    /// inside the value, translated to the value's offsets.
    ///
    /// Skipped when the key holds no rule keyword: then the context enables
    /// no rule that the value alone would not.
    fn find_in_key_context(&self, key: &str, value: &str, findings: &mut Vec<Finding>) {
        let key_has_keyword = self.prefilter.as_ref().is_some_and(|p| p.is_match(key));
        if !key_has_keyword {
            return;
        }
        let context = format!("\"{key}\": \"{value}\"");
        let offset = key.len() + 5;
        let value_end = offset + value.len();
        for f in self.find(&context) {
            let start = f.start.max(offset);
            let end = f.end.min(value_end);
            if start < end {
                findings.push(Finding { start: start - offset, end: end - offset, rule: f.rule });
            }
        }
    }

    /// Second walk: rebuild the value with redacted strings, consuming the
    /// slots in the order `collect` produced them.
    fn rebuild(
        &self,
        value: &Value,
        secrets: Option<&SecretIndex>,
        slots: &mut [Slot],
        next: &mut usize,
        report: &mut Report,
    ) -> Result<Value, ScrubError> {
        Ok(match value {
            Value::String(s) => Value::String(self.redact_slot(s, secrets, slots, next, report)?),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.rebuild(item, secrets, slots, next, report))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, member) in map {
                    let new_key = self.redact_slot(key, secrets, slots, next, report)?;
                    let new_member = self.rebuild(member, secrets, slots, next, report)?;
                    let unique = unique_key(&out, new_key);
                    out.insert(unique, new_member);
                }
                Value::Object(out)
            }
            other => other.clone(),
        })
    }

    fn redact_slot(
        &self,
        s: &str,
        secrets: Option<&SecretIndex>,
        slots: &mut [Slot],
        next: &mut usize,
        report: &mut Report,
    ) -> Result<String, ScrubError> {
        let slot = slots
            .get_mut(*next)
            .ok_or(ScrubError::Internal("JSON walk visited strings unevenly"))?;
        *next += 1;
        let findings = std::mem::take(&mut slot.findings);
        if secrets.is_none() {
            return Ok(s.to_owned());
        }
        self.redact(s, findings, secrets, report)
    }
}

/// Two keys that differ only in their secrets redact to the same text; keep
/// both members by suffixing the later one instead of overwriting.
fn unique_key(map: &Map<String, Value>, key: String) -> String {
    if !map.contains_key(&key) {
        return key;
    }
    (2..)
        .map(|n| format!("{key}#{n}"))
        .find(|candidate| !map.contains_key(candidate))
        .unwrap_or(key)
}

/// Limits on one JSON input.
struct Budget {
    bytes: usize,
    max_bytes: usize,
    max_depth: usize,
}

impl Budget {
    fn enter(&self, depth: usize) -> Result<(), ScrubError> {
        if depth > self.max_depth {
            return Err(ScrubError::TooDeep { max: self.max_depth });
        }
        Ok(())
    }

    fn add(&mut self, len: usize) -> Result<(), ScrubError> {
        self.bytes = self.bytes.saturating_add(len);
        if self.bytes > self.max_bytes {
            return Err(ScrubError::InputTooLarge { len: self.bytes, max: self.max_bytes });
        }
        Ok(())
    }
}
