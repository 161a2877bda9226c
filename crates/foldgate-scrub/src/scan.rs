//! Finding secrets in text and redacting them.
//!
//! Scanning a text runs in four steps:
//!
//! 1. the keyword prefilter picks the rules worth running;
//! 2. each picked rule's regex yields candidates, filtered by the entropy
//!    gate and the allowlists;
//! 3. every other occurrence of a found secret value is added, so a secret
//!    that is recognisable in one place (`password=…`) is also hidden where
//!    it is not (an echo of the same value later in a log);
//! 4. overlapping spans are merged and replaced with `[REDACTED:rule-id]`,
//!    and the unredacted remainder is checked for surviving secret values.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, Input, MatchKind};

use crate::error::ScrubError;
use crate::report::Report;
use crate::rules::{Candidate, Rule};
use crate::ruleset::RuleSet;

/// Most passes a scrub makes. Redacting shortens the text around a secret,
/// and a rule whose pattern allows a bounded gap (`mysql … -p…`) may then
/// reach a secret it could not before; so a text in which a pass found
/// something is scanned again, until a pass finds nothing. Markers are
/// never taken for secrets, so each pass leaves less unredacted text and
/// the passes settle; past this many the text is refused (fail closed).
pub(crate) const MAX_PASSES: usize = 8;

/// Repeats `pass` on its own output, from the first pass's, until a pass
/// finds nothing; the reports add up. Refused past [`MAX_PASSES`].
pub(crate) fn settle<T>(
    first: (T, Report),
    pass: impl Fn(&T) -> Result<(T, Report), ScrubError>,
) -> Result<(T, Report), ScrubError> {
    let (mut out, mut report) = first;
    let mut found = !report.is_clean();
    let mut passes = 1;
    while found {
        let (again, more) = pass(&out)?;
        found = !more.is_clean();
        if found {
            passes += 1;
            if passes > MAX_PASSES {
                return Err(ScrubError::Internal("redacting does not settle"));
            }
            report.add(more);
            out = again;
        }
    }
    Ok((out, report))
}

/// Opening of every redaction marker.
pub(crate) const MARKER_PREFIX: &str = "[REDACTED:";

/// A secret located in a text: the byte span to redact and the rule that
/// found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finding {
    pub start: usize,
    pub end: usize,
    pub rule: usize,
}

/// The result of scrubbing text: the redacted text and what was redacted.
///
/// `text` holds no secret that was detected, so `Debug` output is safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scrubbed {
    /// The input with every detected secret replaced by `[REDACTED:rule-id]`.
    pub text: String,
    /// Counts of redactions per rule.
    pub report: Report,
}

impl RuleSet {
    /// Redacts every secret in `text`.
    ///
    /// # Errors
    /// [`ScrubError::InputTooLarge`] when `text` is over the configured
    /// limit, [`ScrubError::Internal`] if a detected value would survive.
    /// Either way the input must not be passed on.
    pub fn scrub_text(&self, text: &str) -> Result<Scrubbed, ScrubError> {
        let once = |text: &str| self.scrub_text_once(text).map(|s| (s.text, s.report));
        let (text, report) = settle(once(text)?, |text: &String| once(text))?;
        Ok(Scrubbed { text, report })
    }

    /// One pass of [`RuleSet::scrub_text`].
    fn scrub_text_once(&self, text: &str) -> Result<Scrubbed, ScrubError> {
        self.check_size(text.len())?;
        let findings = self.find(text);
        if findings.is_empty() {
            return Ok(Scrubbed { text: text.to_owned(), report: Report::default() });
        }
        let secrets = SecretIndex::build(text, &findings)?;
        let mut report = Report::default();
        let out = self.redact(text, findings, secrets.as_ref(), &mut report)?;
        Ok(Scrubbed { text: out, report })
    }

    pub(crate) fn check_size(&self, len: usize) -> Result<(), ScrubError> {
        if len > self.max_input_bytes {
            return Err(ScrubError::InputTooLarge { len, max: self.max_input_bytes });
        }
        Ok(())
    }

