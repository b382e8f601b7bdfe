//! Lending windows: the hours an owner lends the machine at all (nights and weekends, say).
//! Outside every window the runner behaves as if the owner were active: it yields, hands its
//! jobs back and claims nothing, whatever the owner probe says.
//!
//! A spec is `;`-separated windows of `DAYS HH:MM-HH:MM`, in UTC: DAYS is one day (`mon`),
//! a range (`mon-fri`, `sat-sun`, wrapping like `fri-mon`) or a comma list (`mon,wed`). A
//! window whose end is not after its start runs past midnight into the next day
//! (`mon-fri 19:00-07:00` lends from Monday 19:00 to Saturday 07:00); `00:00-24:00` is the
//! whole day.

use chrono::{DateTime, Datelike, Timelike, Utc};

#[derive(Debug, thiserror::Error)]
#[error("invalid lending window {spec:?}: {reason} (expected e.g. \"mon-fri 19:00-07:00; sat-sun 00:00-24:00\", UTC)")]
pub struct LendingError {
    spec: String,
    reason: String,
}

/// Minutes since Monday 00:00 (UTC) covered by a window: `[start, end)` within one week.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

const DAY: u32 = 24 * 60;
const WEEK: u32 = 7 * DAY;
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LendingWindows {
    spans: Vec<Span>,
}

impl LendingWindows {
    /// Whether `t` falls inside a window.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        let minute = t.weekday().num_days_from_monday() * DAY + t.hour() * 60 + t.minute();
        self.spans.iter().any(|s| {
            // A span may run past Sunday midnight into the next week.
            (s.start..s.end).contains(&minute) || (s.start..s.end).contains(&(minute + WEEK))
        })
    }
}

impl std::str::FromStr for LendingWindows {
    type Err = LendingError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| LendingError {
            spec: spec.to_string(),
            reason,
        };
        let mut spans = Vec::new();
        for window in spec.split(';').map(str::trim).filter(|w| !w.is_empty()) {
            let (days, hours) = window
                .split_once(char::is_whitespace)
                .ok_or_else(|| err(format!("`{window}` needs days and hours")))?;
            let (from, to) = hours
                .trim()
                .split_once('-')
                .ok_or_else(|| err(format!("`{hours}` is not HH:MM-HH:MM")))?;
            let (from, to) = (clock(from).map_err(&err)?, clock(to).map_err(&err)?);
            if from >= DAY {
                return Err(err(format!("a window cannot start at {}", hours.trim())));
            }
            let length = if to > from {
                to - from
            } else {
                to + DAY - from
            };
            for day in day_list(days).map_err(&err)? {
                let start = day * DAY + from;
                spans.push(Span {
                    start,
                    end: start + length,
                });
            }
        }
        if spans.is_empty() {
            return Err(err("no window".into()));
        }
        Ok(LendingWindows { spans })
    }
}

/// `HH:MM` → minutes after midnight (`24:00` allowed, as an end).
fn clock(text: &str) -> Result<u32, String> {
    let (h, m) = text
        .trim()
        .split_once(':')
        .ok_or_else(|| format!("`{text}` is not HH:MM"))?;
    let (h, m): (u32, u32) = match (h.parse(), m.parse()) {
        (Ok(h), Ok(m)) => (h, m),
        _ => return Err(format!("`{text}` is not HH:MM")),
    };
    if m >= 60 || h > 24 || (h == 24 && m > 0) {
        return Err(format!("`{text}` is not a time of day"));
    }
    Ok(h * 60 + m)
}

/// `mon`, `mon-fri`, `fri-mon`, `mon,wed` → day indices (Monday = 0).
fn day_list(text: &str) -> Result<Vec<u32>, String> {
    let day = |d: &str| {
        DAYS.iter()
            .position(|&n| n == d.trim().to_ascii_lowercase())
            .map(|i| i as u32)
            .ok_or_else(|| format!("unknown day `{d}` (mon … sun)"))
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    out.push(d);
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => out.push(day(part)?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .expect("valid time")
    }

    #[test]
    fn weeknights_and_weekends_are_lent_and_office_hours_are_not() {
        let w: LendingWindows = "mon-fri 19:00-07:00; sat-sun 00:00-24:00".parse().unwrap();
        // 2026-11-30 is a Monday.
        assert!(!w.contains(at(2026, 11, 30, 12, 0)), "Monday noon");
        assert!(w.contains(at(2026, 11, 30, 19, 0)), "Monday 19:00");
        assert!(
            w.contains(at(2026, 12, 1, 6, 59)),
            "Tuesday 06:59, from Monday night"
        );
        assert!(!w.contains(at(2026, 12, 1, 7, 0)), "Tuesday 07:00");
        assert!(
            w.contains(at(2026, 12, 5, 6, 0)),
            "Saturday 06:00, from Friday night"
        );
        assert!(w.contains(at(2026, 12, 6, 23, 59)), "Sunday 23:59");
        assert!(
            !w.contains(at(2026, 12, 7, 0, 0)),
            "Monday 00:00, the weekend over"
        );
        assert!(!w.contains(at(2026, 12, 7, 8, 0)), "Monday 08:00");
    }

    #[test]
    fn a_window_past_sunday_midnight_wraps_into_monday() {
        let w: LendingWindows = "sun 22:00-02:00".parse().unwrap();
        assert!(w.contains(at(2026, 12, 6, 23, 0)), "Sunday 23:00");
        assert!(w.contains(at(2026, 12, 7, 1, 59)), "Monday 01:59");
        assert!(!w.contains(at(2026, 12, 7, 2, 0)), "Monday 02:00");
        let w: LendingWindows = "fri-mon 00:00-24:00".parse().unwrap();
        assert!(w.contains(at(2026, 12, 7, 12, 0)), "Monday in fri-mon");
        assert!(!w.contains(at(2026, 12, 8, 12, 0)), "Tuesday");
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        for bad in [
            "",
            "mon",
            "mon 9-17",
            "xyz 09:00-17:00",
            "mon 25:00-26:00",
            "mon 09:60-10:00",
        ] {
            let e = bad.parse::<LendingWindows>().unwrap_err().to_string();
            assert!(e.contains("invalid lending window"), "{bad}: {e}");
        }
    }
}
