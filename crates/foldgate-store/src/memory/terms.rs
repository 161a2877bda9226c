//! The terms a query is ranked by, and how many of them an item shares.

use std::collections::HashSet;

use foldgate_domain::MemoryItem;
use rust_stemmers::Stemmer;

/// The terms of a free-text query, as both backends' queries take them:
/// lowercased words of letters and digits, English stop words left out,
/// each once, at most [`MAX_TERMS`].
pub fn query_terms(text: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in query_terms_unbounded(text) {
        if !terms.contains(&word) {
            terms.push(word);
        }
        if terms.len() == MAX_TERMS {
            break;
        }
    }
    terms
}

/// Every term of a text, lowercased, stop words left out.
fn query_terms_unbounded(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 2 && STOP_WORDS.binary_search(&w.as_str()).is_err())
}

/// The most terms a query is ranked by.
pub const MAX_TERMS: usize = 64;

/// How many candidates the database ranks for each item asked for, before
/// those sharing too few terms are left out.
pub(super) const CANDIDATES_PER_ITEM: u32 = 4;
/// The fewest candidates the database ranks.
pub(super) const MIN_CANDIDATES: u32 = 40;

/// The stems of a text's terms (Snowball English, as Postgres' `english`
/// configuration stems).
pub(super) fn stems(stemmer: &Stemmer, text: &str) -> HashSet<String> {
    query_terms_unbounded(text).map(|t| stemmer.stem(&t).into_owned()).collect()
}

/// How many of `query`'s stems `item` contains.
pub(super) fn matched_terms(
    stemmer: &Stemmer,
    query: &HashSet<String>,
    item: &MemoryItem,
) -> usize {
    let text = format!("{} {} {}", item.title, item.description, item.content);
    stems(stemmer, &text).intersection(query).count()
}

/// Words too common to say what a text is about (sorted, for the binary
/// search). Postgres' `english` configuration drops its own list; this one
/// serves SQLite, whose FTS5 keeps every word.
const STOP_WORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had",
    "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "if", "in", "into",
    "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no", "nor", "not", "now",
    "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "same",
    "she", "should", "so", "some", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very",
    "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will",
    "with", "would", "you", "your", "yours",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted_for_the_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn query_terms_are_the_words_that_say_something() {
        assert_eq!(
            query_terms("Fix the flaky test in CI: it's *timing*-dependent, the test!"),
            ["fix", "flaky", "test", "ci", "timing", "dependent"]
        );
        assert!(query_terms("a the of ' \" ) OR AND").is_empty());
        assert_eq!(query_terms(&"word ".repeat(500)).len(), 1);
        let many: String = (0..200).map(|i| format!("w{i} ")).collect();
        assert_eq!(query_terms(&many).len(), MAX_TERMS);
    }
}
