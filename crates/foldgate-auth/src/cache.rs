//! Verified tokens, remembered by their SHA-256 so that an agent's next
//! request with the same token skips the signature check and the claim
//! rules. Per replica and bounded: at most `token_cache_entries` tokens, each
//! for at most `token_cache_ttl` and never past its own `exp`. The tokens
//! themselves are not kept.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use chrono::{DateTime, TimeDelta, Utc};
use sha2::{Digest, Sha256};

use crate::Authenticated;

/// The SHA-256 of a token.
pub(crate) type TokenHash = [u8; 32];

pub(crate) fn hash(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

#[derive(Debug)]
pub(crate) struct TokenCache {
    capacity: usize,
    ttl: TimeDelta,
    entries: Mutex<HashMap<TokenHash, Entry>>,
}

#[derive(Debug)]
struct Entry {
    caller: Authenticated,
    until: DateTime<Utc>,
}

impl TokenCache {
    /// A cache of at most `capacity` tokens, each kept at most `ttl`;
    /// `capacity` 0 keeps none.
    pub(crate) fn new(capacity: usize, ttl: TimeDelta) -> Self {
        Self { capacity, ttl, entries: Mutex::new(HashMap::new()) }
    }

    /// The caller a token was verified as, if that is still good at `now`.
    pub(crate) fn get(&self, token: &TokenHash, now: DateTime<Utc>) -> Option<Authenticated> {
        if self.capacity == 0 {
            return None;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(token) {
            Some(entry) if now < entry.until => Some(entry.caller.clone()),
            Some(_) => {
                entries.remove(token);
                None
            }
            None => None,
        }
    }

    /// Remembers a verified token until its `exp` or for the cache's time to
    /// live, whichever comes first. A token without `exp` is not kept. When
    /// full, expired entries go first, then arbitrary ones.
    pub(crate) fn put(&self, token: TokenHash, caller: &Authenticated, now: DateTime<Utc>) {
        let Some(expires_at) = caller.expires_at else { return };
        let until = expires_at.min(now + self.ttl);
        if self.capacity == 0 || until <= now {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(&token) {
            entries.retain(|_, entry| now < entry.until);
            // Still full of live entries: make room for an eighth more, so
            // that a burst of new tokens does not rescan the map each time.
            if entries.len() >= self.capacity {
                let drop = (self.capacity / 8).max(1);
                let victims: Vec<TokenHash> = entries.keys().take(drop).copied().collect();
                for victim in victims {
                    entries.remove(&victim);
                }
            }
        }
        entries.insert(token, Entry { caller: caller.clone(), until });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(exp: DateTime<Utc>) -> Authenticated {
        Authenticated { expires_at: Some(exp), ..Authenticated::local() }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + TimeDelta::seconds(secs)
    }

    #[test]
    fn a_token_is_kept_until_its_exp_or_the_ttl() {
        let cache = TokenCache::new(10, TimeDelta::seconds(60));
        let short = hash("short");
        let long = hash("long");
        cache.put(short, &caller(at(1_010)), at(1_000));
        cache.put(long, &caller(at(5_000)), at(1_000));
        assert!(cache.get(&short, at(1_009)).is_some());
        assert!(cache.get(&short, at(1_010)).is_none(), "not past its exp");
        assert!(cache.get(&long, at(1_059)).is_some());
        assert!(cache.get(&long, at(1_060)).is_none(), "not past the ttl");
        assert_eq!(cache.len(), 0, "expired entries are dropped when read");
    }

    #[test]
    fn tokens_without_exp_or_already_expired_are_not_kept() {
        let cache = TokenCache::new(10, TimeDelta::seconds(60));
        cache.put(hash("local"), &Authenticated::local(), at(0));
        cache.put(hash("stale"), &caller(at(5)), at(10));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let cache = TokenCache::new(0, TimeDelta::seconds(60));
        cache.put(hash("t"), &caller(at(100)), at(0));
        assert!(cache.get(&hash("t"), at(1)).is_none());
    }

    #[test]
    fn the_cache_never_holds_more_than_its_capacity() {
        let cache = TokenCache::new(16, TimeDelta::seconds(60));
        for i in 0..1_000 {
            cache.put(hash(&format!("token-{i}")), &caller(at(100)), at(0));
            assert!(cache.len() <= 16);
        }
        // The newest is always kept.
        assert!(cache.get(&hash("token-999"), at(1)).is_some());
        // Expired entries make room before live ones are dropped.
        let cache = TokenCache::new(2, TimeDelta::seconds(60));
        cache.put(hash("old"), &caller(at(5)), at(0));
        cache.put(hash("live"), &caller(at(100)), at(0));
        cache.put(hash("new"), &caller(at(100)), at(10));
        assert!(cache.get(&hash("live"), at(11)).is_some());
        assert!(cache.get(&hash("new"), at(11)).is_some());
    }

    #[test]
    fn different_tokens_do_not_share_an_entry() {
        let cache = TokenCache::new(10, TimeDelta::seconds(60));
        cache.put(hash("a"), &caller(at(100)), at(0));
        assert!(cache.get(&hash("b"), at(1)).is_none());
        assert!(cache.get(&hash("a "), at(1)).is_none());
    }
}
