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
}
