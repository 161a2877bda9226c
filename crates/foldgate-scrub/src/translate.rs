//! Translation of gitleaks' Go (RE2) regular expressions into the dialect of
//! the `regex` crate.
//!
//! The two dialects share almost all of their syntax. The differences that
//! matter for secret rules are:
//!
//! * Go's `\w`, `\d`, `\s` and `\b` are ASCII-only; Rust's are Unicode-aware.
//!   Unicode classes make the compiled automata much larger and Unicode word
//!   boundaries force the fast lazy DFA to give up on non-ASCII text, so we
//!   rewrite them to their ASCII meaning (which is also what the rule author
//!   tested against).
//! * Go accepts an escaped `<` or `>` as a literal; Rust reads `\<` and `\>`
//!   as word-boundary assertions.
//! * Inside a character class Go reads `[`, `&&`, `--` and `~~` literally;
//!   Rust reads them as nested classes and set operations.
//! * Go reads a `{` that does not start a valid counted repetition as a
//!   literal; Rust rejects it.
//! * Go supports `\Q…\E` literal quoting and octal escapes; Rust does not.
//!
//! Anything else is passed through unchanged, so a construct Rust does not
//! know still fails to compile and the rule is reported, never dropped.

use std::fmt::Write as _;

/// ASCII word characters, as Go's `\w` means them.
const WORD: &str = "0-9A-Za-z_";
/// ASCII digits, as Go's `\d` means them.
const DIGIT: &str = "0-9";
/// ASCII white space, as Go's `\s` means it (no vertical tab).
const SPACE: &str = r"\t\n\f\r ";

/// Rewrites a Go RE2 pattern into an equivalent pattern for the `regex` crate.
///
/// The translation is purely syntactic; it never fails. Patterns that are
/// invalid in Go stay invalid and are rejected when compiled.
pub(crate) fn go_to_rust(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i = escape_outside(&chars, i, &mut out),
            '[' => i = class(&chars, i, &mut out),
            '{' => {
                if let Some(end) = counted_repetition_end(&chars, i) {
                    out.extend(&chars[i..end]);
                    i = end;
                } else {
                    out.push_str(r"\{");
                    i += 1;
                }
            }
            '}' => {
                out.push_str(r"\}");
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Handles an escape sequence outside a character class starting at `i`
/// (which holds the backslash). Returns the index after the sequence.
fn escape_outside(chars: &[char], i: usize, out: &mut String) -> usize {
    let Some(&next) = chars.get(i + 1) else {
        // A trailing backslash is invalid in both dialects; keep it so the
        // compiler reports it.
        out.push('\\');
        return i + 1;
    };
    match next {
        'w' => write_class(out, false, WORD),
        'W' => write_class(out, true, WORD),
        'd' => write_class(out, false, DIGIT),
        'D' => write_class(out, true, DIGIT),
        's' => write_class(out, false, SPACE),
        'S' => write_class(out, true, SPACE),
        'b' => out.push_str(r"(?-u:\b)"),
        'B' => out.push_str(r"(?-u:\B)"),
        '<' | '>' => out.push(next),
        'Q' => return quoted_literal(chars, i + 2, out),
        '0'..='7' => return octal(chars, i + 1, out),
        _ => {
            out.push('\\');
            out.push(next);
        }
    }
    i + 2
}

/// Writes `[set]` or `[^set]`.
fn write_class(out: &mut String, negated: bool, set: &str) {
    out.push('[');
    if negated {
        out.push('^');
    }
    out.push_str(set);
    out.push(']');
}

/// Handles `\Q…\E`; `start` is the index after `\Q`.
fn quoted_literal(chars: &[char], start: usize, out: &mut String) -> usize {
    let mut j = start;
    let mut literal = String::new();
    while j < chars.len() {
        if chars[j] == '\\' && chars.get(j + 1) == Some(&'E') {
            out.push_str(&regex::escape(&literal));
            return j + 2;
        }
        literal.push(chars[j]);
        j += 1;
    }
    out.push_str(&regex::escape(&literal));
    j
}

/// Handles an octal escape; `start` is the index of its first digit.
///
/// Go reads `\0` and multi-digit `\NNN` as octal and a single `\1`..`\7` as
/// an (unsupported) back-reference. The latter is passed through so that it
/// is rejected by the compiler, as in Go.
fn octal(chars: &[char], start: usize, out: &mut String) -> usize {
    let mut j = start;
    let mut value: u32 = 0;
    while j < chars.len() && j < start + 3 && ('0'..='7').contains(&chars[j]) {
        value = value * 8 + chars[j].to_digit(8).unwrap_or(0);
        j += 1;
    }
    let single_non_zero = j == start + 1 && chars[start] != '0';
    if single_non_zero {
        out.push('\\');
        out.push(chars[start]);
    } else {
        let _ = write!(out, r"\x{{{value:x}}}");
    }
    j
}

/// If a valid counted repetition (`{n}`, `{n,}`, `{n,m}`) starts at `i`,
/// returns the index after its closing brace.
fn counted_repetition_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let digits_start = j;
    while j < chars.len() && chars[j].is_ascii_digit() {
        j += 1;
    }
    if j == digits_start {
        return None;
    }
    if chars.get(j) == Some(&',') {
        j += 1;
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
    }
    (chars.get(j) == Some(&'}')).then_some(j + 1)
}

/// Translates a character class starting at `i` (which holds `[`). Returns
/// the index after the closing `]`.
fn class(chars: &[char], i: usize, out: &mut String) -> usize {
    out.push('[');
    let mut j = i + 1;
    if chars.get(j) == Some(&'^') {
        out.push('^');
        j += 1;
    }
    // A `]` right after the opening bracket is a literal in both dialects,
    // but Rust warns about ambiguity less if it is escaped.
    if chars.get(j) == Some(&']') {
        out.push_str(r"\]");
        j += 1;
    }
    while j < chars.len() {
        let c = chars[j];
        match c {
            ']' => {
                out.push(']');
                return j + 1;
            }
            '[' => {
                if chars.get(j + 1) == Some(&':') {
                    // POSIX class such as `[:alpha:]`, identical in Rust.
                    if let Some(end) = posix_class_end(chars, j) {
                        out.extend(&chars[j..end]);
                        j = end;
                        continue;
                    }
                }
                out.push_str(r"\[");
            }
            '&' | '~' => {
                out.push('\\');
                out.push(c);
            }
            // `--` is a set difference in Rust; escaping the first dash keeps
            // Go's reading (a literal dash, possibly starting a range).
            '-' if chars.get(j + 1) == Some(&'-') => out.push_str(r"\-"),
            '\\' => {
                let Some(&next) = chars.get(j + 1) else {
                    out.push('\\');
                    return j + 1;
                };
                match next {
                    'w' => out.push_str(WORD),
                    'd' => out.push_str(DIGIT),
                    's' => out.push_str(SPACE),
                    'W' => write_class(out, true, WORD),
                    'D' => write_class(out, true, DIGIT),
                    'S' => write_class(out, true, SPACE),
                    '<' | '>' => out.push(next),
                    '0'..='7' => {
                        j = octal(chars, j + 1, out);
                        continue;
                    }
                    _ => {
                        out.push('\\');
                        out.push(next);
                    }
                }
                j += 2;
                continue;
            }
            _ => out.push(c),
        }
        j += 1;
    }
    // Unterminated class: leave it unterminated so compilation reports it.
    j
}

/// If a POSIX class `[:name:]` starts at `i`, returns the index after it.
fn posix_class_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i + 2;
    if chars.get(j) == Some(&'^') {
        j += 1;
    }
    while j < chars.len() && chars[j].is_ascii_alphabetic() {
        j += 1;
    }
    (chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&']')).then_some(j + 2)
}