    /// Indexes of the rules to run on `text`: keyword-less rules plus those
    /// whose keyword occurs (ASCII case-insensitively).
    fn active_rules(&self, text: &str) -> Vec<usize> {
        let mut active = vec![false; self.rules.len()];
        for &i in &self.always {
            active[i] = true;
        }
        if let Some(prefilter) = &self.prefilter {
            let mut seen = vec![false; self.keyword_rules.len()];
            for m in prefilter.find_overlapping_iter(text) {
                let k = m.pattern().as_usize();
                if !seen[k] {
                    seen[k] = true;
                    for &r in &self.keyword_rules[k] {
                        active[r] = true;
                    }
                }
            }
        }
        active.iter().enumerate().filter_map(|(i, on)| on.then_some(i)).collect()
    }

    /// The spans of the redaction markers of these rules in `text`. A
    /// marker naming no rule of theirs is text like any other, so that a
    /// secret cannot hide in something shaped like a marker.
    fn markers(&self, text: &str) -> Vec<(usize, usize)> {
        marker_spans(text, |id| self.rules.iter().any(|rule| rule.id == id))
    }

    /// Every finding in `text`, unmerged and in no particular order.
    /// A span within a redaction marker is never a finding.
    pub(crate) fn find(&self, text: &str) -> Vec<Finding> {
        let markers = self.markers(text);
        let mut findings = Vec::new();
        for index in self.active_rules(text) {
            find_rule(&self.rules[index], index, text, &markers, &mut findings);
        }
        findings
    }

    /// What the scanner reports in `text` before anything is redacted: the
    /// byte span of each secret and the rule that found it. For the fuzz
    /// targets in `fuzz/` (compiled only with `--cfg fuzzing`).
    #[cfg(fuzzing)]
    pub fn detect(&self, text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
        self.find(text)
            .into_iter()
            .map(|f| (f.start..f.end, self.rules[f.rule].id.as_str()))
            .collect()
    }

    /// Replaces the (merged) findings and every occurrence of their values
    /// outside the redaction markers already in `text`.
    pub(crate) fn redact(
        &self,
        text: &str,
        mut findings: Vec<Finding>,
        secrets: Option<&SecretIndex>,
        report: &mut Report,
    ) -> Result<String, ScrubError> {
        let markers = self.markers(text);
        if let Some(index) = secrets {
            index.add_occurrences(text, &markers, &mut findings);
        }
        let regions = merge(findings, &self.rules);
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for region in &regions {
            let gap = text
                .get(last..region.start)
                .ok_or(ScrubError::Internal("finding is not on a character boundary"))?;
            check_gap(gap, last, secrets, &markers)?;
            out.push_str(gap);
            let rule = self
                .rules
                .get(region.rule)
                .ok_or(ScrubError::Internal("finding names an unknown rule"))?;
            out.push_str(MARKER_PREFIX);
            out.push_str(&rule.id);
            out.push(']');
            report.record(&rule.id);
            last = region.end;
        }
        let tail = text
            .get(last..)
            .ok_or(ScrubError::Internal("finding is not on a character boundary"))?;
        check_gap(tail, last, secrets, &markers)?;
        out.push_str(tail);
        Ok(out)
    }
}

/// Fails closed if a detected secret value survives in text that is about to
/// be passed on unchanged (`gap`, at `offset` in the text), outside the
/// redaction markers.
fn check_gap(
    gap: &str,
    offset: usize,
    secrets: Option<&SecretIndex>,
    markers: &[(usize, usize)],
) -> Result<(), ScrubError> {
    let Some(index) = secrets else { return Ok(()) };
    let mut survived = false;
    index.occurrences(gap, |start, end, _| {
        survived |= !inside_marker(markers, offset + start, offset + end);
    });
    if survived {
        return Err(ScrubError::Internal("a detected secret value survived redaction"));
    }
    Ok(())
}

/// Longest rule id a redaction marker is recognised with.
const MAX_MARKER_ID: usize = 256;

