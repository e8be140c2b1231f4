//! A page of a statement's rows, as both backends read one: at most a
//! number of rows, and only while the first column's text fits a byte
//! budget (at least one row), and whether the statement had no more. When
//! a statement is ordered by one column only, [`Ties`] puts each run of
//! rows equal in it in order here, by a second column.
//!
//! Why ties are ordered here and not by the statement: on SQLite, a
//! statement ordered by two columns over an index holding only the first
//! sorts each run of equal values in a temporary b-tree, copying every row
//! (its whole event JSON) into it and out again; an index holding both
//! columns costs every insert a wider entry. Here a run is sorted in place
//! as the rows arrive, and almost every run is one row long.

use std::cmp::Ordering;

use crate::persistence::row::Row;
use crate::persistence::StoreError;

/// How the rows of a statement ordered by the integer column `by` alone
/// are put in their final order: each run of rows with equal `by` by the
/// bytes of column `then`, ascending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ties {
    pub by: usize,
    pub then: usize,
}

/// What one page may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Rows, at most.
    pub rows: usize,
    /// Bytes of the first column's text, at most (at least one row).
    pub bytes: usize,
    /// How runs of equal values are ordered (`None`: as the statement
    /// returns them).
    pub ties: Option<Ties>,
}

impl Bounds {
    /// Every row, in the statement's order.
    pub const ALL: Bounds = Bounds {
        rows: usize::MAX,
        bytes: usize::MAX,
        ties: None,
    };

    /// The first `rows` rows, in the statement's order.
    pub fn first_rows(rows: usize) -> Bounds {
        Bounds { rows, ..Bounds::ALL }
    }
}

/// Whether a page wants more rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    More,
    /// The page is complete and a row past it was offered: rows follow.
    Nothing,
}

/// Collects one page from rows offered in the statement's order.
#[derive(Debug)]
pub struct Collector {
    rows_max: usize,
    bytes_max: usize,
    ties: Option<Ties>,
    out: Vec<Row>,
    out_bytes: usize,
    /// The run of rows equal in `ties.by` not yet placed (ties only).
    run: Vec<Row>,
    run_key: Option<i64>,
    run_bytes: usize,
    /// Rows of `run` left out because they cannot fit the page: the
    /// page ends with the run.
    run_trimmed: bool,
}

