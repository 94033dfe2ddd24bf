//! The safe wrapper over the C verbs shim (shim.c): the only RDMA code with `unsafe`. [`Verbs`] is the
//! platform's verbs library opened at run time; [`RdmaLink`] opens a UC queue pair on a device and
//! connects it to the peer's, giving a [`SlotLink`] over the shim's [`ShimQueuePair`] that carries
//! whole messages.

use super::link::{Completion, QueuePair, SlotLink};
use super::{Endpoint, RdmaError, DEFAULT_LIBRARY, FRAME_BYTES, MAX_QUEUE_PAIRS, MAX_SLOTS};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Names another RDMA library file to load instead of the platform's (for tests and odd installs).
pub const LIBRARY_ENV: &str = "SHOAL_RDMA_LIBRARY";

#[repr(C)]
#[derive(Default)]
struct RawEndpoint {
    gid: [u8; 16],
    qpn: u32,
    psn: u32,
    lid: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawCompletion {
    slot: u32,
    is_recv: u32,
    status: u32,
    byte_len: u32,
}

extern "C" {
    fn shoal_rdma_load(path: *const c_char, err: *mut c_char, err_len: usize) -> *mut c_void;
    fn shoal_rdma_unload(verbs: *mut c_void);
    fn shoal_rdma_device_names(
        verbs: *const c_void,
        names: *mut c_char,
        capacity: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn shoal_rdma_link_open(
        verbs: *const c_void,
        device: *const c_char,
        slots: u32,
        slot_bytes: u32,
        psn: u32,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn shoal_rdma_link_close(link: *mut c_void);
    fn shoal_rdma_link_local(link: *const c_void, out: *mut RawEndpoint, err: *mut c_char, err_len: usize) -> c_int;
    fn shoal_rdma_link_connect(
        link: *mut c_void,
        remote: *const RawEndpoint,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn shoal_rdma_link_slot(link: *const c_void, receive: c_int, slot: u32) -> *mut u8;
    fn shoal_rdma_link_post_recv(link: *mut c_void, slot: u32, err: *mut c_char, err_len: usize) -> c_int;
    fn shoal_rdma_link_post_send(link: *mut c_void, slot: u32, err: *mut c_char, err_len: usize) -> c_int;
    fn shoal_rdma_link_poll(link: *mut c_void, out: *mut RawCompletion, max: c_int) -> c_int;
}

/// A buffer for the shim's error messages.
struct ErrorText([u8; 512]);

impl ErrorText {
    fn new() -> ErrorText {
        ErrorText([0; 512])
    }
    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr().cast()
    }
    fn text(&self) -> String {
        CStr::from_bytes_until_nul(&self.0).map_or_else(|_| "unknown error".into(), |c| c.to_string_lossy().into())
    }
}

/// The platform's verbs library, opened at run time.
pub struct Verbs {
    raw: NonNull<c_void>,
}

// SAFETY: the shim's table is written once when loaded and only read afterwards; the verbs functions it
// points to may be called from any thread.
unsafe impl Send for Verbs {}
unsafe impl Sync for Verbs {}

impl Verbs {
    /// The library named by `SHOAL_RDMA_LIBRARY`, else the platform's (`/usr/lib/librdma.dylib`,
    /// `libibverbs.so.1`).
    pub fn load_default() -> Result<Arc<Verbs>, RdmaError> {
        let path = std::env::var(LIBRARY_ENV).unwrap_or_else(|_| DEFAULT_LIBRARY.to_string());
        Verbs::load(&path)
    }

    pub fn load(path: &str) -> Result<Arc<Verbs>, RdmaError> {
        let missing = |detail: String| RdmaError::LibraryMissing { path: path.into(), detail };
        let c_path = CString::new(path).map_err(|_| missing("the path has a NUL byte".into()))?;
        let mut err = ErrorText::new();
        // SAFETY: both pointers are valid for the call; the shim copies what it needs.
        let raw = unsafe { shoal_rdma_load(c_path.as_ptr(), err.ptr(), err.0.len()) };
        NonNull::new(raw).map(|raw| Arc::new(Verbs { raw })).ok_or_else(|| missing(err.text()))
    }

    /// The names of the RDMA devices (`rdma_en2`, … on a Mac). A failed list (Linux without RDMA
    /// support) is [`RdmaError::NoDevices`].
    pub fn device_names(&self) -> Result<Vec<String>, RdmaError> {
        let mut names = vec![0u8; 16 * 1024];
        let mut err = ErrorText::new();
        // SAFETY: `self.raw` is a loaded table; `names` and `err` are writable for their lengths.
        let count = unsafe {
            shoal_rdma_device_names(self.raw.as_ptr(), names.as_mut_ptr().cast(), names.len(), err.ptr(), err.0.len())
        };
        if count < 0 {
            return Err(RdmaError::NoDevices(err.text()));
        }
        let text = CStr::from_bytes_until_nul(&names).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // SAFETY: every link holds an Arc of this library, so none outlives it.
        unsafe { shoal_rdma_unload(self.raw.as_ptr()) }
    }
}

/// Queue pairs this process has open (Apple allows 10 per device).
static OPEN_QUEUE_PAIRS: AtomicUsize = AtomicUsize::new(0);

/// One UC queue pair of the shim with `slots` send and `slots` receive slots of `slot_bytes` each.
pub struct ShimQueuePair {
    /// Keeps the library loaded while the queue pair is open.
    _library: Arc<Verbs>,
    raw: NonNull<c_void>,
    slots: u32,
    slot_bytes: u32,
}

// SAFETY: the queue pair's verbs objects are used by one owner at a time (methods take `&mut self`).
unsafe impl Send for ShimQueuePair {}

/// The shim's post functions: a queue pair, a slot, room for an error message.
type PostFn = unsafe extern "C" fn(*mut c_void, u32, *mut c_char, usize) -> c_int;

impl ShimQueuePair {
    fn post(&mut self, slot: u32, post: PostFn) -> Result<(), RdmaError> {
        let mut err = ErrorText::new();
        // SAFETY: the shim checks `slot`; the slot's memory is registered and owned here, and a send slot
        // stays untouched until its completion returns it.
        let rc = unsafe { post(self.raw.as_ptr(), slot, err.ptr(), err.0.len()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(RdmaError::Post(err.text()))
        }
    }
}

impl QueuePair for ShimQueuePair {
    fn slots(&self) -> u32 {
        self.slots
    }

    fn slot(&mut self, receive: bool, slot: u32) -> &mut [u8] {
        // SAFETY: the shim returns the start of a slot of `slot_bytes` inside the queue pair's buffer,
        // which lives as long as it does; `&mut self` keeps the borrow unique.
        unsafe {
            let start = shoal_rdma_link_slot(self.raw.as_ptr(), c_int::from(receive), slot);
            assert!(!start.is_null(), "slot {slot} is within the queue pair");
            std::slice::from_raw_parts_mut(start, self.slot_bytes as usize)
        }
    }

    fn post_recv(&mut self, slot: u32) -> Result<(), RdmaError> {
        self.post(slot, shoal_rdma_link_post_recv)
    }

    fn post_send(&mut self, slot: u32) -> Result<(), RdmaError> {
        self.post(slot, shoal_rdma_link_post_send)
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), RdmaError> {
        let mut completions = [RawCompletion::default(); 32];
        // SAFETY: `completions` holds 32 entries, the most the shim writes.
        let n = unsafe { shoal_rdma_link_poll(self.raw.as_ptr(), completions.as_mut_ptr(), 32) };
        if n < 0 {
            return Err(RdmaError::Post(format!("polling the completion queue failed ({n})")));
        }
        out.extend(completions[..n as usize].iter().map(|c| Completion {
            slot: c.slot,
            receive: c.is_recv != 0,
            status: c.status,
        }));
        Ok(())
    }
}

impl Drop for ShimQueuePair {
    fn drop(&mut self) {
        // SAFETY: the queue pair is open and owned here; the library stays loaded through `_library`.
        unsafe { shoal_rdma_link_close(self.raw.as_ptr()) };
        OPEN_QUEUE_PAIRS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A queue pair opened on a device, not connected yet: send [`RdmaLink::local_endpoint`] to the peer,
/// then [`RdmaLink::connect`] with the peer's.
pub struct RdmaLink {
    qp: ShimQueuePair,
    device: String,
}

impl RdmaLink {
    /// Opens `device` and makes a queue pair with page-aligned slots registered as one memory region.
    pub fn open(verbs: &Arc<Verbs>, device: &str, slots: u32, slot_bytes: u32) -> Result<RdmaLink, RdmaError> {
        let bad = |detail: String| RdmaError::Device { device: device.into(), detail };
        if slots == 0 || slots > MAX_SLOTS || !(slot_bytes as usize).is_multiple_of(FRAME_BYTES) || slot_bytes == 0 {
            return Err(bad(format!(
                "{slots} slots of {slot_bytes} bytes: want 1..={MAX_SLOTS} slots of whole 4 KiB frames"
            )));
        }
        let claimed = OPEN_QUEUE_PAIRS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_QUEUE_PAIRS).then_some(n + 1));
        if claimed.is_err() {
            return Err(RdmaError::TooManyQueuePairs);
        }
        let c_device = CString::new(device).map_err(|_| bad("the name has a NUL byte".into()));
        let c_device = match c_device {
            Ok(d) => d,
            Err(e) => {
                OPEN_QUEUE_PAIRS.fetch_sub(1, Ordering::SeqCst);
                return Err(e);
            }
        };
        let psn = rand::random::<u32>() & 0x00ff_ffff;
        let mut raw = std::ptr::null_mut();
        let mut err = ErrorText::new();
        // SAFETY: valid pointers for the call; on success the shim hands over a link it allocated.
        let rc = unsafe {
            shoal_rdma_link_open(
                verbs.raw.as_ptr(),
                c_device.as_ptr(),
                slots,
                slot_bytes,
                psn,
                &mut raw,
                err.ptr(),
                err.0.len(),
            )
        };
        let Some(raw) = NonNull::new(raw).filter(|_| rc == 0) else {
            OPEN_QUEUE_PAIRS.fetch_sub(1, Ordering::SeqCst);
            return Err(bad(err.text()));
        };
        let qp = ShimQueuePair { _library: verbs.clone(), raw, slots, slot_bytes };
        Ok(RdmaLink { qp, device: device.into() })
    }

    /// What the peer needs to connect to this queue pair (send it over the control connection).
    pub fn local_endpoint(&self) -> Result<Endpoint, RdmaError> {
        let mut out = RawEndpoint::default();
        let mut err = ErrorText::new();
        // SAFETY: the queue pair is open; `out` and `err` are writable.
        let rc = unsafe { shoal_rdma_link_local(self.qp.raw.as_ptr(), &mut out, err.ptr(), err.0.len()) };
        if rc != 0 {
            return Err(RdmaError::Device { device: self.device.clone(), detail: err.text() });
        }
        let endpoint = Endpoint {
            gid: out.gid,
            qpn: out.qpn,
            psn: out.psn,
            lid: out.lid,
            slots: self.qp.slots,
            slot_bytes: self.qp.slot_bytes,
        };
        endpoint.ipv4().ok_or(RdmaError::NoIpv4Gid)?;
        Ok(endpoint)
    }

    /// Connects to the peer's queue pair; the link then carries messages of up to `max_message` bytes,
    /// giving up on any wait after `timeout`.
    pub fn connect(
        self,
        remote: &Endpoint,
        max_message: usize,
        timeout: Duration,
    ) -> Result<SlotLink<ShimQueuePair>, RdmaError> {
        if (remote.slots, remote.slot_bytes) != (self.qp.slots, self.qp.slot_bytes) {
            return Err(RdmaError::Mismatch {
                local: format!("{} slots of {} bytes", self.qp.slots, self.qp.slot_bytes),
                remote: format!("{} slots of {} bytes", remote.slots, remote.slot_bytes),
            });
        }
        let raw_remote = RawEndpoint { gid: remote.gid, qpn: remote.qpn, psn: remote.psn, lid: remote.lid };
        let mut err = ErrorText::new();
        // SAFETY: the queue pair is open; `raw_remote` and `err` live through the call.
        let rc = unsafe { shoal_rdma_link_connect(self.qp.raw.as_ptr(), &raw_remote, err.ptr(), err.0.len()) };
        if rc != 0 {
            return Err(RdmaError::Connect(err.text()));
        }
        SlotLink::new(self.qp, max_message, timeout)
    }
}