/// The spans of the redaction markers in `text` whose rule id is `known`,
/// in order. Their text is the scrubber's own: a rule that matches inside
/// one (a letter of `REDACTED`, say) must not redact it again, or each pass
/// would multiply the markers and the text.
fn marker_spans(text: &str, known: impl Fn(&str) -> bool) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(at) = text.get(from..).and_then(|rest| rest.find(MARKER_PREFIX)) {
        let start = from + at;
        let id_from = start + MARKER_PREFIX.len();
        let close =
            text.as_bytes()[id_from..].iter().take(MAX_MARKER_ID + 1).position(|&b| b == b']');
        match close.map(|c| id_from + c + 1) {
            Some(end) if is_marker(&text[start..end]) && known(&text[id_from..end - 1]) => {
                spans.push((start, end));
                from = end;
            }
            _ => from = id_from,
        }
    }
    spans
}

/// Whether `start..end` lies within one of the (ordered) marker spans.
fn inside_marker(markers: &[(usize, usize)], start: usize, end: usize) -> bool {
    let i = markers.partition_point(|&(s, _)| s <= start);
    i > 0 && end <= markers[i - 1].1
}

/// Runs one rule over `text`, appending accepted findings.
fn find_rule(
    rule: &Rule,
    index: usize,
    text: &str,
    markers: &[(usize, usize)],
    findings: &mut Vec<Finding>,
) {
    for caps in rule.regex.captures_iter(text) {
        let Some(whole) = caps.get(0) else { continue };
        // gitleaks trims newlines from the match so a rule ending in `\n`
        // does not swallow the line break; we also keep the text's layout.
        let (ms, me) = trim_newlines(text, whole.start(), whole.end());
        if ms >= me {
            continue;
        }
        let (ss, se) = secret_span(&caps, rule.secret_group).unwrap_or((ms, me));
        let secret = &text[ss..se];
        if rule.entropy > 0.0 && shannon_entropy(secret) <= rule.entropy {
            continue;
        }
        if inside_marker(markers, ss, se) {
            // Already redacted, by us or an earlier pass.
            continue;
        }
        if !rule.allowlists.is_empty() {
            let candidate =
                Candidate { secret, matched: &text[ms..me], line: line_around(text, ms, me) };
            if rule.allowlists.iter().any(|a| a.allows(&candidate)) {
                continue;
            }
        }
        findings.push(Finding { start: ss, end: se, rule: index });
    }
}

/// The secret's span: the configured group, or (with no group configured)
/// the first non-empty group. `None` means "use the whole match".
fn secret_span(caps: &regex::Captures<'_>, group: usize) -> Option<(usize, usize)> {
    let m = if group > 0 {
        caps.get(group)
    } else {
        caps.iter().skip(1).flatten().find(|m| !m.is_empty())
    }?;
    (!m.is_empty()).then(|| (m.start(), m.end()))
}

fn trim_newlines(text: &str, mut start: usize, mut end: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    while start < end && matches!(bytes[start], b'\n' | b'\r') {
        start += 1;
    }
    while end > start && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    (start, end)
}

/// The full line(s) containing `start..end`, for `regexTarget = "line"`.
fn line_around(text: &str, start: usize, end: usize) -> &str {
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    &text[line_start..line_end]
}

/// Whether `s` is exactly one redaction marker.
fn is_marker(s: &str) -> bool {
    s.strip_prefix(MARKER_PREFIX).and_then(|rest| rest.strip_suffix(']')).is_some_and(|id| {
        !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    })
}

/// Shannon entropy in bits per character.
pub(crate) fn shannon_entropy(s: &str) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    let mut ascii = [0u32; 128];
    let mut other: Vec<(char, u32)> = Vec::new();
    let mut len = 0u32;
    for c in s.chars() {
        len += 1;
        if c.is_ascii() {
            ascii[c as usize] += 1;
        } else if let Some(entry) = other.iter_mut().find(|(k, _)| *k == c) {
            entry.1 += 1;
        } else {
            other.push((c, 1));
        }
    }
    let len = f64::from(len);
    ascii
        .iter()
        .copied()
        .chain(other.iter().map(|(_, n)| *n))
        .filter(|&n| n > 0)
        .map(|n| {
            let p = f64::from(n) / len;
            -p * p.log2()
        })
        .sum()
}

