//! Shared test support: deterministic synthetic secrets.
//!
//! Test data never contains a literal credential. Templates such as
//! `ghp_{an:36}` are expanded with characters from a seeded generator, so
//! every run sees the same format-valid but meaningless values.

#![allow(dead_code)]
// The scrub benchmark uses a part of this module.
// Test support: a broken template should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Seeds from a string, so each sample gets its own stream.
    pub fn from_label(label: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Self(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn string(&mut self, alphabet: &str, len: usize) -> String {
        let chars: Vec<char> = alphabet.chars().collect();
        (0..len).map(|_| chars[self.below(chars.len())]).collect()
    }
}

const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const DIGITS: &str = "0123456789";

fn alphabet(kind: &str) -> String {
    match kind {
        "an" => format!("{UPPER}{LOWER}{DIGITS}"),
        "alpha" => format!("{UPPER}{LOWER}"),
        "loan" => format!("{LOWER}{DIGITS}"),
        "UPAN" => format!("{UPPER}{DIGITS}"),
        "lo" => LOWER.to_owned(),
        "dig" => DIGITS.to_owned(),
        "hex" => "0123456789abcdef".to_owned(),
        "b32" => format!("{UPPER}234567"),
        "b64" => format!("{UPPER}{LOWER}{DIGITS}+/"),
        "b64u" => format!("{UPPER}{LOWER}{DIGITS}-_"),
        "bech" => "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L".to_owned(),
        other => panic!("unknown template kind {other}"),
    }
}

/// Expands a template, returning the text and the generated pieces (the
/// parts that must not survive scrubbing).
pub fn expand(template: &str, rng: &mut Rng) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut generated = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if tail.starts_with('{') {
            let close = tail.find('}').expect("unclosed placeholder");
            let spec = &tail[1..close];
            let value = if spec == "uuid" {
                let h = alphabet("hex");
                format!(
                    "{}-{}-4{}-a{}-{}",
                    rng.string(&h, 8),
                    rng.string(&h, 4),
                    rng.string(&h, 3),
                    rng.string(&h, 3),
                    rng.string(&h, 12)
                )
            } else {
                let (kind, len) = spec.split_once(':').expect("placeholder without length");
                rng.string(&alphabet(kind), len.parse().expect("bad length"))
            };
            out.push_str(&value);
            generated.push(value);
            rest = &tail[close + 1..];
        } else {
            panic!("lone '}}' in template {template}");
        }
    }
    out.push_str(rest);
    (out, generated)
}

/// A format-valid synthetic secret for a template.
pub fn secret(template: &str, seed: &str) -> String {
    expand(template, &mut Rng::from_label(seed)).0
}
