//! foldgate-upstream's integration tests.

mod search;
