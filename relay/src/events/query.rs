//! Filter-to-SQL translation shared by both backends, with the read rules
//! (expiry, p-gating, channels, superseded revisions) and NIP-50 search.
//!
//! Both schemas name their tables and columns the same way (`events`,
//! `event_tags`), so one builder serves both; the [`Dialect`] only decides the
//! placeholder syntax, how a tag row refers to its event (SQLite: by the
//! event's `seq`; PostgreSQL: by its id) and how a tag value is compared
//! (PostgreSQL compares a bounded hash first so that its index never holds a
//! long value).

use std::fmt::Write;

use nostr::prelude::{Filter, SingleLetterTag};

use crate::events::ReadScope;
use crate::persistence::page::Ties;
use crate::persistence::sql::{Bind, Dialect, Q};

/// A filter's statement under construction (a [`Q`] and what decides
/// how its values are written).
#[derive(Debug)]
pub struct Sql {
    q: Q,
    dialect: Dialect,
    /// Write the values that choose a query's plan (kinds, authors, tag
    /// value hashes) into the text instead of binding them; see
    /// [`plan_depends_on_values`].
    inline_plan_values: bool,
}

impl Sql {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            q: Q {
                sql: String::with_capacity(256),
                binds: Vec::new(),
            },
            dialect,
            inline_plan_values: false,
        }
    }

    pub fn push(&mut self, s: &str) -> &mut Self {
        self.q.push(s);
        self
    }

    /// Appends the placeholder of `b` (the dialect's) and binds it.
    pub fn bind(&mut self, b: Bind) -> &mut Self {
        self.q.push_arg(self.dialect, b);
        self
    }

    /// The statement.
    pub fn into_q(self) -> Q {
        self.q
    }

    /// Whether the next filter's plan-deciding values are written into the
    /// text: on PostgreSQL, when its plan depends on them.
    fn plan_values_for(&mut self, f: &Filter) {
        self.inline_plan_values = self.dialect == Dialect::Postgres && plan_depends_on_values(f);
    }

    /// `(v1,v2,...)`, each value written by `each`.
    fn list(&mut self, items: impl IntoIterator<Item = Bind>, mut each: impl FnMut(&mut Self, Bind)) {
        self.push("(");
        for (i, b) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(",");
            }
            each(self, b);
        }
        self.push(")");
    }

    fn bind_list(&mut self, items: impl IntoIterator<Item = Bind>) {
        self.list(items, |s, b| {
            s.bind(b);
        });
    }

    /// `(v1,v2,...)` of values that may choose the plan: literals when
    /// [`Sql::inline_plan_values`] is set (only integers and bytes, which the
    /// relay parsed or computed itself, ever become literals), placeholders
    /// otherwise.
    fn plan_value_list(&mut self, items: impl IntoIterator<Item = Bind>) {
        self.list(items, Self::plan_value);
    }

    /// One value that may choose the plan (see [`Sql::plan_value_list`]).
    fn plan_value(&mut self, b: Bind) {
        match b {
            Bind::Int(n) if self.inline_plan_values => {
                write!(self.q.sql, "{n}").expect("writing to a String cannot fail")
            }
            Bind::Blob(bytes) if self.inline_plan_values => {
                write!(self.q.sql, "'\\x{}'::bytea", hex::encode(bytes))
                    .expect("writing to a String cannot fail")
            }
            other => {
                self.bind(other);
            }
        }
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
            self.plan_value_list(values.iter().map(|v| Bind::Blob(value_hash(v).to_vec())));
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
    search_joined: bool,
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
        sql.plan_value_list(authors.iter().map(|pk| Bind::Blob(pk.to_bytes().to_vec())));
    }
    if let Some(kinds) = f.kinds.as_ref().filter(|s| !s.is_empty()) {
        sql.push(" AND e.kind IN ");
        sql.plan_value_list(kinds.iter().map(|k| Bind::Int(i64::from(k.as_u16()))));
    }
    if let Some(since) = f.since {
        sql.push(" AND e.created_at >= ");
        sql.bind(Bind::Int(clamp_i64(since.as_secs())));
    }
    if let Some(until) = f.until {
        sql.push(" AND e.created_at <= ");
        sql.bind(Bind::Int(clamp_i64(until.as_secs())));
    }
    if let Some(query) = search_of(f).filter(|_| !search_joined) {
        sql.search_condition(&query);
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
        // `<>` each, not `NOT IN (…)`: SQLite builds a temporary b-tree
        // for an IN list of more than two values on every execution of the
        // statement, which was a third of an author query's time in SQLite
        // with the three default gated kinds (95 µs against 63 µs).
        sql.push(" AND ((");
        for (i, kind) in scope.gated_kinds.iter().enumerate() {
            sql.push(if i == 0 { "e.kind <> " } else { " AND e.kind <> " });
            sql.bind(Bind::Int(i64::from(*kind)));
        }
        sql.push(")");
        if let Some(viewer) = scope.viewer {
            // Its recipients (`p`) and its author read it.
            sql.push(" OR e.pubkey = ");
            sql.bind(Bind::Blob(viewer.to_bytes().to_vec()));
            sql.push(" OR (1=1");
            sql.tag_in(community, "p", [viewer.to_hex()]);
            sql.push(")");
        }
        sql.push(")");
    }
}

