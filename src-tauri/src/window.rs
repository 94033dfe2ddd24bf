//! The dashboard window: the page the in-process node serves, so the app and a browser show the same
//! thing. Closing it hides it; the app lives on in the menu bar. Its focus decides whether notifications
//! are shown (not while it has it).

use tauri::{AppHandle, Manager, WebviewUrl, WebviewWindowBuilder, Window, WindowEvent};

pub const MAIN: &str = "main";

pub fn open(app: &AppHandle, url: &str) -> anyhow::Result<()> {
    let url = url.parse()?;
    WebviewWindowBuilder::new(app, MAIN, WebviewUrl::External(url))
        .title("shoal")
        .inner_size(1120.0, 760.0)
        .min_inner_size(380.0, 520.0)
        .build()?;
    Ok(())
}

/// Shows the window, in front, at a view of the dashboard (`mesh`, `mesh/join`, `setup`, …).
pub fn show(app: &AppHandle, view: Option<&str>) {
    let Some(window) = app.get_webview_window(MAIN) else { return };
    if let Some(view) = view {
        let _ = window.eval(format!("window.location.hash = '#/{view}'"));
    }
    let _ = window.unminimize();
    let _ = window.show();
    let _ = window.set_focus();
}

/// Whether the person is looking at the dashboard (no notifications then).
pub fn is_focused(app: &AppHandle) -> bool {
    app.get_webview_window(MAIN).and_then(|w| w.is_focused().ok()).unwrap_or(false)
}

pub fn on_event(window: &Window, event: &WindowEvent) {
    if window.label() != MAIN {
        return;
    }
    match event {
        WindowEvent::CloseRequested { api, .. } => {
            api.prevent_close();
            let _ = window.hide();
        }
        // Says why notifications stop and start again (the app test waits for these lines too).
        WindowEvent::Focused(true) => tracing::info!("the dashboard window has focus: no notifications"),
        WindowEvent::Focused(false) => tracing::info!("the dashboard window lost focus: notifications shown"),
        _ => {}
    }
}
