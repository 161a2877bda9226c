//! The store's integration tests, in one binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

/// A pool onto the test database, to set up and read rows directly.
pub(crate) enum Pool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// Runs `$body` with `$pool` bound to whichever pool it is.
macro_rules! with_pool {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            Pool::Postgres($p) => $body,
            Pool::Sqlite($p) => $body,
        }
    };
}

impl Pool {
    /// A second pool on the test database, for what the store does not do.
    async fn connect(db: &foldgate_testkit::TestDb) -> Self {
        match db.backend {
            foldgate_testkit::Backend::Postgres => {
                Self::Postgres(sqlx::PgPool::connect(&db.url).await.unwrap())
            }
            foldgate_testkit::Backend::Sqlite => {
                Self::Sqlite(sqlx::SqlitePool::connect(&db.url).await.unwrap())
            }
        }
    }
}

mod admin;
mod charging;
mod extract;
mod folding;
mod memory;
mod metrics;
mod registrations;
mod vectors;
