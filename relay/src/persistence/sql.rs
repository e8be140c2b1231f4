//! The SQL builder of both backends: a statement and its binds ([`Q`]),
//! the values a statement binds ([`Bind`]), and what differs in how each
//! backend writes them ([`Dialect`]: placeholders, the clock). It knows
//! no table.

/// SQL flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A value to bind, in placeholder order.
#[derive(Debug, Clone)]
pub enum Bind {
    Int(i64),
    OptInt(Option<i64>),
    Text(String),
    OptText(Option<String>),
    OptBlob(Option<Vec<u8>>),
    Blob(Vec<u8>),
    Bool(bool),
    /// A `text[]` (PostgreSQL only; SQLite refuses it): one statement text
    /// for a list of any length, where a VALUES list would be a new
    /// statement (parsed and planned again) for every length.
    TextArray(Vec<String>),
    /// A `bigint[]`, like [`Bind::TextArray`].
    IntArray(Vec<i64>),
    /// A `bytea[]`, like [`Bind::TextArray`].
    BlobArray(Vec<Vec<u8>>),
}

impl Dialect {
    /// Appends the `row`th (0-based) tuple `(…)` of a multi-row `VALUES`
    /// whose rows are all `width` binds wide (a comma before all but the first).
    pub fn push_values_row(self, sql: &mut String, row: usize, width: usize) {
        self.push_values_row_after(sql, row, width, 0);
    }

    /// [`Dialect::push_values_row`] for a `VALUES` whose binds follow
    /// `before` other binds of the statement.
    pub fn push_values_row_after(self, sql: &mut String, row: usize, width: usize, before: usize) {
        sql.push_str(if row > 0 { ",(" } else { "(" });
        for c in 0..width {
            if c > 0 {
                sql.push_str(", ");
            }
            self.push_placeholder(sql, before + row * width + c + 1);
        }
        sql.push(')');
    }

    /// Appends the `n`th (1-based) placeholder of a statement whose
    /// placeholders all appear once, in bind order. SQLite gets anonymous
    /// `?`: sqlx resolves each named `$n` through
    /// `sqlite3_bind_parameter_name`, a linear scan inside SQLite, which
    /// made a statement of thousands of binds quadratic to bind.
    /// Never after a written `$n` (see [`Q`]).
    pub fn push_placeholder(self, sql: &mut String, n: usize) {
        debug_assert!(n >= 1);
        debug_assert!(
            self == Dialect::Postgres || !sql.contains('$'),
            "an SQLite statement built with placeholders has no written $n: {sql}"
        );
        match self {
            Dialect::Sqlite => sql.push('?'),
            Dialect::Postgres => {
                sql.push('$');
                sql.push_str(&n.to_string());
            }
        }
    }

    /// SQL expression for the database clock in unix seconds.
    pub fn now(self) -> &'static str {
        match self {
            Dialect::Sqlite => "unixepoch()",
            Dialect::Postgres => "CAST(floor(extract(epoch FROM now())) AS BIGINT)",
        }
    }
}

/// A statement and its binds: the one SQL builder of the store.
///
/// A statement is written either whole, with `$1…$n` in bind order (both
/// backends accept them) and [`Q::bind`] for each, or entirely piece by
/// piece with [`Q::push`] and [`Q::arg`], whose placeholders come from the
/// dialect ([`Dialect::push_placeholder`]: anonymous `?` on SQLite). Never
/// both in one statement: sqlx numbers SQLite's anonymous `?` apart from
/// the `$n` before them, so a `?` after `$1` would take `$1`'s value.
#[derive(Debug, Clone)]
pub struct Q {
    pub sql: String,
    pub binds: Vec<Bind>,
}

impl Q {
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            binds: Vec::new(),
        }
    }

    /// Adds the next bind, for a `$n` written in the text (in order).
    pub fn bind(mut self, b: impl Into<Bind>) -> Self {
        self.binds.push(b.into());
        self
    }

    /// Appends text.
    pub fn push(&mut self, s: &str) -> &mut Self {
        self.sql.push_str(s);
        self
    }

    /// Appends the placeholder of the next bind and binds `b`.
    pub fn push_arg(&mut self, d: Dialect, b: impl Into<Bind>) -> &mut Self {
        d.push_placeholder(&mut self.sql, self.binds.len() + 1);
        self.binds.push(b.into());
        self
    }

    /// [`Q::push_arg`], by value (for chains).
    pub fn arg(mut self, d: Dialect, b: impl Into<Bind>) -> Self {
        self.push_arg(d, b);
        self
    }

    /// Appends `(p, p, …)` binding `values` (at least one), as [`Q::arg`].
    pub fn in_list<B: Into<Bind>>(mut self, d: Dialect, values: impl IntoIterator<Item = B>) -> Self {
        self.sql.push('(');
        for (k, v) in values.into_iter().enumerate() {
            if k > 0 {
                self.sql.push_str(", ");
            }
            self.push_arg(d, v);
        }
        self.sql.push(')');
        self
    }

    /// [`Q::push`], by value (for chains).
    pub fn push_text(mut self, s: &str) -> Self {
        self.sql.push_str(s);
        self
    }

    /// Appends ` AND <column> <op> <placeholder>` binding `b` (a filter
    /// built from optional parts).
    pub fn and(mut self, d: Dialect, column_and_op: &str, b: impl Into<Bind>) -> Self {
        self.sql.push_str(" AND ");
        self.sql.push_str(column_and_op);
        self.sql.push(' ');
        self.push_arg(d, b);
        self
    }

    /// Appends the keyset condition of a page listed `ORDER BY created_at
    /// DESC, id DESC` that begins after the row (`created_at`, `id`), or
    /// before `created_at` when no id is given.
    pub fn before_key(self, d: Dialect, created_at: i64, id: Option<&str>) -> Self {
        match id {
            None => self.and(d, "created_at <", created_at),
            Some(id) => self
                .push_text(" AND (created_at < ")
                .arg(d, created_at)
                .push_text(" OR (created_at = ")
                .arg(d, created_at)
                .and(d, "id <", id)
                .push_text("))"),
        }
    }
}

