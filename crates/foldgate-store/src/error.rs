//! What goes wrong talking to the database, and how callers should take it.

/// What went wrong talking to the database. Refusals that belong to the
/// folding contract (limits, depth, budget) are not errors here: they are
/// returned as values ([`crate::CreateRefusal`], [`crate::Finished`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value that the domain does not accept: a bug or a manual edit.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    #[error(
        "the database schema is at migration {applied:?}, this build needs {latest:?}: run `foldgate migrate`"
    )]
    NotMigrated { applied: Option<i64>, latest: Option<i64> },
    /// The operation kept losing races with concurrent changes to the same
    /// session; retrying it shortly will succeed.
    #[error("too many concurrent changes to one session")]
    Contended,
    #[error("unsupported database URL {0:?}: expected postgres://, postgresql:// or sqlite:")]
    UnsupportedUrl(String),
}

/// The kind of a [`StoreError`], for callers that act on it or count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// No pooled connection within the acquire timeout.
    PoolTimeout,
    /// The pool was closed.
    PoolClosed,
    /// The connection failed (I/O or TLS).
    Connection,
    /// The database answered with an error.
    Database,
    /// Any other failure of the driver (decoding, protocol, …).
    Driver,
    /// Applying the migrations failed.
    Migration,
    /// A stored value the domain does not accept.
    CorruptData,
    /// The schema is older than this build.
    NotMigrated,
    /// Too many concurrent changes to one session.
    Contended,
    /// The database URL names no supported backend.
    UnsupportedUrl,
}

impl ErrorKind {
    /// A short, fixed name (the `error.type` of metrics: the database's own
    /// messages would make unbounded series).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PoolTimeout => "pool_timeout",
            Self::PoolClosed => "pool_closed",
            Self::Connection => "connection",
            Self::Database => "database_error",
            Self::Driver => "driver_error",
            Self::Migration => "migration",
            Self::CorruptData => "corrupt_data",
            Self::NotMigrated => "not_migrated",
            Self::Contended => "contended",
            Self::UnsupportedUrl => "unsupported_url",
        }
    }
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Database(sqlx::Error::PoolTimedOut) => ErrorKind::PoolTimeout,
            Self::Database(sqlx::Error::PoolClosed) => ErrorKind::PoolClosed,
            Self::Database(sqlx::Error::Io(_) | sqlx::Error::Tls(_)) => ErrorKind::Connection,
            Self::Database(sqlx::Error::Database(_)) => ErrorKind::Database,
            Self::Database(_) => ErrorKind::Driver,
            Self::Migrate(_) => ErrorKind::Migration,
            Self::Corrupt(_) => ErrorKind::CorruptData,
            Self::NotMigrated { .. } => ErrorKind::NotMigrated,
            Self::Contended => ErrorKind::Contended,
            Self::UnsupportedUrl(_) => ErrorKind::UnsupportedUrl,
        }
    }

    /// [`ErrorKind::as_str`] of this error.
    pub fn error_type(&self) -> &'static str {
        self.kind().as_str()
    }

    /// Whether the database cannot be reached (no connection within the
    /// pool's acquire timeout, a connection lost, the server shutting down
    /// or refusing connections) rather than that a statement failed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Database(
                sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::Io(_)
                | sqlx::Error::Tls(_),
            ) => true,
            Self::Database(sqlx::Error::Database(db)) => db.code().is_some_and(|code| {
                // Class 08: connection exception; 57P0x: the server is
                // shutting down or starting; 53300: too many connections.
                code.starts_with("08") || code.starts_with("57P") || code == "53300"
            }),
            _ => false,
        }
    }

    /// The database error code (SQLSTATE on Postgres, the extended result
    /// code on SQLite), if the database answered with an error.
    pub(crate) fn database_code(&self) -> Option<std::borrow::Cow<'_, str>> {
        match self {
            Self::Database(e) => e.as_database_error().and_then(|d| d.code()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_availability() {
        let closed = StoreError::Database(sqlx::Error::PoolClosed);
        assert_eq!(closed.error_type(), "pool_closed");
        assert!(closed.is_unavailable());
        let timeout = StoreError::Database(sqlx::Error::PoolTimedOut);
        assert_eq!(timeout.kind(), ErrorKind::PoolTimeout);
        assert!(timeout.is_unavailable());
        let io = StoreError::Database(sqlx::Error::Io(std::io::Error::other("reset")));
        assert_eq!(io.error_type(), "connection");
        assert!(io.is_unavailable());
        let missing = StoreError::Database(sqlx::Error::RowNotFound);
        assert_eq!(missing.error_type(), "driver_error");
        assert!(!missing.is_unavailable());
        assert_eq!(StoreError::Contended.error_type(), "contended");
        assert!(!StoreError::Contended.is_unavailable());
        assert_eq!(StoreError::Corrupt(String::new()).error_type(), "corrupt_data");
        let stale = StoreError::NotMigrated { applied: None, latest: Some(1) };
        assert_eq!(stale.error_type(), "not_migrated");
        assert_eq!(StoreError::UnsupportedUrl(String::new()).error_type(), "unsupported_url");
    }
}