/// Merges overlapping findings into disjoint regions, sorted by position.
///
/// A region is the union of everything that overlaps, so no part of any
/// secret stays visible. It is labelled by the finding that starts first;
/// on equal starts the longest, then a specific rule over a generic one,
/// then the earlier-loaded rule.
pub(crate) fn merge(mut findings: Vec<Finding>, rules: &[Rule]) -> Vec<Finding> {
    let generic = |i: usize| rules.get(i).is_some_and(|r| r.generic);
    findings.sort_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then(b.end.cmp(&a.end))
            .then(generic(a.rule).cmp(&generic(b.rule)))
            .then(a.rule.cmp(&b.rule))
    });
    let mut regions: Vec<Finding> = Vec::with_capacity(findings.len());
    for f in findings {
        match regions.last_mut() {
            Some(last) if f.start < last.end => last.end = last.end.max(f.end),
            _ => regions.push(f),
        }
    }
    regions
}

/// Length of the prefix of each secret that the occurrence search indexes;
/// candidates are then confirmed against the whole value. Indexing short
/// prefixes keeps building the index cheap even for PEM-sized secrets.
const PREFIX_LEN: usize = 16;

/// Every distinct secret value found in an input, for finding its other
/// occurrences and for the final leak check.
pub(crate) struct SecretIndex {
    /// Leftmost-longest search over the values' prefixes; this match kind
    /// lets the searcher use its fast (SIMD) prefilters.
    prefixes: AhoCorasick,
    /// The distinct values, longest first, with the rule that reported each.
    values: Vec<(String, usize)>,
}

impl SecretIndex {
    /// Builds the index from the findings of one text.
    pub(crate) fn build(text: &str, findings: &[Finding]) -> Result<Option<Self>, ScrubError> {
        Self::from_values(findings.iter().map(|f| (text.get(f.start..f.end), f.rule)))
    }

    /// Builds the index from `(value, rule)` pairs; a `None` value means a
    /// span that is not on character boundaries, an internal error.
    pub(crate) fn from_values<'a>(
        pairs: impl Iterator<Item = (Option<&'a str>, usize)>,
    ) -> Result<Option<Self>, ScrubError> {
        let mut values: Vec<(String, usize)> = Vec::new();
        for (value, rule) in pairs {
            let value =
                value.ok_or(ScrubError::Internal("finding is not on a character boundary"))?;
            if !value.is_empty() && !values.iter().any(|(v, _)| v == value) {
                values.push((value.to_owned(), rule));
            }
        }
        if values.is_empty() {
            return Ok(None);
        }
        // Longest first, so an occurrence is recorded with its full extent.
        values.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut prefixes: Vec<&[u8]> =
            values.iter().map(|(v, _)| &v.as_bytes()[..v.len().min(PREFIX_LEN)]).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let prefixes = AhoCorasickBuilder::new()
            .kind(Some(AhoCorasickKind::NoncontiguousNFA))
            .match_kind(MatchKind::LeftmostLongest)
            .build(&prefixes)
            .map_err(|_| ScrubError::Internal("cannot index detected secrets"))?;
        Ok(Some(Self { prefixes, values }))
    }

    /// Calls `found` with the span and rule of every occurrence of every
    /// value in `text`, overlapping ones included.
    fn occurrences(&self, text: &str, mut found: impl FnMut(usize, usize, usize)) {
        let mut pos = 0;
        while pos < text.len() {
            let input = Input::new(text).span(pos..text.len());
            let Some(m) = self.prefixes.find(input) else {
                break;
            };
            let start = m.start();
            let rest = &text.as_bytes()[start..];
            // Several values may start here (one a prefix of another, or a
            // value shorter than the indexed prefix); every one is recorded.
            for (value, rule) in &self.values {
                if rest.starts_with(value.as_bytes()) {
                    found(start, start + value.len(), *rule);
                }
            }
            // Restart just after this start rather than after the match, so
            // occurrences that overlap this one are found too.
            pos = start + 1;
        }
    }

