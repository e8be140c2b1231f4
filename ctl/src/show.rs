//! Output for people: aligned tables, times as UTC dates with how long
//! ago, ids in full (they are what the next command takes).

/// `2026-12-02 12:30:05Z (3m ago)`; `-` for none.
pub fn when(unix: Option<i64>, now: i64) -> String {
    let Some(t) = unix else { return "-".into() };
    let Ok(at) = time::OffsetDateTime::from_unix_timestamp(t) else {
        return t.to_string();
    };
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]Z");
    let date = at.format(&format).unwrap_or_else(|_| t.to_string());
    let d = now - t;
    let span = |s: i64| match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    if d >= 0 {
        format!("{date} ({} ago)", span(d))
    } else {
        format!("{date} (in {})", span(-d))
    }
}

/// Prints rows under a header, each column as wide as its widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}

/// An optional text as a cell: `-` for none.
pub fn or_dash(v: Option<&str>) -> String {
    v.map_or_else(|| "-".into(), str::to_string)
}

/// `name  value` lines, the names padded to one width.
pub fn fields(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, value) in rows {
        println!("{name:<width$}  {value}");
    }
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_dates_and_spans() {
        assert_eq!(when(Some(0), 90), "1970-01-01 00:00:00Z (1m ago)");
        assert_eq!(when(Some(7200), 0), "1970-01-01 02:00:00Z (in 2h)");
        assert_eq!(when(None, 0), "-");
    }
}
