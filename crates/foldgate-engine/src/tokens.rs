//! Token counting. The gateway counts every token it meters itself; agents
//! never report their own usage.

use std::{fmt, sync::Arc};

use foldgate_domain::Tokens;
use regex_automata::{Anchored, Input, meta::Regex};
use rustc_hash::FxHashMap;
use serde::Deserialize;
use tiktoken_rs::{CoreBPE, Rank};

/// A tokenizer vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4o and later models.
    #[default]
    O200kBase,
    /// GPT-4 and GPT-3.5 models.
    Cl100kBase,
}

/// Counts tokens. Building one loads a vocabulary (tens of milliseconds);
/// build it once at startup and share it — cloning is cheap.
#[derive(Clone)]
pub struct TokenCounter {
    bpe: Arc<CoreBPE>,
    /// The same count without the backtracking regex, where the encoding
    /// allows (see [`Splitter`]).
    splitter: Option<Arc<Splitter>>,
    encoding: Encoding,
}

impl fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCounter").field("encoding", &self.encoding).finish_non_exhaustive()
    }
}

impl TokenCounter {
    pub fn new(encoding: Encoding) -> Result<Self, String> {
        let bpe = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base(),
        }
        .map_err(|e| format!("loading the {encoding:?} tokenizer: {e}"))?;
        let splitter = match encoding {
            Encoding::O200kBase => Splitter::o200k(&bpe).map(Arc::new),
            Encoding::Cl100kBase => None,
        };
        Ok(Self { bpe: Arc::new(bpe), splitter, encoding })
    }

    pub fn count(&self, text: &str) -> Tokens {
        // Special-token text in agent input is counted as ordinary text.
        let count = match &self.splitter {
            Some(splitter) => splitter.count(text, &self.bpe),
            None => self.bpe.encode_ordinary(text).len(),
        };
        Tokens::try_from(count).unwrap_or(Tokens::MAX)
    }

    /// The longest prefix of `text` of at most `max` tokens, and its count.
    /// The cut falls on a token boundary that is also a character boundary.
    pub fn truncate(&self, text: &str, max: Tokens) -> (String, Tokens) {
        let tokens = self.bpe.encode_ordinary(text);
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if tokens.len() <= max {
            return (text.to_owned(), Tokens::try_from(tokens.len()).unwrap_or(Tokens::MAX));
        }
        // A token can end inside a multi-byte character: back off until the
        // prefix decodes.
        let mut keep = max;
        while keep > 0 {
            if let Ok(prefix) = self.bpe.decode(&tokens[..keep]) {
                return (prefix, Tokens::try_from(keep).unwrap_or(Tokens::MAX));
            }
            keep -= 1;
        }
        (String::new(), 0)
    }
}

/// Counts what `CoreBPE::encode_ordinary` counts, several times faster.
///
/// Encoding splits text into pieces with a regular expression and then
/// merges each piece's bytes into tokens. o200k's expression has one branch
/// that needs a backtracking engine, `\s+(?!\S)` (a run of whitespace, less
/// its last character when a word follows, which then starts that word), and
/// so tiktoken runs the whole expression on `fancy_regex`'s backtracking
/// engine: most of the cost of counting a short text. Here the expression
/// without that branch runs on `regex`'s automata, and the branch's effect
/// is applied to the matches: a match of whitespace only, without `\r` or
/// `\n` (the branch before it, `\s*[\r\n]+`, takes runs with those; other
/// line breaks such as U+2028 are whitespace like any other here), two or
/// more characters long and followed by more text gives its last character
/// back. Every character starts a match of some branch, so each piece begins
/// where the last one ended, and the search is anchored there: a forward
/// scan finds the end, with no reverse scan for the start. The pieces are
/// then merged as tiktoken merges them, with the vocabulary read back from
/// the loaded tokenizer.
struct Splitter {
    pieces: Regex,
    ranks: FxHashMap<Vec<u8>, Rank>,
}

/// o200k's expression as the splitter knows it (tiktoken-rs's
/// `O200K_BASE_PAT_STR`). The emulation depends on the order and the classes
/// of its branches, so a tiktoken whose expression differs in any way counts
/// with tiktoken instead.
const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);
/// The one branch of o200k's expression that `regex` cannot run.
const LOOKAHEAD_BRANCH: &str = r"|\s+(?!\S)";
/// Ordinary tokens in o200k (ranks 0 to this, less one); special tokens
/// come after.
const O200K_ORDINARY: Rank = 199_998;
/// Pieces at least this long are merged by tiktoken itself, whose merge for
/// them is O(n log n) where the one it exposes is quadratic.
const LONG_PIECE: usize = 100;

impl Splitter {
    /// `None` if this version of tiktoken does not match what the splitter
    /// assumes (its expression or its vocabulary); counting then stays with
    /// tiktoken.
    fn o200k(bpe: &CoreBPE) -> Option<Self> {
        let pattern = tiktoken_rs::O200K_BASE_PAT_STR;
        if pattern != O200K_PATTERN {
            return None;
        }
        let pieces = Regex::new(&pattern.replace(LOOKAHEAD_BRANCH, "")).ok()?;
        let mut ranks = FxHashMap::default();
        ranks.reserve(usize::try_from(O200K_ORDINARY).ok()?);
        for rank in 0..O200K_ORDINARY {
            ranks.insert(bpe.decode_bytes(&[rank]).ok()?, rank);
        }
        Some(Self { pieces, ranks })
    }

