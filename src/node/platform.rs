//! The macOS edge of telemetry: the chip name and the GPU's memory limit. The limit is read from the
//! kernel (`sysctlbyname`, no process spawned: telemetry samples every second) only on macOS; what it
//! means is decided by a pure function tested everywhere.

/// The Apple chip, from the CPU brand string macOS reports ("Apple M3 Ultra").
pub fn apple_chip(cpu_brand: &str) -> Option<String> {
    (cfg!(target_os = "macos") && cpu_brand.starts_with("Apple")).then(|| cpu_brand.to_string())
}

/// Memory the GPU may wire, with where the number comes from; `None` off macOS.
pub fn gpu_memory_limit(memory_total: u64) -> Option<(u64, &'static str)> {
    if !cfg!(target_os = "macos") {
        return None;
    }
    Some(gpu_limit_from_sysctl(crate::os::sysctl_integer("iogpu.wired_limit_mb"), memory_total))
}

/// Interprets `iogpu.wired_limit_mb` (what `sysctl -n iogpu.wired_limit_mb` prints): a positive value is
/// the limit in MiB; 0 or nothing means
/// macOS's default, which Apple does not document: about two thirds of memory up to 36 GiB and three
/// quarters above (the figures Metal's recommendedMaxWorkingSetSize reports in practice).
pub fn gpu_limit_from_sysctl(wired_limit_mb: Option<u64>, memory_total: u64) -> (u64, &'static str) {
    match wired_limit_mb {
        Some(mb) if mb > 0 => (mb * 1024 * 1024, "sysctl iogpu.wired_limit_mb"),
        _ => {
            let share = if memory_total <= 36 << 30 { memory_total / 3 * 2 } else { memory_total / 4 * 3 };
            (share, "macOS default (estimate)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_values_and_the_default_share() {
        assert_eq!(gpu_limit_from_sysctl(Some(98304), 128 << 30), (96 << 30, "sysctl iogpu.wired_limit_mb"));
        assert_eq!(gpu_limit_from_sysctl(Some(0), 512 << 30).0, 384 << 30);
        assert_eq!(gpu_limit_from_sysctl(None, 24 << 30).0, 16 << 30);
    }
}