impl Collector {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            rows_max: bounds.rows,
            bytes_max: bounds.bytes,
            ties: bounds.ties,
            out: Vec::new(),
            out_bytes: 0,
            run: Vec::new(),
            run_key: None,
            run_bytes: 0,
            run_trimmed: false,
        }
    }

    /// Whether a row offered now would be past the page (the caller may
    /// skip converting it: [`Wants::Nothing`] either way).
    pub fn is_full(&self) -> bool {
        self.run.is_empty() && self.out.len() == self.rows_max
    }

    /// The next row of the statement.
    pub fn offer(&mut self, row: Row) -> Result<Wants, StoreError> {
        let Some(ties) = self.ties else {
            return Ok(self.append(row));
        };
        let key = row.int(ties.by)?;
        if row.bytes_ref(ties.then).is_none() {
            return Err(StoreError::Corrupt(format!(
                "column {}: expected bytes to order ties by",
                ties.then
            )));
        }
        if self.run_key.is_some_and(|k| k != key) && self.place_run(ties) == Wants::Nothing {
            return Ok(Wants::Nothing);
        }
        if self.is_full() {
            return Ok(Wants::Nothing);
        }
        self.run_key = Some(key);
        self.run_bytes += row.first_text_len();
        self.run.push(row);
        let rows_left = self.rows_max - self.out.len();
        if self.run.len() > rows_left.saturating_mul(2) || self.run_bytes > self.bytes_max.saturating_mul(2) {
            self.trim_run(ties);
        }
        Ok(Wants::More)
    }

    /// The page after the statement's last row (`ended`) or after
    /// [`Wants::Nothing`], and whether no row follows it.
    pub fn finish(mut self, ended: bool) -> (Vec<Row>, bool) {
        let mut complete = ended;
        if let Some(ties) = self.ties {
            complete &= self.place_run(ties) == Wants::More;
        }
        debug_assert!(self.out.len() <= self.rows_max);
        (self.out, complete)
    }

    /// Takes `row` into the page if it fits.
    fn append(&mut self, row: Row) -> Wants {
        if self.out.len() == self.rows_max {
            return Wants::Nothing;
        }
        let len = row.first_text_len();
        if !self.out.is_empty() && self.out_bytes + len > self.bytes_max {
            return Wants::Nothing;
        }
        self.out_bytes += len;
        self.out.push(row);
        Wants::More
    }

    /// Puts the run in order and into the page, as much as fits.
    fn place_run(&mut self, ties: Ties) -> Wants {
        sort_run(&mut self.run, ties);
        let run = std::mem::take(&mut self.run);
        self.run_key = None;
        self.run_bytes = 0;
        for row in run {
            if self.append(row) == Wants::Nothing {
                return Wants::Nothing;
            }
        }
        if self.run_trimmed {
            return Wants::Nothing;
        }
        Wants::More
    }

    /// Drops the rows of the run that cannot be in the page whatever
    /// follows (bounding a long run of equal values to about twice the
    /// page).
    fn trim_run(&mut self, ties: Ties) {
        sort_run(&mut self.run, ties);
        let rows_left = self.rows_max - self.out.len();
        let (mut kept, mut bytes) = (0usize, self.out_bytes);
        for row in &self.run {
            let len = row.first_text_len();
            let first = self.out.is_empty() && kept == 0;
            if kept == rows_left || (!first && bytes + len > self.bytes_max) {
                break;
            }
            bytes += len;
            kept += 1;
        }
        if kept < self.run.len() {
            self.run.truncate(kept);
            self.run_trimmed = true;
        }
        self.run_bytes = self.run.iter().map(Row::first_text_len).sum();
    }
}