    fn count(&self, text: &str, bpe: &CoreBPE) -> usize {
        let mut count = 0;
        let mut at = 0;
        while at < text.len() {
            let input = Input::new(text).range(at..).anchored(Anchored::Yes);
            let found = self.pieces.search_half(&input).and_then(|m| text.get(at..m.offset()));
            // Every character starts a match, and none is empty; should one
            // not, count the rest as tiktoken does.
            let Some(mut piece) = found.filter(|p| !p.is_empty()) else {
                return count + bpe.encode_ordinary(&text[at..]).len();
            };
            if at + piece.len() < text.len()
                && piece.chars().all(char::is_whitespace)
                && !piece.contains(['\r', '\n'])
                && let Some((last, _)) =
                    piece.char_indices().nth(1).and(piece.char_indices().last())
            {
                piece = &piece[..last];
            }
            count += self.piece_tokens(piece, bpe);
            at += piece.len();
        }
        count
    }

    fn piece_tokens(&self, piece: &str, bpe: &CoreBPE) -> usize {
        // Every single byte is a token, so a piece not in the vocabulary is
        // at least two bytes long, as `byte_pair_split` requires.
        let bytes = piece.as_bytes();
        if self.ranks.contains_key(bytes) {
            1
        } else if bytes.len() < LONG_PIECE {
            tiktoken_rs::byte_pair_split(bytes, &self.ranks).len()
        } else {
            bpe.encode_ordinary(piece).len()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tokens_of_known_strings() {
        let counter = TokenCounter::new(Encoding::O200kBase).unwrap();
        assert_eq!(counter.count(""), 0);
        assert_eq!(counter.count("hello world"), 2);
        assert!(counter.count(&"lorem ipsum ".repeat(100)) >= 200);
        assert_eq!(counter.count("<|endoftext|>"), counter.count("<|endoftext|>"));
        let cl = TokenCounter::new(Encoding::Cl100kBase).unwrap();
        assert_eq!(cl.count("hello world"), 2);
    }

    #[test]
    fn truncates_at_a_token_and_character_boundary() {
        let counter = TokenCounter::new(Encoding::O200kBase).unwrap();
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let (cut, n) = counter.truncate(&text, 10);
        assert_eq!(n, 10);
        assert_eq!(counter.count(&cut), 10);
        assert!(text.starts_with(&cut));
        let (all, n) = counter.truncate("short", 10);
        assert_eq!((all.as_str(), n), ("short", 1));
        // Multi-byte characters are never split.
        let emoji = "🦀é漢字🦀".repeat(30);
        for max in 0..20 {
            let (cut, n) = counter.truncate(&emoji, max);
            assert!(n <= max && emoji.starts_with(&cut), "{max}");
            assert_eq!(counter.count(&cut), n);
        }
    }

    /// The splitter's count is tiktoken's on text made of what its
    /// expression tells apart: runs of each kind of whitespace and line
    /// break, before and after words, numbers, punctuation and marks.
    mod splitter {
        use std::sync::LazyLock;

        use proptest::prelude::*;

        use super::*;

        static COUNTER: LazyLock<TokenCounter> =
            LazyLock::new(|| TokenCounter::new(Encoding::O200kBase).unwrap());

        fn both(text: &str) -> (usize, usize) {
            let counter = &*COUNTER;
            let splitter = counter.splitter.as_ref().expect("o200k has a splitter");
            (splitter.count(text, &counter.bpe), counter.bpe.encode_ordinary(text).len())
        }

        const PARTS: &[&str] = &[
            " ",
            "  ",
            "   ",
            "\t",
            "\n",
            "\r\n",
            "\r",
            " \n ",
            "\u{a0}",
            "\u{3000}",
            "\u{2028}",
            "word",
            "Word",
            "WORD",
            "wORD",
            "don't",
            "DON'T",
            "we're",
            "I'll",
            "'s",
            "é",
            "É",
            "naïve",
            "漢字",
            "ひらがな",
            "한국어",
            "Ωμέγα",
            "\u{301}",
            "e\u{301}",
            "123",
            "4567",
            "²",
            "٣٤",
            "½",
            "3.14",
            "!",
            "?!",
            "...",
            "//",
            "/",
            "==",
            "->",
            "{\"a\":1}",
            "\\",
            "\"",
            "'",
            "#",
            "@",
            "🦀",
            "👍🏽",
            "\u{200d}",
            "\u{0}",
            "\u{7f}",
            "x",
            "Ab",
            "aB",
            "_",
        ];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3_000))]

            #[test]
            fn counts_as_tiktoken_does(parts in prop::collection::vec(prop::sample::select(PARTS), 0..24)) {
                let text = parts.concat();
                let (ours, theirs) = both(&text);
                prop_assert_eq!(ours, theirs, "{:?}", text);
            }

            #[test]
            fn counts_arbitrary_text_as_tiktoken_does(text in "\\PC{0,64}") {
                let (ours, theirs) = both(&text);
                prop_assert_eq!(ours, theirs, "{:?}", text);
            }
        }

        #[test]
        fn counts_documents_and_long_runs_as_tiktoken_does() {
            let long_runs = [
                " ".repeat(300) + "x",
                "=".repeat(5_000),
                "a".repeat(1_000) + " b",
                "\n".repeat(200) + "  \n  y",
                "🦀".repeat(200),
            ];
            let documents = [
                include_str!("../../../README.md"),
                include_str!("../../../docs/architecture.md"),
                include_str!("service/mod.rs"),
                include_str!("../../foldgate-scrub/src/builtin.toml"),
            ];
            for text in long_runs.iter().map(String::as_str).chain(documents) {
                let (ours, theirs) = both(text);
                assert_eq!(ours, theirs, "{:?}", text.get(..60));
            }
        }
    }
}