/// Whether the best plan for `f` depends on its values, so that one cached
/// plan for all of them could be a bad one. PostgreSQL runs REQ and COUNT
/// with cached ("generic") plans (`persistence::postgres`, the query pool): it
/// planned every REQ again otherwise, which was 40% of a query's time in the
/// database. A filter on ids, or on at most one of authors, kinds and one
/// tag with one value (and any time range, which every index serves
/// through its `created_at` column) has one best plan whatever the
/// values: the index of that one column. With two such columns (an
/// author's events of one kind) or several values of one (kinds 30023 and
/// 30024, rare, or 1 and 7, most of the store) the best plan depends on how
/// common the values are, which only the values tell: those are written
/// into the statement text, and the planner sees them.
pub fn plan_depends_on_values(f: &Filter) -> bool {
    if f.ids.as_ref().is_some_and(|ids| !ids.is_empty()) {
        return false;
    }
    let lists = [
        f.authors.as_ref().map_or(0, |a| a.len()),
        f.kinds.as_ref().map_or(0, |k| k.len()),
    ]
    .into_iter()
    .chain(f.generic_tags.values().map(|v| v.len()))
    .filter(|&n| n > 0);
    let (mut columns, mut most) = (0, 0);
    for n in lists {
        columns += 1;
        most = most.max(n);
    }
    columns > 1 || most > 1
}

/// `SELECT raw, created_at, id` for one filter, newest first, ties by lowest id.
/// Where a REQ's later page starts: just after the event with this
/// `(created_at, id)` in REQ order (newest first, ties by lowest id).
pub type After = (i64, [u8; 32]);

/// Appends "after `after` in REQ order" on the columns `at` and `id`:
/// `at <= c AND (at < c OR id > x)`, whose first half is a plain bound an
/// index on `at` can start from.
fn push_after(sql: &mut Sql, after: Option<After>, at: &str, id: &str) {
    let Some((created, last)) = after else { return };
    sql.push(&format!(" AND {at} <= "));
    sql.bind(Bind::Int(created));
    sql.push(&format!(" AND ({at} < "));
    sql.bind(Bind::Int(created));
    sql.push(&format!(" OR {id} > "));
    sql.bind(Bind::Blob(last.to_vec()));
    sql.push(")");
}

/// A REQ's statement, and how the rows it returns are put in REQ order.
#[derive(Debug, Clone)]
pub struct Select {
    pub q: Q,
    /// `Some` when the statement orders by `created_at` alone: the page
    /// orders each second's events by id (`persistence::page`).
    pub ties: Option<Ties>,
}

/// The columns of a REQ's statement, and their order: a page sorts each
/// run of rows of one `created_at` by `id`.
const TIES_BY_ID: Ties = Ties { by: 1, then: 2 };

