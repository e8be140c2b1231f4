//! Cron schedules in an IANA time zone (docs/workflows.md, "Triggers": a
//! `schedule` trigger with `cron` and `timezone`), parsed by `croner` (a
//! maintained POSIX/Vixie cron parser with DST rules) over `chrono-tz`'s
//! zone database.
//!
//! The engine keeps, per workflow, the last slot it fired; [`Cron::due`]
//! says which slot to fire now, if any: the latest one at or before now
//! and after the last fired. So a slot fires at most once (the store
//! records it in the transaction that starts its run), and after downtime
//! only the latest missed slot fires. A local time that a DST change skips
//! fires at the first instant after the gap; one that it repeats fires at
//! its first occurrence only.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};

/// Why a schedule is refused at publish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("cron must be 5 fields (minute hour day-of-month month day-of-week): {0}")]
    BadCron(String),
    #[error("unknown time zone {0:?}: use an IANA name such as Europe/Berlin")]
    BadZone(String),
}

/// A parsed cron schedule and its zone.
#[derive(Debug, Clone)]
pub struct Cron {
    cron: croner::Cron,
    zone: Tz,
}

impl Cron {
    /// Parses five-field `expr` in `timezone` (UTC when absent).
    pub fn parse(expr: &str, timezone: Option<&str>) -> Result<Self, ScheduleError> {
        let zone = match timezone {
            None => Tz::UTC,
            Some(name) => name
                .parse::<Tz>()
                .map_err(|_| ScheduleError::BadZone(name.to_string()))?,
        };
        if expr.split_whitespace().count() != 5 && !expr.trim_start().starts_with('@') {
            return Err(ScheduleError::BadCron(format!(
                "{expr:?} has {} fields",
                expr.split_whitespace().count()
            )));
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let cron = parser
            .parse(expr)
            .map_err(|e| ScheduleError::BadCron(format!("{expr:?}: {e}")))?;
        Ok(Self { cron, zone })
    }

    /// The slot (unix seconds) to fire at `now`: the latest slot at or
    /// before `now` that is after `last` (the last slot fired, or when the
    /// schedule took effect); `None` when there is none.
    pub fn due(&self, last: i64, now: i64) -> Option<i64> {
        let now = self
            .zone
            .from_utc_datetime(&DateTime::<Utc>::from_timestamp(now, 0)?.naive_utc());
        let slot = self.cron.find_previous_occurrence(&now, true).ok()?.timestamp();
        (slot > last).then_some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix seconds of a UTC date and time.
    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap().timestamp()
    }

    /// The slots fired when the engine looks every minute from `from` to
    /// `to` (UTC seconds), remembering the last fired.
    fn fired(c: &Cron, from: i64, to: i64) -> Vec<i64> {
        let mut last = from;
        let mut out = Vec::new();
        let mut t = from;
        while t <= to {
            if let Some(slot) = c.due(last, t) {
                out.push(slot);
                last = slot;
            }
            t += 60;
        }
        out
    }

    #[test]
    fn a_slot_fires_once_in_its_zone() {
        let c = Cron::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        // 9:00 in Berlin in June is 7:00 UTC.
        let day = fired(&c, utc(2026, 6, 1, 0, 0), utc(2026, 6, 1, 23, 59));
        assert_eq!(day, vec![utc(2026, 6, 1, 7, 0)]);
        // Nothing before the slot; the slot itself once.
        assert_eq!(c.due(utc(2026, 6, 1, 0, 0), utc(2026, 6, 1, 6, 59)), None);
        assert_eq!(c.due(utc(2026, 6, 1, 7, 0), utc(2026, 6, 1, 7, 30)), None);
    }

    #[test]
    fn after_downtime_only_the_latest_missed_slot_fires() {
        let c = Cron::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        let last = utc(2026, 6, 1, 7, 0);
        assert_eq!(c.due(last, utc(2026, 6, 5, 10, 0)), Some(utc(2026, 6, 5, 7, 0)));
        assert_eq!(c.due(utc(2026, 6, 5, 7, 0), utc(2026, 6, 5, 10, 0)), None);
    }

    #[test]
    fn dst_changes_fire_each_slot_once() {
        // Berlin springs forward on 2026-03-29 at 02:00 (to 03:00): 02:30
        // does not exist that day; it falls back on 2026-10-25 at 03:00 (to
        // 02:00): 02:30 happens twice.
        let c = Cron::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        for (day, from, to) in [
            ("spring", utc(2026, 3, 28, 22, 0), utc(2026, 3, 29, 21, 59)),
            ("autumn", utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 22, 59)),
        ] {
            let slots = fired(&c, from, to);
            assert_eq!(slots.len(), 1, "{day}: {slots:?}");
        }
        // The repeated 02:30 fires at its first occurrence (00:30 UTC, while
        // still on summer time).
        let autumn = fired(&c, utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 22, 59));
        assert_eq!(autumn, vec![utc(2026, 10, 25, 0, 30)]);
        // An hourly schedule keeps one slot per real hour across both.
        let hourly = Cron::parse("0 * * * *", Some("Europe/Berlin")).unwrap();
        let spring = fired(&hourly, utc(2026, 3, 28, 22, 0), utc(2026, 3, 29, 21, 59));
        assert_eq!(spring.len(), 23, "{spring:?}");
        assert!(spring.windows(2).all(|w| w[1] > w[0]));
    }

    #[test]
    fn bad_schedules_are_refused_with_their_reason() {
        assert!(matches!(
            Cron::parse("61 * * * *", None),
            Err(ScheduleError::BadCron(_))
        ));
        assert!(matches!(
            Cron::parse("0 0 9 * * *", None),
            Err(ScheduleError::BadCron(_))
        ));
        assert!(matches!(
            Cron::parse("0 9 * *", None),
            Err(ScheduleError::BadCron(_))
        ));
        assert!(matches!(
            Cron::parse("0 9 * * *", Some("Mars/Olympus")),
            Err(ScheduleError::BadZone(_))
        ));
        assert!(Cron::parse("*/15 8-18 * * mon-fri", Some("America/New_York")).is_ok());
        assert!(Cron::parse("@hourly", None).is_ok());
    }
}
