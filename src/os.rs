//! The operating-system calls that need `unsafe`: mapping a file into memory, asking for huge pages,
//! reading peak memory, ending the process at once, and reading macOS's kernel values (`sysctlbyname`,
//! so that no `sysctl` process is spawned for them: some are read every second). What the kernel hands
//! back is decoded by pure functions, tested on every platform.

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

/// Whether the kernel backs memory advised with [`advise_huge_pages`] by 2 MB pages: Linux with
/// transparent huge pages `always` or `madvise` (not `never`). Reading a model's weights from such
/// pages streams faster than from 4 KB pages, a mapped file's included: fewer TLB misses, and the
/// CPU's prefetchers, which stop at page boundaries, run further (measured by `shoal bench`, see
/// `engine::stage`). Never elsewhere (macOS has no such advice).
pub fn huge_pages_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        huge_pages_enabled(&setting)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Decodes `/sys/kernel/mm/transparent_hugepage/enabled` ("always [madvise] never": the choice is
/// bracketed).
pub fn huge_pages_enabled(setting: &str) -> bool {
    setting.contains("[always]") || setting.contains("[madvise]")
}

/// Asks the kernel to back the whole pages of `bytes` bytes at `start` by huge pages where it can (on
/// Linux; nothing elsewhere). Huge pages are 2 MB aligned: the advice pays off for allocations of
/// several megabytes. Call it before the memory is first written: the kernel then allocates
/// huge pages as it faults them in. Advice only: ignored where it cannot be followed.
pub fn advise_huge_pages(start: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let first = (start as usize).div_ceil(PAGE) * PAGE;
        let end = (start as usize).saturating_add(bytes) / PAGE * PAGE;
        if end > first {
            // SAFETY: madvise with MADV_HUGEPAGE changes no contents and no protection of the range, which
            // the caller owns (whole pages inside its allocation).
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}

/// Bytes of the memory mappings overlapping `bytes` bytes at `start` which the kernel backs by
/// anonymous huge pages (`AnonHugePages` of `/proc/self/smaps`): what shows that
/// [`advise_huge_pages`] took effect (the advice splits a mapping at the advised range's pages). For
/// tests.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn huge_page_bytes_in(start: *const u8, bytes: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let wanted = start as u64..start as u64 + bytes as u64;
    let (mut inside, mut found, mut huge) = (false, false, 0);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((from, to)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let (from, to) = (u64::from_str_radix(from, 16).ok()?, u64::from_str_radix(to, 16).ok()?);
            inside = from < wanted.end && wanted.start < to;
            found |= inside;
        } else if inside && first == "AnonHugePages:" {
            huge += line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024;
        }
    }
    found.then_some(huge)
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
    fn huge_pages_are_on_unless_the_kernel_says_never() {
        assert!(huge_pages_enabled("always [madvise] never\n"));
        assert!(huge_pages_enabled("[always] madvise never\n"));
        assert!(!huge_pages_enabled("always madvise [never]\n"));
        assert!(!huge_pages_enabled(""));
    }

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
