//! The operating-system calls that need `unsafe`: mapping a file into memory and reading peak memory.

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
