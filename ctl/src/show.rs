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

/// Below a run's steps: why each skipped step was skipped (its condition
/// and what it read) and what each webhook call sent and got.
pub fn step_details(steps: &[protocol::api::StepView]) {
    for s in steps {
        if let Some(k) = &s.skipped {
            let read: Vec<String> = k
                .inputs
                .iter()
                .map(|i| {
                    let v = i
                        .value
                        .as_ref()
                        .map_or_else(|| "absent".to_string(), |v| v.to_string());
                    format!("{} = {v}", i.path)
                })
                .collect();
            println!(
                "skipped {}: `{}` was false; it read {}",
                s.id,
                k.condition,
                read.join(", ")
            );
        }
        if let Some(c) = &s.call {
            let answer = match (c.status, &c.error) {
                (Some(status), _) => {
                    let took = c.answered_at.map(|a| format!(" in {} s", (a - c.sent_at).max(0)));
                    let size = c.answer_bytes.unwrap_or(0);
                    format!("HTTP {status}, {size} B{}", took.unwrap_or_default())
                }
                (None, Some(e)) => format!("{}: {}", e.code, e.message),
                (None, None) => "no answer yet".to_string(),
            };
            println!(
                "call {}: {} {} ({} B, attempt {}): {answer}",
                s.id, c.method, c.url, c.request_bytes, c.attempt
            );
        }
    }
}

/// A workflow's latest ended runs in one line.
pub fn run_stats(st: &protocol::dashboard::RunStats) -> String {
    if st.ended == 0 {
        return "none ended yet".into();
    }
    let pct = st.success_rate.unwrap_or(0.0) * 100.0;
    let secs = |s: Option<i64>| s.map_or_else(|| "-".to_string(), |s| format!("{s} s"));
    format!(
        "{pct:.0}% of the last {} completed ({} failed, {} cancelled); completed in p50 {}, p95 {}, max {}",
        st.ended,
        st.failed,
        st.cancelled,
        secs(st.p50_secs),
        secs(st.p95_secs),
        secs(st.max_secs)
    )
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