/// One filter's events, newest first (ties by lowest id), at most `limit`,
/// from just after `after` when it is given (a REQ's later pages). A
/// filter with a NIP-50 `search` is ranked instead (best match first, then
/// newest), and its later pages skip the `offset` rows already read.
pub fn select_events(
    dialect: Dialect,
    community: &str,
    f: &Filter,
    limit: usize,
    position: Position,
    scope: &ReadScope,
) -> Select {
    let Position { after, offset } = position;
    let mut sql = Sql::new(dialect);
    sql.plan_values_for(f);
    if let Some(query) = search_of(f) {
        let q = select_search(sql, community, f, &query, limit, offset, scope);
        return Select { q, ties: None };
    }
    // A filter on one value of one tag (`#p: [me]`, `#h: [channel]`) is
    // served newest-first straight from the tag index, which is ordered by
    // (value, created_at): the top `limit` rows without a sort.
    let driver = if f.ids.as_ref().is_none_or(|s| s.is_empty()) {
        f.generic_tags.iter().find(|(_, values)| values.len() == 1)
    } else {
        None
    };
    // The columns the REQ's order is read from: the tag row's copy of the
    // time when a tag drives, and the event's id (SQLite) or the tag row's
    // copy of it (PostgreSQL, whose tag index ends with it).
    let (at, id) = match driver {
        Some((letter, values)) => {
            let value = values.iter().next().cloned().unwrap_or_default();
            push_tag_driven(&mut sql, community, f, scope, *letter, value);
            match dialect {
                Dialect::Sqlite => ("t.event_created_at", "e.id"),
                Dialect::Postgres => ("t.event_created_at", "t.event_id"),
            }
        }
        None => {
            sql.push(if by_author_window(dialect, f) {
                // The window's floor bounds each author's range of this
                // index; without the hint SQLite reads kind or time order
                // over every author's events and checks each row's author.
                "SELECT e.raw, e.created_at, e.id FROM events e INDEXED BY events_by_author WHERE e.community_id = "
            } else {
                "SELECT e.raw, e.created_at, e.id FROM events e WHERE e.community_id = "
            });
            sql.bind(Bind::Text(community.to_string()));
            push_filter(&mut sql, community, f, scope, None, false);
            ("e.created_at", "e.id")
        }
    };
    push_after(&mut sql, after, at, id);
    if dialect == Dialect::Sqlite && in_index_order(f) {
        // SQLite's time-ordered indexes end at the time (migrations 0024,
        // 0025): ordered by the id too, it would copy every row into a
        // sorter for each second. The page orders ties instead, and needs
        // no `LIMIT`: it stops reading once the page is full and the
        // second at its end is read.
        write!(sql.q.sql, " ORDER BY {at} DESC").expect("writing to a String cannot fail");
        return Select {
            q: sql.into_q(),
            ties: Some(TIES_BY_ID),
        };
    }
    write!(sql.q.sql, " ORDER BY {at} DESC, {id} ASC LIMIT ").expect("writing to a String cannot fail");
    // The limit is written into the statement, not bound: PostgreSQL plans
    // a statement with a bound `LIMIT` as if it returned a tenth of the
    // table, finds that cached ("generic") plan dearer than planning each
    // execution for its values, and so plans every REQ again (measured:
    // planning was 0.37 ms of an author query's 0.9 ms in the database).
    // With the number in the text the cached plan is costed for the rows a
    // REQ really takes. A `usize` the relay clamped: nothing a client wrote.
    write!(sql.q.sql, "{limit}").expect("writing to a String cannot fail");
    Select {
        q: sql.into_q(),
        ties: None,
    }
}

/// Whether SQLite reads a page of `f` by author window: a list of authors
/// (a follow list) that no single tag value drives (`push_tag_driven`),
/// without ids or search. Such a filter is read through the author index
/// for a window of time back from the page's start
/// (`events::windows::Windows`), the window widened until it holds the
/// page: the rows read follow the listed authors' recent events, not the
/// store's. Read otherwise, SQLite scans every author's events of the
/// kind (or of the whole store) newest first, checking each row's author
/// (docs/performance.md, "A follow list read by the store's order").
pub fn by_author_window(dialect: Dialect, f: &Filter) -> bool {
    dialect == Dialect::Sqlite
        && f.authors.as_ref().is_some_and(|a| a.len() >= 2)
        && f.ids.as_ref().is_none_or(|ids| ids.is_empty())
        && search_of(f).is_none()
        && !f.generic_tags.values().any(|values| values.len() == 1)
}

