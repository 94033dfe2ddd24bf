//! Which file workers are started from: this process's own executable, as it was when the node started.
//! Rebuilding or upgrading the binary under a running node replaces the file at its path (or deletes
//! it), and a worker started from that path afterwards would fail ("No such file or directory") or run
//! another version than its agent. So on Linux the node opens its executable once at start
//! ([`hold`]) and starts every worker through that open file (`/proc/self/fd/N`), which stays the
//! same file whatever happens to the path; `ps` still shows the path. Elsewhere (macOS has no such
//! handle) workers start from the path the executable had at start: there, replace the binary only
//! while no node runs from it.

use std::path::PathBuf;
use std::sync::OnceLock;

struct Executable {
    /// The path to start workers from.
    program: PathBuf,
    /// What the worker's `argv[0]` shows: the executable's path when the node started.
    shown_as: PathBuf,
    /// Keeps `program` valid on Linux (it names this descriptor).
    _file: Option<std::fs::File>,
}

static EXECUTABLE: OnceLock<Option<Executable>> = OnceLock::new();

/// Takes hold of this process's executable; call it when the node starts, before anything can replace
/// the file. Later calls do nothing.
pub fn hold() {
    EXECUTABLE.get_or_init(open);
}

fn open() -> Option<Executable> {
    let path = std::env::current_exe().ok()?;
    let shown_as = PathBuf::from(path.to_string_lossy().trim_end_matches(" (deleted)"));
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        match std::fs::File::open("/proc/self/exe") {
            Ok(file) => {
                let program = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                return Some(Executable { program, shown_as, _file: Some(file) });
            }
            Err(e) => tracing::warn!("cannot hold this executable open ({e}); workers start from {}", path.display()),
        }
    }
    Some(Executable { program: path, shown_as, _file: None })
}

/// A command that starts this executable as it was when [`hold`] was called (or, if it never was, as
/// the path names it now).
pub fn command() -> std::io::Result<tokio::process::Command> {
    let held = EXECUTABLE.get().and_then(Option::as_ref);
    let (program, shown_as) = match held {
        Some(e) => (e.program.clone(), e.shown_as.clone()),
        None => {
            let path = std::env::current_exe()?;
            (path.clone(), path)
        }
    };
    let mut command = tokio::process::Command::new(program);
    #[cfg(unix)]
    command.arg0(shown_as);
    #[cfg(not(unix))]
    let _ = shown_as;
    Ok(command)
}
