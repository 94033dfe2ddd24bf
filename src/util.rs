//! Small helpers shared across modules.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Parses a byte size: `1048576`, `64MB`, `1.5GB`, `512MiB`, `2G` (decimal units; `iB` units binary).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size like 64MB or 1.5GiB"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
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
        assert_eq!(super::parse_bytes("4096"), Ok(4096));
        assert!(super::parse_bytes("lots").is_err());
        assert!(super::parse_bytes("5 parsecs").is_err());
    }
}