/// Whether every plan SQLite may choose for `f` reads its rows newest
/// first from one index (time, an author's or a kind's events by time, a
/// tag value's by time), so that a statement without a `LIMIT` is read
/// only as far as a page needs: at most one value of authors, of kinds
/// and of one tag, and no ids. With a list of several values (or ids)
/// SQLite may read every match and sort them; its sort keeps only the
/// `LIMIT` best when the statement has one, so those statements keep
/// theirs and order ties themselves.
fn in_index_order(f: &Filter) -> bool {
    f.ids.as_ref().is_none_or(|ids| ids.is_empty())
        && f.authors.as_ref().is_none_or(|a| a.len() <= 1)
        && f.kinds.as_ref().is_none_or(|k| k.len() <= 1)
        && f.generic_tags.len() <= 1
        && f.generic_tags.values().all(|v| v.len() <= 1)
}

/// `SELECT raw, created_at, id` of the events with the tag `letter` =
/// `value` that match the rest of `f`, from the tag index: newest first
/// without a sort.
fn push_tag_driven(
    sql: &mut Sql,
    community: &str,
    f: &Filter,
    scope: &ReadScope,
    letter: SingleLetterTag,
    value: String,
) {
    sql.push(match sql.dialect {
        Dialect::Sqlite => {
            "SELECT e.raw, e.created_at, e.id FROM event_tags t JOIN events e \
             ON e.seq = t.event_seq WHERE t.community_id = "
        }
        // The tag row's copy of `created_at` (written with the event's, in
        // its transaction) lets each row be looked up in its own time
        // partition by the primary key, instead of in every partition by id.
        Dialect::Postgres => {
            "SELECT e.raw, e.created_at, e.id FROM event_tags t JOIN events e \
             ON e.community_id = t.community_id AND e.created_at = t.event_created_at \
             AND e.id = t.event_id WHERE t.community_id = "
        }
    });
    sql.bind(Bind::Text(community.to_string()));
    sql.push(" AND t.name = ");
    sql.bind(Bind::Text(letter.to_string()));
    if sql.dialect == Dialect::Postgres {
        sql.push(" AND t.value_hash = ");
        sql.plan_value(Bind::Blob(value_hash(&value).to_vec()));
    }
    sql.push(" AND t.value = ");
    sql.bind(Bind::Text(value));
    sql.push(" AND e.community_id = ");
    sql.bind(Bind::Text(community.to_string()));
    // The other conditions (this tag's own one is the join's).
    push_filter(sql, community, f, scope, Some(&letter), false);
}

/// Where a filter's next page starts: after an event in REQ order (plain
/// filters), or after `offset` rows in rank order (search filters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    pub after: Option<After>,
    pub offset: usize,
}

/// The filter's NIP-50 query, when it has words (a search of only
/// extensions, or of nothing, constrains nothing).
pub fn search_of(f: &Filter) -> Option<protocol::search::Query> {
    let query = protocol::search::Query::parse(f.search.as_deref()?);
    (!query.is_empty()).then_some(query)
}

/// The PostgreSQL text search vector of an event, as its index is built
/// (migration 0013); a query must write it the same way to use the index.
const PG_SEARCH_VECTOR: &str =
    "to_tsvector('simple'::regconfig, (replace(e.raw, '\\u0000', '\\u0020')::json) ->> 'content')";

impl Sql {
    /// `AND <event matches query>`.
    fn search_condition(&mut self, query: &protocol::search::Query) {
        match self.dialect {
            Dialect::Sqlite => {
                self.push(" AND e.seq IN (SELECT rowid FROM event_search WHERE event_search MATCH ");
                self.bind(Bind::Text(query.fts5()));
                self.push(")");
            }
            Dialect::Postgres => {
                self.push(" AND ");
                self.push(PG_SEARCH_VECTOR);
                self.push(" @@ plainto_tsquery('simple'::regconfig, ");
                self.bind(Bind::Text(query.plain()));
                self.push(")");
            }
        }
    }
}

