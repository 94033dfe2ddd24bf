//! The operating-system calls that need `unsafe`: mapping a file into memory, reading peak memory, ending
//! the process at once, and reading macOS's kernel values (`sysctlbyname`, so that no `sysctl` process is spawned for them: some are
//! read every second). What the kernel hands back is decoded by pure functions, tested on every platform.

use memmap2::Mmap;
use std::fs::File;
use std::io;

/// Maps `file` read-only. Pages are read from disk only when touched, so mapping a 100 GB model costs
/// nothing until a stage reads its own tensors.
pub fn map_file(file: &File) -> io::Result<Mmap> {
    // SAFETY: the mapping is read-only. If another process truncates the file while it is mapped, reads
    // of the lost pages fault (SIGBUS); shoal never writes model files it has mapped, and documents that
    // model files must not be modified while a node runs them.
    unsafe { Mmap::map(file) }
}

/// Ends the process now with `code`, like `_exit(2)`: no exit handlers, no C or C++ static destructors,
/// no library teardown. For a process whose own state is already saved and stopped: the app, after its
/// node has stopped, leaves this way because the teardown of the GTK, WebKit and tray (libdbusmenu)
/// objects it would otherwise run races with those libraries' own threads, a known source of crashes at
/// exit. Standard error is unbuffered; standard output is flushed first.
pub fn exit_at_once(code: i32) -> ! {
    use std::io::Write;
    let _ = io::stdout().flush();
    // SAFETY: _exit only ends the process; nothing runs after it in this process.
    unsafe { libc::_exit(code) }
}

/// The process's peak resident memory in bytes, where the OS reports it.
pub fn peak_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct it is given; on failure we read nothing.
        let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
        // SAFETY: filled by a successful getrusage. macOS reports bytes, other BSDs KiB.
        ok.then(|| {
            let max = unsafe { usage.assume_init() }.ru_maxrss as u64;
            if cfg!(target_os = "macos") {
                max
            } else {
                max * 1024
            }
        })
    }
}

/// The raw value of the kernel variable `name` (`hw.perflevel0.physicalcpu`, `kern.boottime`, …), on
/// macOS; `None` elsewhere, or when the variable does not exist on this Mac.
pub fn sysctl_bytes(name: &str) -> Option<Vec<u8>> {
    #[cfg(target_os = "macos")]
    {
        let name = std::ffi::CString::new(name).ok()?;
        let mut len: libc::size_t = 0;
        // SAFETY: a null `oldp` asks only for the value's size, written to `len`; nothing is set.
        let sized =
            unsafe { libc::sysctlbyname(name.as_ptr(), std::ptr::null_mut(), &mut len, std::ptr::null_mut(), 0) };
        if sized != 0 || len == 0 || len > 1 << 16 {
            return None;
        }
        let mut value = vec![0u8; len];
        // SAFETY: `value` has room for `len` bytes, the size the kernel reports; it writes at most `len`
        // and sets `len` to what it wrote.
        let read =
            unsafe { libc::sysctlbyname(name.as_ptr(), value.as_mut_ptr().cast(), &mut len, std::ptr::null_mut(), 0) };
        if read != 0 {
            return None;
        }
        value.truncate(len);
        Some(value)
    }
    #[cfg(not(target_os = "macos"))]
    {
        let _ = name;
        None
    }
}

/// The integer kernel variable `name` (see [`sysctl_bytes`]).
pub fn sysctl_integer(name: &str) -> Option<u64> {
    integer_from_sysctl(&sysctl_bytes(name)?)
}

/// A kernel integer as `sysctlbyname` returns it: 4 bytes (`int`) or 8 (`int64`), in the machine's
/// byte order; negative values are not counts and read as `None`.
pub fn integer_from_sysctl(value: &[u8]) -> Option<u64> {
    match value.len() {
        4 => u64::try_from(i32::from_ne_bytes(value.try_into().ok()?)).ok(),
        8 => u64::try_from(i64::from_ne_bytes(value.try_into().ok()?)).ok(),
        _ => None,
    }
}

/// Seconds of a `struct timeval` (`kern.boottime`): on 64-bit macOS its first 8 bytes are `tv_sec`.
pub fn seconds_from_timeval(value: &[u8]) -> Option<u64> {
    let seconds = i64::from_ne_bytes(value.get(..8)?.try_into().ok()?);
    u64::try_from(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_values_decode_as_macos_hands_them_back() {
        assert_eq!(integer_from_sysctl(&98304i32.to_ne_bytes()), Some(98304));
        assert_eq!(integer_from_sysctl(&16i64.to_ne_bytes()), Some(16));
        assert_eq!(integer_from_sysctl(&(-1i32).to_ne_bytes()), None);
        assert_eq!(integer_from_sysctl(&[1, 2, 3]), None);
        let mut timeval = 1_767_225_600i64.to_ne_bytes().to_vec();
        timeval.extend(123_456i32.to_ne_bytes());
        timeval.extend([0; 4]);
        assert_eq!(seconds_from_timeval(&timeval), Some(1_767_225_600));
        assert_eq!(seconds_from_timeval(&[0; 4]), None);
        if !cfg!(target_os = "macos") {
            assert_eq!(sysctl_integer("hw.ncpu"), None, "no sysctlbyname off macOS");
        }
    }
}
