//! Whether the app can open a window here. On Linux a window needs a graphical session (an X server
//! named by `DISPLAY`, or a Wayland compositor named by `WAYLAND_DISPLAY`); without one GTK fails to
//! start and Tauri panics. The app checks first and says to run the headless node instead. macOS and
//! Windows always have a display for a logged-in user's app.

/// Why the app cannot open a window, given how the environment names variables (`var`), or None when it
/// can.
pub fn missing_display(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    if !cfg!(any(target_os = "linux", target_os = "freebsd", target_os = "openbsd", target_os = "netbsd")) {
        return None;
    }
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    if set("DISPLAY") || set("WAYLAND_DISPLAY") {
        return None;
    }
    Some(
        "there is no display here (neither DISPLAY nor WAYLAND_DISPLAY is set), so the app cannot open its window. \
         Run the node headless instead, with the same options: `shoal node` (cargo build --release, then \
         target/release/shoal node); its dashboard is then at http://127.0.0.1:52520/ for a browser"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::missing_display;

    #[test]
    fn a_session_without_a_display_is_told_to_run_the_headless_node() {
        let none = missing_display(|_| None);
        if cfg!(target_os = "linux") {
            assert!(none.unwrap().contains("shoal node"));
            assert!(missing_display(|v| (v == "DISPLAY").then(|| ":0".into())).is_none());
            assert!(missing_display(|v| (v == "WAYLAND_DISPLAY").then(|| "wayland-0".into())).is_none());
            assert!(missing_display(|v| (v == "DISPLAY").then(|| " ".into())).is_some(), "empty is not a display");
        } else {
            assert!(none.is_none());
        }
    }
}