/// A bound on the work of one search, whatever the word: SQLite applies
/// the filter and the read rules to this many of the best-ranked matches
/// (a filter that keeps few of them returns fewer events); PostgreSQL
/// ranks this many of the newest matches that pass them.
pub const SEARCH_CANDIDATES: usize = 10_000;

/// A search filter's page: ranked (SQLite FTS5's bm25, PostgreSQL's
/// `ts_rank`), then newest first, `offset` rows on.
fn select_search(
    mut sql: Sql,
    community: &str,
    f: &Filter,
    query: &protocol::search::Query,
    limit: usize,
    offset: usize,
    scope: &ReadScope,
) -> Q {
    match sql.dialect {
        Dialect::Sqlite => {
            // The index drives (CROSS JOIN fixes SQLite's join order): with
            // a plain join SQLite walked the community's events and probed
            // the index for each, over 30 s a query on a million events.
            // Its best SEARCH_CANDIDATES matches are ranked there, then the
            // filter and the read rules keep theirs.
            sql.push(
                "SELECT e.raw, e.created_at, e.id FROM (SELECT rowid AS seq, rank FROM event_search \
                 WHERE event_search MATCH ",
            );
            sql.bind(Bind::Text(query.fts5()));
            write!(
                sql.q.sql,
                " ORDER BY rank LIMIT {SEARCH_CANDIDATES}) AS m CROSS JOIN events e ON e.seq = m.seq \
                 WHERE e.community_id = "
            )
            .expect("writing to a String cannot fail");
            sql.bind(Bind::Text(community.to_string()));
            push_filter(&mut sql, community, f, scope, None, true);
            sql.push(" ORDER BY m.rank, e.created_at DESC, e.id ASC");
        }
        Dialect::Postgres => {
            // The GIN index finds the matches but cannot rank them, and
            // ts_rank parses each candidate's JSON again: only the newest
            // SEARCH_CANDIDATES matches that pass the filter and the read
            // rules are ranked (a common word over a million events would
            // otherwise rank every one of them).
            sql.push("SELECT e.raw, e.created_at, e.id FROM (SELECT e.raw, e.created_at, e.id FROM events e WHERE e.community_id = ");
            sql.bind(Bind::Text(community.to_string()));
            push_filter(&mut sql, community, f, scope, None, false);
            write!(
                sql.q.sql,
                " ORDER BY e.created_at DESC, e.id ASC LIMIT {SEARCH_CANDIDATES}) AS e"
            )
            .expect("writing to a String cannot fail");
            sql.push(" ORDER BY ts_rank(");
            sql.push(PG_SEARCH_VECTOR);
            sql.push(", plainto_tsquery('simple'::regconfig, ");
            sql.bind(Bind::Text(query.plain()));
            sql.push(")) DESC, e.created_at DESC, e.id ASC");
        }
    }
    // Both numbers are the relay's own (the clamped limit, rows it read).
    let rows = limit.saturating_sub(offset);
    write!(sql.q.sql, " LIMIT {rows} OFFSET {offset}").expect("writing to a String cannot fail");
    sql.into_q()
}

/// `SELECT created_at, id` of at most `max` events matching `f` (its
/// `limit` aside), in no order: a NIP-77 sync's set.
pub fn select_items(dialect: Dialect, community: &str, f: &Filter, max: usize, scope: &ReadScope) -> Q {
    let mut sql = Sql::new(dialect);
    sql.push("SELECT e.created_at, e.id FROM events e WHERE e.community_id = ");
    sql.bind(Bind::Text(community.to_string()));
    sql.plan_values_for(f);
    push_filter(&mut sql, community, f, scope, None, false);
    write!(sql.q.sql, " LIMIT {max}").expect("writing to a String cannot fail");
    sql.into_q()
}

