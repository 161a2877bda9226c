//! Every built-in rule has a true positive and a near miss, and both behave.

// Helpers outside #[test] functions fail loudly too.

use std::collections::BTreeSet;

use foldgate_scrub::RuleSet;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Samples {
    sample: Vec<Sample>,
}

#[derive(Debug, Deserialize)]
struct Sample {
    rule: String,
    positive: Vec<String>,
    negative: Vec<String>,
}

fn samples() -> Vec<Sample> {
    let src = include_str!("../data/builtin_samples.toml");
    toml::from_str::<Samples>(src).unwrap().sample
}

#[test]
fn builtin_set_loads_with_enough_rules() {
    let rules = RuleSet::builtin().unwrap();
    assert!(rules.rule_count() >= 60, "only {} rules", rules.rule_count());
    assert!(rules.skipped().is_empty());
}

#[test]
fn every_rule_has_samples_and_every_sample_names_a_rule() {
    let rules = RuleSet::builtin().unwrap();
    let ids: BTreeSet<&str> = rules.rule_ids().collect();
    let samples = samples();
    let sampled: BTreeSet<&str> = samples.iter().map(|s| s.rule.as_str()).collect();
    let missing: Vec<_> = ids.difference(&sampled).collect();
    let unknown: Vec<_> = sampled.difference(&ids).collect();
    assert!(missing.is_empty(), "rules without samples: {missing:?}");
    assert!(unknown.is_empty(), "samples for unknown rules: {unknown:?}");
    for s in &samples {
        assert!(!s.positive.is_empty(), "{} has no positive sample", s.rule);
        assert!(!s.negative.is_empty(), "{} has no negative sample", s.rule);
    }
}

#[test]
fn positives_are_redacted_by_their_rule() {
    let rules = RuleSet::builtin().unwrap();
    let mut failures = Vec::new();
    for s in samples() {
        for (i, template) in s.positive.iter().enumerate() {
            let mut rng = crate::common::Rng::from_label(&format!("{}/pos/{i}", s.rule));
            let (text, generated) = crate::common::expand(template, &mut rng);
            let out = rules.scrub_text(&text).unwrap();
            let marker = format!("[REDACTED:{}]", s.rule);
            if !out.text.contains(&marker) || out.report.count(&s.rule) == 0 {
                failures.push(format!("{}: not labelled in {:?} -> {:?}", s.rule, text, out.text));
                continue;
            }
            // Every generated piece at least 8 long is secret material; none
            // of it may be left visible.
            for g in generated.iter().filter(|g| g.len() >= 8) {
                if out.text.contains(g.as_str()) {
                    failures.push(format!("{}: {:?} left visible in {:?}", s.rule, g, out.text));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn near_misses_are_left_alone() {
    let rules = RuleSet::builtin().unwrap();
    let mut failures = Vec::new();
    for s in samples() {
        for (i, template) in s.negative.iter().enumerate() {
            let mut rng = crate::common::Rng::from_label(&format!("{}/neg/{i}", s.rule));
            let (text, _) = crate::common::expand(template, &mut rng);
            let out = rules.scrub_text(&text).unwrap();
            if !out.report.is_clean() {
                let fired: Vec<_> = out.report.by_rule().collect();
                failures.push(format!("{}: {:?} -> {:?} {:?}", s.rule, text, out.text, fired));
            }
        }
    }
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn redacted_output_scrubs_clean() {
    // Markers are recognised, so a second pass over scrubbed output finds
    // nothing new.
    let rules = RuleSet::builtin().unwrap();
    for s in samples() {
        for (i, template) in s.positive.iter().enumerate() {
            let mut rng = crate::common::Rng::from_label(&format!("{}/pos/{i}", s.rule));
            let (text, _) = crate::common::expand(template, &mut rng);
            let once = rules.scrub_text(&text).unwrap();
            let twice = rules.scrub_text(&once.text).unwrap();
            assert!(
                twice.report.is_clean(),
                "{}: second pass fired {:?} on {:?}",
                s.rule,
                twice.report.by_rule().collect::<Vec<_>>(),
                once.text
            );
        }
    }
}
