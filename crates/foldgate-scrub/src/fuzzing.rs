//! What the fuzz targets in `fuzz/` check scrubbing against: compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets.

use crate::RuleSet;

/// The text between the redaction markers that `rules` write, where no
/// reported secret may be found once a text is scrubbed. The text is split
/// at each marker as the rules spell it, not by the scanner's own marker
/// finder, so that the check shares nothing with what it checks; a secret
/// that happens to spell part of a marker, or that the text on both sides
/// of one spells, is not taken for one that survived.
pub fn unredacted(text: &str, rules: &RuleSet) -> Vec<String> {
    let mut parts = vec![text.to_owned()];
    for id in rules.rule_ids() {
        let marker = format!("[REDACTED:{id}]");
        parts = parts.iter().flat_map(|p| p.split(marker.as_str()).map(str::to_owned)).collect();
    }
    parts
}
