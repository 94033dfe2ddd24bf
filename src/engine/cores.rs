//! The machine's cores, shared by every stage that computes on it. ggml's CPU threads wait for each
//! other at every operation by spinning; when more compute threads than cores run at once (three
//! stages of two threads on two cores, say, or two instances on one machine), a thread spins while
//! the one it waits for is not even scheduled, and throughput collapses (measured: three concurrent
//! requests through three such stages fell from 79.8 to 2.8 tokens/s in all). So before each step a
//! stage takes a lease on cores and computes with that many threads:
//!
//! - its fair share: the machine's cores divided among the stages that want to compute now (those
//!   holding or waiting for a lease), at least one, and no more than it has threads;
//! - of those, only cores no other step computes on; when none is free, it waits for the first freed.
//!
//! So computing steps never share a core, one busy stage gets every core it has threads for, and
//! several busy stages split the cores instead of queueing for all of them.
//!
//! Leases are kept in advisory file locks in a directory of this user's (`/dev/shm/shoal-cores-UID` on
//! Linux, the temporary directory elsewhere): one file per core, one for the queue of those taking
//! cores, and one per process that it holds while it wants cores. Every shoal process of the user on
//! the machine sees them, whatever its network namespace, and the kernel releases the locks of a
//! process that dies.

use rustix::fs::{flock, openat, FlockOperation, Mode, OFlags};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The machine's cores and their lock files.
pub struct Cores {
    /// The lock directory, which every lease opens its lock files in.
    dir: OwnedFd,
    path: PathBuf,
    count: usize,
    /// Those taking cores in this process queue here first, then on the queue file with other processes.
    taking: Mutex<()>,
    /// This process's demand file, locked while a lease of this process is wanted or held, and how
    /// many are.
    demand: OwnedFd,
    demanding: Mutex<usize>,
}

/// Cores held for one step, released when dropped (closing a lock file releases its lock).
pub struct Lease<'a> {
    held: Vec<OwnedFd>,
    cores: &'a Cores,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.cores.stop_demanding();
    }
}

impl Lease<'_> {
    /// Threads the step may compute with.
    pub fn threads(&self) -> usize {
        self.held.len().max(1)
    }
}

