//! Filter-to-SQL translation shared by both backends.
//!
//! Both schemas name their tables and columns the same way (`events`,
//! `event_tags`), so one builder serves both; the [`Dialect`] only decides the
//! placeholder syntax, how a tag row refers to its event (SQLite: by the
//! event's `seq`; PostgreSQL: by its id) and how a tag value is compared
//! (PostgreSQL compares a bounded hash first so that its index never holds a
//! long value).

use std::fmt::Write;

use nostr::prelude::{Filter, SingleLetterTag};

use super::ReadScope;

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
    pub fn push_placeholder(self, sql: &mut String, n: usize) {
        debug_assert!(n >= 1);
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

/// A statement under construction.
#[derive(Debug)]
pub struct Sql {
    pub text: String,
    pub binds: Vec<Bind>,
    dialect: Dialect,
}

impl Sql {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            text: String::with_capacity(256),
            binds: Vec::new(),
            dialect,
        }
    }

    pub fn push(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }

    /// Appends a placeholder for `b` (`$n`, which both backends accept).
    pub fn bind(&mut self, b: Bind) -> &mut Self {
        self.binds.push(b);
        let n = self.binds.len();
        write!(self.text, "${n}").expect("writing to a String cannot fail");
        self
    }

    fn bind_list(&mut self, items: impl IntoIterator<Item = Bind>) {
        self.push("(");
        for (i, b) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(",");
            }
            self.bind(b);
        }
        self.push(")");
    }

    /// `AND <tag match>`: the event has a tag `name` whose first value is one of `values`.
    fn tag_in(&mut self, community: &str, name: &str, values: impl IntoIterator<Item = String>) {
        // SQLite's tag index refers to events by seq (their rowid).
        self.push(match self.dialect {
            Dialect::Sqlite => " AND e.seq IN (SELECT t.event_seq FROM event_tags t WHERE t.community_id = ",
            Dialect::Postgres => " AND e.id IN (SELECT t.event_id FROM event_tags t WHERE t.community_id = ",
        });
        self.bind(Bind::Text(community.to_string()));
        self.push(" AND t.name = ");
        self.bind(Bind::Text(name.to_string()));
        let values: Vec<String> = values.into_iter().collect();
        if self.dialect == Dialect::Postgres {
            // The index is on the hash; the full comparison removes collisions.
            self.push(" AND t.value_hash IN ");
            self.bind_list(values.iter().map(|v| Bind::Blob(value_hash(v).to_vec())));
        }
        self.push(" AND t.value IN ");
        self.bind_list(values.into_iter().map(Bind::Text));
        self.push(")");
    }
}

