//! Routes ggml's and llama.cpp's log lines into `tracing`, so they obey the same filters as shoal's own.

use super::sys;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};

// What the last complete line was logged at, so continuation pieces (`GGML_LOG_LEVEL_CONT`) keep it.
thread_local! {
    static PENDING: RefCell<(u32, String)> = const { RefCell::new((sys::GGML_LOG_LEVEL_INFO, String::new())) };
}

pub(super) fn install() {
    // SAFETY: the callback is a plain function valid for the whole program; user data is unused.
    unsafe {
        sys::ggml_log_set(Some(forward), std::ptr::null_mut());
        sys::llama_log_set(Some(forward), std::ptr::null_mut());
    }
}

unsafe extern "C" fn forward(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated string valid for the duration of the call.
    let piece = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        if level != sys::GGML_LOG_LEVEL_CONT {
            pending.0 = level;
        }
        pending.1.push_str(&piece);
        while let Some(end) = pending.1.find('\n') {
            let line: String = pending.1.drain(..=end).collect();
            emit(pending.0, line.trim_end());
        }
    });
}

fn emit(level: u32, line: &str) {
    if line.is_empty() {
        return;
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "ggml", "{line}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "ggml", "{line}"),
        sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "ggml", "{line}"),
        _ => tracing::trace!(target: "ggml", "{line}"),
    }
}