impl From<i64> for Bind {
    fn from(v: i64) -> Self {
        Bind::Int(v)
    }
}
impl From<Option<i64>> for Bind {
    fn from(v: Option<i64>) -> Self {
        Bind::OptInt(v)
    }
}
impl From<bool> for Bind {
    fn from(v: bool) -> Self {
        Bind::Bool(v)
    }
}
impl From<String> for Bind {
    fn from(v: String) -> Self {
        Bind::Text(v)
    }
}
impl From<&str> for Bind {
    fn from(v: &str) -> Self {
        Bind::Text(v.to_string())
    }
}
impl From<&String> for Bind {
    fn from(v: &String) -> Self {
        Bind::Text(v.clone())
    }
}
impl From<Option<String>> for Bind {
    fn from(v: Option<String>) -> Self {
        Bind::OptText(v)
    }
}
impl From<Option<Vec<u8>>> for Bind {
    fn from(v: Option<Vec<u8>>) -> Self {
        Bind::OptBlob(v)
    }
}
impl From<Vec<String>> for Bind {
    fn from(v: Vec<String>) -> Self {
        Bind::TextArray(v)
    }
}

impl From<Vec<u8>> for Bind {
    fn from(v: Vec<u8>) -> Self {
        Bind::Blob(v)
    }
}
impl From<&[u8]> for Bind {
    fn from(v: &[u8]) -> Self {
        Bind::Blob(v.to_vec())
    }
}
impl From<[u8; 32]> for Bind {
    fn from(v: [u8; 32]) -> Self {
        Bind::Blob(v.to_vec())
    }
}

/// The longest first piece of `len` items for a multi-row statement: the
/// largest power of two at most `len` and at most `max` (a power of two).
/// Cut this way, a statement over a list of any length has one of
/// log2(`max`) + 1 texts, each parsed and planned once and then kept by
/// the statement cache; a piece of every length would be a statement of
/// its own to prepare for each length (5.7 % of the event writer's CPU
/// during ingest, docs/performance.md).
pub fn piece_len(len: usize, max: usize) -> usize {
    assert!(max.is_power_of_two(), "a piece's bound is a power of two");
    if len == 0 {
        return 0;
    }
    let largest = 1usize << (usize::BITS - 1 - len.leading_zeros());
    largest.min(max)
}

/// `items` cut into pieces of [`piece_len`], in order.
pub fn pieces<T>(items: &[T], max: usize) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        let n = piece_len(rest.len(), max);
        if n == 0 {
            return None;
        }
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        Some(piece)
    })
}

#[cfg(test)]
mod piece_tests {
    use super::{piece_len, pieces};

    #[test]
    fn pieces_are_powers_of_two_in_order() {
        assert_eq!(piece_len(0, 256), 0);
        assert_eq!(piece_len(1, 256), 1);
        assert_eq!(piece_len(255, 256), 128);
        assert_eq!(piece_len(256, 256), 256);
        assert_eq!(piece_len(700, 256), 256);
        let items: Vec<usize> = (0..700).collect();
        let lens: Vec<usize> = pieces(&items, 256).map(<[usize]>::len).collect();
        assert_eq!(lens, [256, 256, 128, 32, 16, 8, 4]);
        let joined: Vec<usize> = pieces(&items, 256).flatten().copied().collect();
        assert_eq!(joined, items);
        for n in 0..600 {
            let cut: Vec<usize> = pieces(&items[..n], 64).map(<[usize]>::len).collect();
            assert_eq!(cut.iter().sum::<usize>(), n);
            assert!(
                cut.iter().all(|l| l.is_power_of_two() && *l <= 64),
                "{n}: {cut:?}"
            );
            assert!(cut.windows(2).all(|w| w[0] >= w[1]), "{n}: {cut:?}");
        }
    }
}