    /// Adds a finding for every occurrence of a known secret value in
    /// `text` outside its redaction markers.
    pub(crate) fn add_occurrences(
        &self,
        text: &str,
        markers: &[(usize, usize)],
        findings: &mut Vec<Finding>,
    ) {
        self.occurrences(text, |start, end, rule| {
            if !inside_marker(markers, start, end) {
                findings.push(Finding { start, end, rule });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_matches_the_textbook_values() {
        assert_eq!(shannon_entropy(""), 0.0);
        assert_eq!(shannon_entropy("aaaa"), 0.0);
        assert!((shannon_entropy("ab") - 1.0).abs() < 1e-9);
        assert!((shannon_entropy("abcd") - 2.0).abs() < 1e-9);
        assert!((shannon_entropy("ééab") - 1.5).abs() < 1e-9);
    }

    #[test]
    fn markers_are_recognised_exactly() {
        assert!(is_marker("[REDACTED:github-pat]"));
        assert!(!is_marker("[REDACTED:]"));
        assert!(!is_marker("[REDACTED:a b]"));
        assert!(!is_marker("x[REDACTED:a]"));
    }

    #[test]
    fn merge_takes_the_union_and_labels_the_earliest_longest() {
        let f = |start, end, rule| Finding { start, end, rule };
        let merged = merge(vec![f(5, 9, 1), f(0, 6, 2), f(0, 4, 0), f(12, 14, 0)], &[]);
        assert_eq!(merged, vec![f(0, 9, 2), f(12, 14, 0)]);
    }

    #[test]
    fn occurrences_include_overlapping_and_nested_values() {
        let values = [
            (Some("abcdefghij"), 0),
            (Some("hijklmnopq"), 1),
            (Some("abcdefghijklmnopqrstuvwxyz"), 2),
            (Some("abc"), 3),
        ];
        let index = SecretIndex::from_values(values.into_iter()).unwrap().unwrap();
        let mut found = Vec::new();
        index.add_occurrences("xxabcdefghijklmnopqxx abc", &[], &mut found);
        found.sort_by_key(|f| (f.start, f.end));
        let spans: Vec<_> = found.iter().map(|f| (f.start, f.end, f.rule)).collect();
        assert_eq!(spans, vec![(2, 5, 3), (2, 12, 0), (9, 19, 1), (22, 25, 3)]);
        assert!(check_gap("..hijklmnopq..", 0, Some(&index), &[]).is_err());
        assert!(check_gap("ab cdefghi hijklmnop", 0, Some(&index), &[]).is_ok());
    }

    #[test]
    fn markers_are_located_and_their_insides_skipped() {
        let text = "a [REDACTED:x-1] b [REDACTED: c [REDACTED:] [REDACTED:z] [REDACTED:y]";
        let known = |id: &str| ["x-1", "y"].contains(&id);
        let spans = marker_spans(text, known);
        let shown: Vec<&str> = spans.iter().map(|&(s, e)| &text[s..e]).collect();
        assert_eq!(shown, ["[REDACTED:x-1]", "[REDACTED:y]"], "z names no rule");
        assert!(inside_marker(&spans, 3, 6));
        assert!(inside_marker(&spans, 2, 16));
        assert!(!inside_marker(&spans, 0, 3), "it begins before the marker");
        assert!(!inside_marker(&spans, 10, 18), "it ends after the marker");
        assert!(!inside_marker(&spans, 17, 18));
        let index = SecretIndex::from_values([(Some("RED"), 0)].into_iter()).unwrap().unwrap();
        let ok = "[REDACTED:y] ok";
        assert!(check_gap(ok, 0, Some(&index), &marker_spans(ok, known)).is_ok());
        let leak = "[REDACTED:y] RED";
        assert!(check_gap(leak, 0, Some(&index), &marker_spans(leak, known)).is_err());
    }

    #[test]
    fn trims_newlines_at_both_ends() {
        assert_eq!(trim_newlines("\nab\r\n", 0, 5), (1, 3));
        assert_eq!(trim_newlines("\n\n", 0, 2), (2, 2));
    }

    #[test]
    fn line_covers_whole_lines() {
        let t = "one\ntwo three\nfour";
        let start = t.find("three").unwrap();
        assert_eq!(line_around(t, start, start + 5), "two three");
        assert_eq!(line_around(t, 0, 3), "one");
    }
}
