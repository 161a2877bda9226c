//! Timestamps as both backends store them.

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::{Database, Encode, Postgres, Sqlite, Type, encode::IsNull, error::BoxDynError};

/// A timestamp to bind as a query parameter: `timestamptz` on Postgres, and
/// on SQLite fixed-width RFC 3339 text in UTC with milliseconds, which
/// compares correctly as text. (Both decode back as `DateTime<Utc>`.)
#[derive(Debug, Clone, Copy)]
pub struct Ts(pub DateTime<Utc>);

impl Ts {
    pub fn opt(at: Option<DateTime<Utc>>) -> Option<Self> {
        at.map(Self)
    }

    fn text(&self) -> String {
        self.0.to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

impl Type<Postgres> for Ts {
    fn type_info() -> <Postgres as Database>::TypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl Encode<'_, Postgres> for Ts {
    fn encode_by_ref(
        &self,
        buf: &mut <Postgres as Database>::ArgumentBuffer,
    ) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<'_, Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Type<Sqlite> for Ts {
    fn type_info() -> <Sqlite as Database>::TypeInfo {
        <String as Type<Sqlite>>::type_info()
    }
}

impl Encode<'_, Sqlite> for Ts {
    fn encode_by_ref(
        &self,
        buf: &mut <Sqlite as Database>::ArgumentBuffer,
    ) -> Result<IsNull, BoxDynError> {
        <String as Encode<'_, Sqlite>>::encode(self.text(), buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_text_is_fixed_width_and_sorts_like_time() {
        let t0 = DateTime::<Utc>::from_timestamp_millis(1_700_000_000_000).unwrap();
        let t1 = t0 + chrono::Duration::milliseconds(1);
        let t2 = t0 + chrono::Duration::seconds(1);
        let (a, b, c) = (Ts(t0).text(), Ts(t1).text(), Ts(t2).text());
        assert_eq!(a, "2023-11-14T22:13:20.000Z");
        assert_eq!(a.len(), b.len());
        assert!(a < b && b < c);
    }
}
