//! A neutral row: what every statement of either backend returns, and how
//! the store's code reads its columns.

use std::sync::Arc;

use crate::persistence::StoreError;

/// A neutral column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    Bool(bool),
}

/// A stored name (a status, an outcome) as its type.
pub fn named<T>(s: &str, parse: fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown stored name {s:?}")))
}

/// A neutral row: its values and the names of its columns (one list per
/// result set, shared by its rows).
#[derive(Debug, Clone)]
pub struct Row {
    names: Names,
    vals: Vec<Val>,
}

/// The column names of a result set.
pub type Names = Arc<[Box<str>]>;

/// A column of a [`Row`]: by name (how decoders read rows), or by
/// position (single-column reads).
pub trait Col: Copy + std::fmt::Display {
    fn index(self, names: &[Box<str>]) -> Option<usize>;
}

impl Col for usize {
    fn index(self, _names: &[Box<str>]) -> Option<usize> {
        Some(self)
    }
}

impl Col for &str {
    fn index(self, names: &[Box<str>]) -> Option<usize> {
        names.iter().position(|n| **n == *self)
    }
}

impl Row {
    /// A row of `vals` under `names` (tests build rows without a database).
    #[cfg(test)]
    pub fn from_parts(names: &[&str], vals: Vec<Val>) -> Self {
        Row {
            names: names.iter().map(|n| Box::from(*n)).collect(),
            vals,
        }
    }

    fn col(&self, c: impl Col) -> Result<&Val, StoreError> {
        c.index(&self.names)
            .and_then(|i| self.vals.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("missing column {c}")))
    }

    /// A row of `vals` under its result set's `names`.
    pub(crate) fn of(names: Names, vals: Vec<Val>) -> Self {
        debug_assert_eq!(names.len(), vals.len(), "a value for each column");
        Row { names, vals }
    }

    /// The first value's length in bytes when it is text (a page's size).
    pub(crate) fn first_text_len(&self) -> usize {
        match self.vals.first() {
            Some(Val::Text(t)) => t.len(),
            _ => 0,
        }
    }

    /// Column `i`'s bytes when it is a blob or text, else `None` (an
    /// order over rows, without copying them).
    pub(crate) fn bytes_ref(&self, i: usize) -> Option<&[u8]> {
        match self.vals.get(i)? {
            Val::Blob(b) => Some(b),
            Val::Text(t) => Some(t.as_bytes()),
            _ => None,
        }
    }

    pub fn int(&self, c: impl Col) -> Result<i64, StoreError> {
        self.opt_int(c)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {c} is null")))
    }

    pub fn opt_int(&self, c: impl Col) -> Result<Option<i64>, StoreError> {
        match self.col(c)? {
            Val::Int(v) => Ok(Some(*v)),
            Val::Bool(b) => Ok(Some(i64::from(*b))),
            Val::Null => Ok(None),
            other => Err(StoreError::Corrupt(format!(
                "column {c}: expected integer, got {other:?}"
            ))),
        }
    }

    /// The text of column `c`, moved out of the row (for the large ones).
    pub fn take_text(&mut self, c: impl Col) -> Result<String, StoreError> {
        let i = c.index(&self.names);
        match i.and_then(|i| self.vals.get_mut(i)) {
            Some(Val::Text(v)) => Ok(std::mem::take(v)),
            Some(other) => Err(StoreError::Corrupt(format!(
                "column {c}: expected text, got {other:?}"
            ))),
            None => Err(StoreError::Corrupt(format!("missing column {c}"))),
        }
    }

    pub fn text(&self, c: impl Col) -> Result<String, StoreError> {
        self.opt_text(c)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {c} is null")))
    }

    pub fn opt_text(&self, c: impl Col) -> Result<Option<String>, StoreError> {
        match self.col(c)? {
            Val::Text(v) => Ok(Some(v.clone())),
            Val::Null => Ok(None),
            other => Err(StoreError::Corrupt(format!(
                "column {c}: expected text, got {other:?}"
            ))),
        }
    }

    pub fn blob(&self, c: impl Col) -> Result<Vec<u8>, StoreError> {
        self.opt_blob(c)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {c} is null")))
    }

    pub fn opt_blob(&self, c: impl Col) -> Result<Option<Vec<u8>>, StoreError> {
        match self.col(c)? {
            Val::Blob(v) => Ok(Some(v.clone())),
            Val::Null => Ok(None),
            other => Err(StoreError::Corrupt(format!(
                "column {c}: expected bytes, got {other:?}"
            ))),
        }
    }

    pub fn bool(&self, c: impl Col) -> Result<bool, StoreError> {
        match self.col(c)? {
            Val::Bool(b) => Ok(*b),
            Val::Int(v) => Ok(*v != 0),
            other => Err(StoreError::Corrupt(format!(
                "column {c}: expected boolean, got {other:?}"
            ))),
        }
    }

    pub fn id32(&self, c: impl Col) -> Result<[u8; 32], StoreError> {
        <[u8; 32]>::try_from(self.blob(c)?.as_slice())
            .map_err(|_| StoreError::Corrupt(format!("column {c} is not 32 bytes")))
    }
}
