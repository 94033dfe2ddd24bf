//! The verbs shim (cargo feature `rdma`) on a machine without RDMA: it loads the platform's library at
//! run time and finds no devices without crashing; a missing or wrong library is a clear error; and the
//! doctor reads the device list through it.
#![cfg(feature = "rdma")]

mod common;

use shoal::transport::rdma::{RdmaError, RdmaLink, Verbs, DEFAULT_LIBRARY, LIBRARY_ENV};

#[test]
fn the_library_loads_and_lists_no_devices_here() {
    let verbs = Verbs::load(DEFAULT_LIBRARY).unwrap_or_else(|e| panic!("{e} (install libibverbs1)"));
    match verbs.device_names() {
        Ok(names) => assert!(names.is_empty(), "this machine has no RDMA devices: {names:?}"),
        // Linux without RDMA in the kernel: the list call fails with ENOSYS.
        Err(e @ RdmaError::NoDevices(_)) => {
            assert!(e.to_string().starts_with("no RDMA devices: ibv_get_device_list failed"), "{e}")
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
    // A queue pair on a device that is not there fails cleanly, and gives back its share of the 10
    // queue pairs each time (the 11th would otherwise fail as too many).
    for _ in 0..12 {
        let Err(e) = RdmaLink::open(&verbs, "rdma_en2", 8, 4096) else { panic!("opened a device that does not exist") };
        assert!(matches!(e, RdmaError::Device { .. }), "{e}");
    }
    let Err(e) = RdmaLink::open(&verbs, "rdma_en2", 8, 1000) else { panic!() };
    assert!(e.to_string().contains("whole 4 KiB frames"), "{e}");
}

#[test]
fn a_missing_or_wrong_library_is_a_clear_error() {
    let Err(e) = Verbs::load("/nonexistent/libibverbs.so.1") else { panic!("loaded a missing file") };
    assert!(matches!(e, RdmaError::LibraryMissing { .. }));
    let text = e.to_string();
    assert!(text.starts_with("cannot load the RDMA library /nonexistent/libibverbs.so.1: "), "{text}");
    assert!(text.contains("RDMA needs macOS 26.2"), "{text}");

    // A real library that is not the verbs library.
    let libc = if cfg!(target_os = "macos") { "libSystem.B.dylib" } else { "libc.so.6" };
    let Err(e) = Verbs::load(libc) else { panic!("{libc} passed for the verbs library") };
    assert!(e.to_string().contains("has no function ibv_get_device_list"), "{e}");
}

#[test]
fn the_doctor_lists_devices_through_the_shim() {
    let out = common::shoal().arg("doctor").env(LIBRARY_ENV, "/nonexistent/librdma.dylib").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no RDMA devices") && text.contains("cannot load the RDMA library /nonexistent/librdma.dylib"),
        "{text}"
    );

    let out = common::shoal().arg("doctor").env_remove(LIBRARY_ENV).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no RDMA devices") && !text.contains("cannot load"), "{text}");
}