/// The hash PostgreSQL indexes tag values by (first 16 bytes of SHA-256).
pub fn value_hash(value: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(value.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Appends the WHERE conditions of one filter plus the read scope to `sql`,
/// which must already contain `... FROM events e WHERE e.community_id = <bind>`.
/// `driven_by` names a tag whose one value the statement already joins on
/// (its condition is left out: as `e.id IN (subquery)` SQLite would build
/// the whole list of that value's events for every query, 128 ms per REQ
/// for a channel of 17,000 events).
pub fn push_filter(
    sql: &mut Sql,
    community: &str,
    f: &Filter,
    scope: &ReadScope,
    driven_by: Option<&SingleLetterTag>,
) {
    if let Some(ids) = f.ids.as_ref().filter(|s| !s.is_empty()) {
        sql.push(" AND e.id IN ");
        sql.bind_list(ids.iter().map(|id| Bind::Blob(id.as_bytes().to_vec())));
    } else {
        // Superseded workflow revisions answer only filters naming their id.
        sql.push(" AND e.superseded = FALSE");
    }

    if let Some(authors) = f.authors.as_ref().filter(|s| !s.is_empty()) {
        sql.push(" AND e.pubkey IN ");
        sql.bind_list(authors.iter().map(|pk| Bind::Blob(pk.to_bytes().to_vec())));
    }
    if let Some(kinds) = f.kinds.as_ref().filter(|s| !s.is_empty()) {
        sql.push(" AND e.kind IN ");
        sql.bind_list(kinds.iter().map(|k| Bind::Int(i64::from(k.as_u16()))));
    }
    if let Some(since) = f.since {
        sql.push(" AND e.created_at >= ");
        sql.bind(Bind::Int(clamp_i64(since.as_secs())));
    }
    if let Some(until) = f.until {
        sql.push(" AND e.created_at <= ");
        sql.bind(Bind::Int(clamp_i64(until.as_secs())));
    }
    sql.push(" AND (e.expires_at IS NULL OR e.expires_at > ");
    sql.bind(Bind::Int(clamp_i64(scope.now)));
    sql.push(")");
    for (letter, values) in &f.generic_tags {
        if Some(letter) == driven_by {
            continue;
        }
        if values.is_empty() {
            // As live matching (the nostr crate) reads it: `#x: []` matches nothing,
            // while an empty `ids`, `authors` or `kinds` places no constraint.
            sql.push(" AND 1=0");
            continue;
        }

        sql.tag_in(community, letter.as_ref(), values.iter().cloned());
    }
    // Channels: deleted ones are unreadable, private ones only for members.
    sql.push(" AND (e.channel IS NULL OR e.channel IN (SELECT c.id FROM channels c WHERE c.community_id = ");
    sql.bind(Bind::Text(community.to_string()));
    sql.push(" AND c.deleted = FALSE AND (c.private = FALSE");
    if let Some(viewer) = scope.viewer {
        sql.push(
            " OR EXISTS (SELECT 1 FROM channel_members m WHERE m.community_id = c.community_id \
             AND m.channel_id = c.id AND m.pubkey = ",
        );
        sql.bind(Bind::Blob(viewer.to_bytes().to_vec()));
        sql.push(")");
    }
    sql.push(")))");
    if !scope.gated_kinds.is_empty() {
        sql.push(" AND (e.kind NOT IN ");
        sql.bind_list(scope.gated_kinds.iter().map(|k| Bind::Int(i64::from(*k))));
        if let Some(viewer) = scope.viewer {
            sql.push(" OR (1=1");
            sql.tag_in(community, "p", [viewer.to_hex()]);
            sql.push(")");
        }
        sql.push(")");
    }
}

/// `SELECT raw, created_at, id` for one filter, newest first, ties by lowest id.
pub fn select_events(dialect: Dialect, community: &str, f: &Filter, limit: usize, scope: &ReadScope) -> Sql {
    let mut sql = Sql::new(dialect);
    // A filter on one value of one tag (`#p: [me]`, `#h: [channel]`) is
    // served newest-first straight from the tag index, which is ordered by
    // (value, created_at, id): the top `limit` rows without a sort.
    let driver = if f.ids.as_ref().is_none_or(|s| s.is_empty()) {
        f.generic_tags.iter().find(|(_, values)| values.len() == 1)
    } else {
        None
    };
    if let Some((letter, values)) = driver {
        let value = values.iter().next().cloned().unwrap_or_default();
        sql.push(match dialect {
            Dialect::Sqlite => {
                "SELECT e.raw, e.created_at, e.id FROM event_tags t JOIN events e \
                 ON e.seq = t.event_seq WHERE t.community_id = "
            }
            // The tag row's copy of `created_at` (written with the event's,
            // in its transaction) lets each row be looked up in its own time partition
            // by the primary key, instead of in every partition by id.
            Dialect::Postgres => {
                "SELECT e.raw, e.created_at, e.id FROM event_tags t JOIN events e \
                 ON e.community_id = t.community_id AND e.created_at = t.event_created_at \
                 AND e.id = t.event_id WHERE t.community_id = "
            }
        });
        sql.bind(Bind::Text(community.to_string()));
        sql.push(" AND t.name = ");
        sql.bind(Bind::Text(letter.to_string()));
        if dialect == Dialect::Postgres {
            sql.push(" AND t.value_hash = ");
            sql.bind(Bind::Blob(value_hash(&value).to_vec()));
        }
        sql.push(" AND t.value = ");
        sql.bind(Bind::Text(value));
        sql.push(" AND e.community_id = ");
        sql.bind(Bind::Text(community.to_string()));
        // The other conditions (this tag's own one is the join's).
        push_filter(&mut sql, community, f, scope, Some(letter));
        sql.push(" ORDER BY t.event_created_at DESC, t.event_id ASC LIMIT ");
    } else {
        sql.push("SELECT e.raw, e.created_at, e.id FROM events e WHERE e.community_id = ");
        sql.bind(Bind::Text(community.to_string()));
        push_filter(&mut sql, community, f, scope, None);
        sql.push(" ORDER BY e.created_at DESC, e.id ASC LIMIT ");
    }
    sql.bind(Bind::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
    sql
}

/// `SELECT COUNT(*)` of the distinct events matching any filter.
pub fn count_events(dialect: Dialect, community: &str, filters: &[Filter], scope: &ReadScope) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("SELECT COUNT(*) FROM (");
    for (i, f) in filters.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ");
        }
        sql.push("SELECT e.id FROM events e WHERE e.community_id = ");
        sql.bind(Bind::Text(community.to_string()));
        push_filter(&mut sql, community, f, scope, None);
    }
    sql.push(") AS matched");
    sql
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