impl Cores {
    /// This machine's cores, shared with the user's other shoal processes; none (each stage computing
    /// with all its threads, as without a lease) when the lock files cannot be had, or when
    /// `SHOAL_SHARE_CORES=0` says not to (to measure what sharing saves).
    pub fn machine() -> Option<&'static Cores> {
        static CORES: OnceLock<Option<Cores>> = OnceLock::new();
        CORES
            .get_or_init(|| {
                if std::env::var("SHOAL_SHARE_CORES").is_ok_and(|v| v == "0") {
                    return None;
                }
                let count = std::thread::available_parallelism().map_or(1, |n| n.get());
                match Cores::open(&lock_dir(), count) {
                    Ok(cores) => Some(cores),
                    Err(e) => {
                        tracing::warn!(
                            "stages on this machine cannot share its cores ({e}); each computes with all its threads"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// `count` cores whose locks live in `dir` (made, private to this user, when missing).
    pub fn open(dir: &Path, count: usize) -> std::io::Result<Cores> {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // A directory anyone could have made in a shared place must be ours, and ours alone.
        let meta = std::fs::symlink_metadata(dir)?;
        if !meta.is_dir() || meta.uid() != rustix::process::getuid().as_raw() {
            return Err(std::io::Error::other(format!("{} is not a directory of this user", dir.display())));
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.to_path_buf();
        remove_demand_files_of_ended_processes(&path);
        let dir = rustix::fs::open(dir, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        // One per process in practice (`machine`); tests open several.
        static OPENED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let demand_name = format!("{DEMAND_PREFIX}{}-{n}", std::process::id());
        let demand = openat(
            &dir,
            demand_name.as_str(),
            OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let cores = Cores { dir, path, count: count.max(1), taking: Mutex::new(()), demand, demanding: Mutex::new(0) };
        // Made now, so that a lease finds them.
        cores.lock_file("queue")?;
        for i in 0..cores.count {
            cores.lock_file(&core_name(i))?;
        }
        Ok(cores)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// A new open file description of a lock file: locks are held per description, so each lease's are
    /// its own, even against another lease of this process.
    fn lock_file(&self, name: &str) -> std::io::Result<OwnedFd> {
        let flags = OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        Ok(openat(&self.dir, name, flags, Mode::from_raw_mode(0o600))?)
    }

    /// Takes free cores for a step that wants `wanted` threads: its fair share (see the module's doc),
    /// or waits for the first core freed when none is free. Those taking cores queue (on a lock within
    /// the process, then on one shared by the processes), so a step waiting for a core is not overtaken
    /// by later ones. A lock file that cannot be opened leaves the lease with one thread, held on
    /// nothing.
    pub fn lease(&self, wanted: usize) -> Lease<'_> {
        self.start_demanding();
        let mut lease = Lease { held: Vec::with_capacity(wanted), cores: self };
        let _taking = self.taking.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Ok(queue) = self.lock_file("queue") else { return lease };
        if flock(&queue, FlockOperation::LockExclusive).is_err() {
            return lease;
        }
        let wanted = wanted.clamp(1, self.fair_share());
        let mut pause = std::time::Duration::from_micros(50);
        loop {
            for i in 0..self.count {
                if lease.held.len() == wanted {
                    break;
                }
                let Ok(core) = self.lock_file(&core_name(i)) else { continue };
                if flock(&core, FlockOperation::NonBlockingLockExclusive).is_ok() {
                    lease.held.push(core);
                }
            }
            if !lease.held.is_empty() {
                break;
            }
            // Every core computes: look again shortly, for whichever is freed first.
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_micros(100));
        }
        // Closing `queue` lets the next one take cores.
        lease
    }

    /// The cores divided among the processes that want to compute now (this one included), at least one.
    fn fair_share(&self) -> usize {
        (self.count / self.demanding_processes().max(1)).max(1)
    }

    /// Processes whose demand file is locked: those holding or waiting for a lease.
    fn demanding_processes(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.path) else { return 1 };
        entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(DEMAND_PREFIX)))
            .filter(|e| {
                let Some(name) = e.file_name().to_str().map(str::to_string) else { return false };
                let Ok(file) = openat(
                    &self.dir,
                    name.as_str(),
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) else {
                    return false;
                };
                // A shared lock is refused while its process holds the file exclusively.
                flock(&file, FlockOperation::NonBlockingLockShared).is_err()
            })
            .count()
    }

    fn start_demanding(&self) {
        let mut demanding = self.demanding.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *demanding == 0 {
            let _ = flock(&self.demand, FlockOperation::LockExclusive);
        }
        *demanding += 1;
    }

    fn stop_demanding(&self) {
        let mut demanding = self.demanding.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *demanding = demanding.saturating_sub(1);
        if *demanding == 0 {
            let _ = flock(&self.demand, FlockOperation::Unlock);
        }
    }
}

/// Each process's demand file is this followed by its process id, a dash and a number.
const DEMAND_PREFIX: &str = "demand-";

/// Demand files of processes that no longer run (they would pile up, one per worker ever started).
fn remove_demand_files_of_ended_processes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix(DEMAND_PREFIX)?.split('-').next()?.parse::<i32>().ok())
        else {
            continue;
        };
        let running = rustix::process::Pid::from_raw(pid)
            .is_some_and(|pid| !matches!(rustix::process::test_kill_process(pid), Err(rustix::io::Errno::SRCH)));
        if !running {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn core_name(i: usize) -> String {
    format!("core{i}")
}

fn lock_dir() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("shoal-cores-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_share_the_cores_and_wait_when_none_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cores");
        // Two views of the same cores, as two processes would have them.
        let (a, b) = (Cores::open(&path, 3).unwrap(), Cores::open(&path, 3).unwrap());
        let first = a.lease(2);
        assert_eq!(first.threads(), 2);
        let second = a.lease(2);
        assert_eq!(second.threads(), 1, "only one core is left, for a lease of the same process too");
        drop(first);
        let b_first = b.lease(5);
        assert_eq!(b_first.threads(), 1, "with the other process wanting cores too, its fair share is 3 / 2");
        let b_second = b.lease(1);
        assert_eq!(b_second.threads(), 1);
        // With every core taken, a lease waits until one is released.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let c = Cores::open(&path, 3).unwrap();
            let lease = c.lease(1);
            tx.send(lease.threads()).unwrap();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "no core is free");
        drop(second);
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(), 1);
        waiter.join().unwrap();
        drop((b_first, b_second));
    }

    #[test]
    fn stages_wanting_cores_at_once_split_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cores");
        // Another process (a child holding its own demand file, as a stage waiting for a lease does).
        let cores = Cores::open(&path, 4).unwrap();
        assert_eq!(cores.lease(4).threads(), 4, "alone, a stage gets every core it has threads for");
        let other = path.join(format!("{DEMAND_PREFIX}{}-0", u32::MAX));
        let file = std::fs::File::create(&other).unwrap();
        let mut child = std::process::Command::new("flock")
            .args(["--exclusive", "--no-fork"])
            .arg(&other)
            .args(["sleep", "30"])
            .spawn()
            .expect("util-linux flock");
        drop(file);
        // Wait until the child holds its lock (this process wants no cores between its leases).
        while cores.demanding_processes() < 1 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(cores.lease(4).threads(), 2, "two stages wanting cores get half each");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(cores.lease(4).threads(), 4, "the other stage is gone");
    }

    #[test]
    fn a_directory_of_another_kind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        assert!(Cores::open(&file, 2).is_err());
    }
}