/// `SELECT COUNT(*)` of the distinct events matching any filter.
pub fn count_events(dialect: Dialect, community: &str, filters: &[Filter], scope: &ReadScope) -> Q {
    let mut sql = Sql::new(dialect);
    sql.push("SELECT COUNT(*) FROM (");
    for (i, f) in filters.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ");
        }
        sql.push("SELECT e.id FROM events e WHERE e.community_id = ");
        sql.bind(Bind::Text(community.to_string()));
        sql.plan_values_for(f);
        push_filter(&mut sql, community, f, scope, None, false);
    }
    sql.push(") AS matched");
    sql.into_q()
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Keys, Kind};

    fn scope() -> ReadScope {
        ReadScope {
            viewer: None,
            gated_kinds: vec![24620],
            now: 1_700_000_000,
            from: None,
        }
    }

    #[test]
    fn placeholders_are_the_dialects_in_bind_order() {
        for (d, want) in [
            (Dialect::Sqlite, "SELECT 1 WHERE a = ? AND b = ? AND c IN (?, ?)"),
            (
                Dialect::Postgres,
                "SELECT 1 WHERE a = $1 AND b = $2 AND c IN ($3, $4)",
            ),
        ] {
            let q = Q::new("SELECT 1 WHERE a = ")
                .arg(d, "x")
                .and(d, "b =", 2_i64)
                .push_text(" AND c IN ")
                .in_list(d, [3_i64, 4]);
            assert_eq!(q.sql, want);
            assert_eq!(q.binds.len(), 4);
        }
        let pk = Keys::generate().public_key();
        let f = Filter::new().author(pk).since(1.into());
        let sqlite = select_events(Dialect::Sqlite, "c", &f, 50, Position::default(), &scope()).q;
        assert!(!sqlite.sql.contains('$'), "{}", sqlite.sql);
        assert_eq!(sqlite.sql.matches('?').count(), sqlite.binds.len());
        let pg = select_events(Dialect::Postgres, "c", &f, 50, Position::default(), &scope()).q;
        let last = format!("${}", pg.binds.len());
        assert!(pg.sql.contains(&last) && !pg.sql.contains('?'), "{}", pg.sql);
    }

    #[test]
    fn sqlite_orders_ties_in_the_page_only_where_an_index_gives_time_order() {
        let (a, b) = (Keys::generate().public_key(), Keys::generate().public_key());
        let p = SingleLetterTag::from_char('p').expect("p");
        let select = |f: &Filter, d| select_events(d, "c", f, 50, Position::default(), &scope());
        for f in [
            Filter::new().author(a),
            Filter::new().author(a).kind(Kind::from_u16(1)).since(1.into()),
            Filter::new().custom_tag(p, a.to_hex()).author(b),
            Filter::new(),
        ] {
            let s = select(&f, Dialect::Sqlite);
            assert_eq!(s.ties, Some(TIES_BY_ID), "{f:?}");
            assert!(s.q.sql.ends_with("created_at DESC"), "{}", s.q.sql);
            let pg = select(&f, Dialect::Postgres);
            assert!(
                pg.ties.is_none() && pg.q.sql.ends_with("ASC LIMIT 50"),
                "{}",
                pg.q.sql
            );
        }
        for f in [
            Filter::new().authors([a, b]),
            Filter::new().kinds([Kind::from_u16(1), Kind::from_u16(7)]),
            Filter::new().id(nostr::prelude::EventId::from_byte_array([0; 32])),
            Filter::new()
                .custom_tag(p, a.to_hex())
                .custom_tag(SingleLetterTag::from_char('t').expect("t"), "x"),
        ] {
            let s = select(&f, Dialect::Sqlite);
            assert!(s.ties.is_none(), "{f:?}");
            assert!(s.q.sql.ends_with("id ASC LIMIT 50"), "{}", s.q.sql);
        }
    }

    #[test]
    fn a_follow_list_is_read_by_author_window_on_sqlite_only() {
        let (a, b) = (Keys::generate().public_key(), Keys::generate().public_key());
        let (p, t) = (
            SingleLetterTag::from_char('p').expect("p"),
            SingleLetterTag::from_char('t').expect("t"),
        );
        let follows = Filter::new().authors([a, b]).kind(Kind::from_u16(1));
        let windowed = [
            follows.clone(),
            Filter::new().authors([a, b]).custom_tags(t, ["x", "y"]),
        ];
        let plain = [
            Filter::new().author(a),
            follows
                .clone()
                .id(nostr::prelude::EventId::from_byte_array([0; 32])),
            follows.clone().custom_tag(p, a.to_hex()),
            follows.clone().search("word"),
            Filter::new().kinds([Kind::from_u16(1), Kind::from_u16(7)]),
        ];
        let select = |f: &Filter, d| select_events(d, "c", f, 50, Position::default(), &scope()).q.sql;
        for f in &windowed {
            assert!(by_author_window(Dialect::Sqlite, f), "{f:?}");
            assert!(!by_author_window(Dialect::Postgres, f), "{f:?}");
            assert!(select(f, Dialect::Sqlite).contains("INDEXED BY events_by_author"));
            assert!(!select(f, Dialect::Postgres).contains("INDEXED BY"));
        }
        for f in &plain {
            assert!(!by_author_window(Dialect::Sqlite, f), "{f:?}");
            assert!(!select(f, Dialect::Sqlite).contains("INDEXED BY"), "{f:?}");
        }
    }

    #[test]
    fn one_column_with_one_value_keeps_one_plan() {
        let pk = Keys::generate().public_key();
        let p = SingleLetterTag::from_char('p').expect("p");
        for f in [
            Filter::new().author(pk),
            Filter::new().kind(Kind::from_u16(7)).since(1.into()),
            Filter::new().custom_tag(p, pk.to_hex()),
            Filter::new().since(1.into()).until(2.into()),
            Filter::new()
                .id(nostr::prelude::EventId::from_byte_array([0; 32]))
                .kinds([Kind::from_u16(1), Kind::from_u16(7)]),
        ] {
            assert!(!plan_depends_on_values(&f), "{f:?}");
            let s = select_events(Dialect::Postgres, "c", &f, 50, Position::default(), &scope()).q;
            assert!(!s.sql.contains("::bytea"), "values bound, not written: {}", s.sql);
        }
    }

    #[test]
    fn values_that_choose_the_plan_are_written_into_the_statement() {
        let pk = Keys::generate().public_key();
        let p = SingleLetterTag::from_char('p').expect("p");
        let two_kinds = Filter::new().kinds([Kind::from_u16(30023), Kind::from_u16(30024)]);
        let author_and_kind = Filter::new().author(pk).kind(Kind::from_u16(0));
        let tag_and_kind = Filter::new().custom_tag(p, pk.to_hex()).kind(Kind::from_u16(9));
        for f in [&two_kinds, &author_and_kind, &tag_and_kind] {
            assert!(plan_depends_on_values(f), "{f:?}");
        }
        let s = select_events(
            Dialect::Postgres,
            "c",
            &two_kinds,
            50,
            Position::default(),
            &scope(),
        )
        .q;
        assert!(s.sql.contains("e.kind IN (30023,30024)"), "{}", s.sql);
        let s = select_events(
            Dialect::Postgres,
            "c",
            &author_and_kind,
            50,
            Position::default(),
            &scope(),
        )
        .q;
        let author = format!("e.pubkey IN ('\\x{}'::bytea)", pk.to_hex());
        assert!(
            s.sql.contains(&author) && s.sql.contains("e.kind IN (0)"),
            "{}",
            s.sql
        );
        let s = select_events(
            Dialect::Postgres,
            "c",
            &tag_and_kind,
            50,
            Position::default(),
            &scope(),
        )
        .q;
        let hash = format!(
            "t.value_hash = '\\x{}'::bytea",
            hex::encode(value_hash(&pk.to_hex()))
        );
        assert!(s.sql.contains(&hash), "{}", s.sql);
        // Text is never written into a statement, and SQLite binds everything.
        assert!(s
            .binds
            .iter()
            .any(|b| matches!(b, Bind::Text(v) if *v == pk.to_hex())));
        let s = select_events(
            Dialect::Sqlite,
            "c",
            &author_and_kind,
            50,
            Position::default(),
            &scope(),
        )
        .q;
        assert!(
            !s.sql.contains("::bytea") && !s.sql.contains("IN (0)"),
            "{}",
            s.sql
        );
    }
}
