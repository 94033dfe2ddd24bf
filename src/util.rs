//! Small helpers shared across modules.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A time in milliseconds since the Unix epoch as RFC 3339 in UTC: `2026-12-01T04:30:00.123Z`.
pub fn rfc3339(ms: u64) -> String {
    let t = CivilTime::at(ms);
    let (h, m, s, milli) = (t.hour, t.minute, t.second, ms % 1000);
    format!("{:04}-{:02}-{:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z", t.year, t.month, t.day)
}

/// A moment as a calendar spells it, in UTC (proleptic Gregorian).
pub struct CivilTime {
    pub year: i64,
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 is Monday.
    pub weekday: u32,
    /// 1 to 366.
    pub day_of_year: u32,
}

impl CivilTime {
    /// The calendar time `ms` milliseconds after 1970-01-01T00:00:00Z.
    pub fn at(ms: u64) -> CivilTime {
        let (days, in_day) = ((ms / 86_400_000) as i64, ms % 86_400_000);
        // Civil date from days since 1970-01-01, by 400-year eras of 146097 days (the era starts on 1 March).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const BEFORE_MONTH: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let day_of_year = BEFORE_MONTH[month as usize - 1] + day + i64::from(leap && month > 2);
        CivilTime {
            year,
            month: month as u32,
            day: day as u32,
            hour: (in_day / 3_600_000) as u32,
            minute: (in_day / 60_000 % 60) as u32,
            second: (in_day / 1000 % 60) as u32,
            // 1970-01-01 was a Thursday.
            weekday: (days + 3).rem_euclid(7) as u32,
            day_of_year: day_of_year as u32,
        }
    }
}

/// Parses a byte size with its unit: `64MB`, `1.5GB`, `512MiB`, `2G`, `4096B` (decimal units; `iB` units
/// binary). A bare number is refused: `--memory-limit 64` meant 64 bytes, never what anyone wanted.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like 64MB or 1.5GiB"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => return Err(format!("{text:?} has no unit: add one, e.g. {number}GB, {number}MB or {number}GiB")),
        "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => return Err(format!("unknown size unit {other:?} in {text:?} (use B, KB, MB, GB, KiB, MiB, GiB)")),
    };
    Ok((value * factor) as u64)
}

/// A size for people: "24 GB", "1.4 TB", "512 MB" (decimal units, like the memory figures macOS shows).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)];
    let b = bytes as f64;
    for (unit, size) in UNITS {
        if b >= size {
            let v = b / size;
            return if v < 10.0 { format!("{v:.1} {unit}") } else { format!("{v:.0} {unit}") };
        }
    }
    format!("{bytes} B")
}

/// Bytes free (for an ordinary user) on the filesystem that holds `path`, or would hold it: its
/// nearest existing folder. None when the system does not say.
pub fn free_disk_bytes(path: &std::path::Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let stats = rustix::fs::statvfs(existing).ok()?;
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Locking that survives a panic elsewhere: a thread that panicked while holding a lock poisons it, and
/// `lock().expect(..)` would then panic in every later user — one fault would take down every service
/// reading that state. The state behind the agent's locks stays consistent between statements, so the
/// guard is recovered instead.
pub trait LockExt<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T>;
}

impl<T> LockExt<T> for std::sync::Mutex<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T> {
        self.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::rfc3339(1_796_099_445_123), "2026-12-01T04:30:45.123Z");
    }

    #[test]
    fn sizes_read_like_the_system_shows_them() {
        assert_eq!(super::format_bytes(24_000_000_000), "24 GB");
        assert_eq!(super::format_bytes(1_400_000_000_000), "1.4 TB");
        assert_eq!(super::format_bytes(98_000_000), "98 MB");
        assert_eq!(super::format_bytes(512), "512 B");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(super::parse_bytes("64MB"), Ok(64_000_000));
        assert_eq!(super::parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(super::parse_bytes("4096B"), Ok(4096));
        assert!(super::parse_bytes("64").unwrap_err().contains("64GB"), "a bare number needs a unit");
        assert!(super::parse_bytes("lots").is_err());
        assert!(super::parse_bytes("5 parsecs").is_err());
    }
}