/// Orders a run by its tie column (every row has one: `offer` checked;
/// were one missing, it would sort first rather than break the order).
fn sort_run(run: &mut [Row], ties: Ties) {
    let order = |a: &Row, b: &Row| a.bytes_ref(ties.then).cmp(&b.bytes_ref(ties.then));
    if run.len() > 1 {
        run.sort_by(order);
    }
    debug_assert!(run.windows(2).all(|w| order(&w[0], &w[1]) != Ordering::Greater));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persistence::row::Val;

    /// A row `(json, at, id)` whose JSON is `size` bytes long.
    fn row(at: i64, id: u8, size: usize) -> Row {
        Row::from_parts(
            &["raw", "created_at", "id"],
            vec![Val::Text("x".repeat(size)), Val::Int(at), Val::Blob(vec![id])],
        )
    }

    const TIES: Option<Ties> = Some(Ties { by: 1, then: 2 });

    /// Offers `rows` until the page wants no more; the page's `(at, id)`s
    /// and whether it said the statement ended.
    fn page(rows: &[(i64, u8)], rows_max: usize, bytes_max: usize, size: usize) -> (Vec<(i64, u8)>, bool) {
        let mut c = Collector::new(Bounds {
            rows: rows_max,
            bytes: bytes_max,
            ties: TIES,
        });
        let mut ended = true;
        for &(at, id) in rows {
            if c.offer(row(at, id, size)).unwrap() == Wants::Nothing {
                ended = false;
                break;
            }
        }
        let (out, complete) = c.finish(ended);
        let keys = out
            .iter()
            .map(|r| (r.int(1).unwrap(), r.blob(2).unwrap()[0]))
            .collect();
        (keys, complete)
    }

    #[test]
    fn runs_of_equal_times_are_ordered_by_id() {
        let rows = [(9, 5), (9, 1), (8, 7), (7, 3), (7, 2), (7, 9)];
        assert_eq!(
            page(&rows, 10, 1 << 20, 1),
            (vec![(9, 1), (9, 5), (8, 7), (7, 2), (7, 3), (7, 9)], true)
        );
    }

    #[test]
    fn a_run_cut_by_the_page_gives_its_lowest_ids() {
        // Three rows wanted; the run at 7 holds 3, 2, 9, 1: the page takes
        // 2 and 1 in order, wherever they came in the run.
        let rows = [(9, 5), (7, 3), (7, 2), (7, 9), (7, 1), (6, 4)];
        assert_eq!(page(&rows, 3, 1 << 20, 1), (vec![(9, 5), (7, 1), (7, 2)], false));
        // Exactly full at a run's end, then the statement ends: complete.
        assert_eq!(
            page(&rows[..3], 3, 1 << 20, 1),
            (vec![(9, 5), (7, 2), (7, 3)], true)
        );
        // Exactly full at a run's end with a row after: rows follow.
        let rows = [(9, 5), (7, 3), (7, 2), (6, 1)];
        assert_eq!(page(&rows, 3, 1 << 20, 1), (vec![(9, 5), (7, 2), (7, 3)], false));
    }

    #[test]
    fn a_long_run_is_trimmed_to_the_page_and_keeps_its_lowest_ids() {
        let rows: Vec<(i64, u8)> = (0..200u8).rev().map(|id| (7, id)).collect();
        let mut c = Collector::new(Bounds {
            rows: 4,
            bytes: 1 << 20,
            ties: TIES,
        });
        for &(at, id) in &rows {
            assert_eq!(c.offer(row(at, id, 1)).unwrap(), Wants::More);
            assert!(c.run.len() <= 2 * 4, "the run stays within twice the page");
        }
        let (out, complete) = c.finish(true);
        let ids: Vec<u8> = out.iter().map(|r| r.blob(2).unwrap()[0]).collect();
        assert_eq!((ids, complete), (vec![0, 1, 2, 3], false));
    }

    #[test]
    fn the_byte_budget_cuts_a_run_too() {
        // 10-byte rows, 25 bytes: two rows; the first row always fits.
        let rows = [(7, 3), (7, 2), (7, 1)];
        assert_eq!(page(&rows, 10, 25, 10), (vec![(7, 1), (7, 2)], false));
        assert_eq!(page(&rows, 10, 5, 10), (vec![(7, 1)], false));
        let rows: Vec<(i64, u8)> = (0..100u8).rev().map(|id| (7, id)).collect();
        assert_eq!(page(&rows, 100, 25, 10), (vec![(7, 0), (7, 1)], false));
    }

    #[test]
    fn without_ties_rows_stay_in_statement_order() {
        let mut c = Collector::new(Bounds {
            rows: 2,
            bytes: 1 << 20,
            ties: None,
        });
        assert_eq!(c.offer(row(7, 3, 1)).unwrap(), Wants::More);
        assert_eq!(c.offer(row(7, 1, 1)).unwrap(), Wants::More);
        assert!(c.is_full());
        assert_eq!(c.offer(row(6, 0, 1)).unwrap(), Wants::Nothing);
        let (out, complete) = c.finish(false);
        let ids: Vec<u8> = out.iter().map(|r| r.blob(2).unwrap()[0]).collect();
        assert_eq!((ids, complete), (vec![3, 1], false));
    }

    #[test]
    fn a_row_without_the_tie_column_is_refused() {
        let mut c = Collector::new(Bounds {
            rows: 2,
            bytes: 1 << 20,
            ties: Some(Ties { by: 1, then: 0 }),
        });
        let r = Row::from_parts(&["raw", "created_at"], vec![Val::Null, Val::Int(1)]);
        assert!(c.offer(r).is_err());
    }
}