#[cfg(test)]
mod tests {
    use super::go_to_rust;
    use regex::Regex;

    fn compiles(p: &str) -> Regex {
        Regex::new(&go_to_rust(p)).unwrap()
    }

    #[test]
    fn perl_classes_become_ascii() {
        let re = compiles(r"^\w+\s\d$");
        assert!(re.is_match("abc_1 7"));
        assert!(!re.is_match("ábc 7"), "Go's \\w is ASCII-only");
        let re = compiles(r"[\w.-]+");
        assert_eq!(re.find("é-a.b_c").unwrap().as_str(), "-a.b_c");
    }

    #[test]
    fn word_boundary_is_ascii() {
        let re = compiles(r"\bkey\b");
        assert!(re.is_match("a key here"));
        // With a Unicode boundary, `é` would be a word character.
        assert!(re.is_match("ékey"));
    }

    #[test]
    fn escaped_angle_brackets_are_literals() {
        let re = compiles(r"\<tag\>");
        assert!(re.is_match("<tag>"));
    }

    #[test]
    fn class_set_operators_are_literals() {
        let re = compiles(r"^[a&&b~~c]+$");
        assert!(re.is_match("&~abc"));
        // Go reads `--/` as the range from `-` to `/`.
        let re = compiles(r"^[--/]+$");
        assert!(re.is_match("-./"));
        assert!(!re.is_match("a"));
        let re = compiles(r"^[[a]+$");
        assert!(re.is_match("[a["));
    }

    #[test]
    fn posix_classes_survive() {
        let re = compiles(r"^[[:alpha:]]+$");
        assert!(re.is_match("abc"));
        assert!(!re.is_match("ab1"));
    }

    #[test]
    fn invalid_repetition_braces_are_literals() {
        let re = compiles(r"^\$\{[A-Z]+}$");
        assert!(re.is_match("${VAR}"));
        let re = compiles(r"^a{2,3}$");
        assert!(re.is_match("aa") && !re.is_match("a"));
        let re = compiles(r"^{,3}$");
        assert!(re.is_match("{,3}"));
    }

    #[test]
    fn quoted_literals_and_octal() {
        let re = compiles(r"^\Qa.b*\E$");
        assert!(re.is_match("a.b*"));
        assert!(!re.is_match("axb"));
        let re = compiles(r"^\101\0$");
        assert!(re.is_match("A\0"));
    }

    #[test]
    fn negated_classes_inside_classes() {
        let re = compiles(r"^[\S]+$");
        assert!(re.is_match("ab"));
        assert!(!re.is_match("a b"));
    }

    #[test]
    fn unsupported_constructs_still_fail() {
        assert!(Regex::new(&go_to_rust(r"(?=x)")).is_err());
        assert!(Regex::new(&go_to_rust(r"[a")).is_err());
        assert!(Regex::new(&go_to_rust(r"\1")).is_err());
    }
}
