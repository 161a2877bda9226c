//! Token counting. The gateway counts every token it meters itself; agents
//! never report their own usage.

use std::{fmt, sync::Arc};

use foldgate_domain::Tokens;
use serde::Deserialize;
use tiktoken_rs::CoreBPE;

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
        Ok(Self { bpe: Arc::new(bpe), encoding })
    }

    pub fn count(&self, text: &str) -> Tokens {
        // Special-token text in agent input is counted as ordinary text.
        Tokens::try_from(self.bpe.encode_ordinary(text).len()).unwrap_or(Tokens::MAX)
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
}
