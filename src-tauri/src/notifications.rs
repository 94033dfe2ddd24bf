//! Desktop notifications (notify-rust): the core's [`NoticeBoard`] decides which cluster events deserve
//! one; this shows them, except while the dashboard window has focus. On macOS they are sent as the app's
//! bundle (`dev.shoal.desktop`), not as notify-rust's default sender.

use crate::{window, SharedNode};
use shoal::desktop::NoticeBoard;
use tauri::AppHandle;
use tokio::sync::broadcast::error::RecvError;

pub fn start(app: &AppHandle, node: &SharedNode) {
    let node = node.lock().expect("node");
    let agent = node.agent.clone();
    let app = app.clone();
    node.spawn(async move {
        let mut events = agent.subscribe();
        let mut board = NoticeBoard::new(&agent.snapshot());
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(_)) => {
                    board.reset(&agent.snapshot());
                    continue;
                }
                Err(RecvError::Closed) => return,
            };
            let Some(notice) = board.on_event(&event, shoal::util::now_ms()) else { continue };
            if window::is_focused(&app) {
                tracing::info!("not notifying while the dashboard has focus: {}", notice.title);
                continue;
            }
            tokio::task::spawn_blocking(move || match show(&notice.title, &notice.body) {
                Ok(()) => tracing::info!("notified: {}", notice.title),
                Err(e) => tracing::info!("notification not shown ({e}): {}", notice.title),
            });
        }
    });
}

/// Shows one desktop notification. It blocks (a D-Bus call on Linux): call it off the event loop.
pub fn show(title: &str, body: &str) -> notify_rust::error::Result<()> {
    #[cfg(target_os = "macos")]
    send_as_this_app();
    notify_rust::Notification::new().appname("shoal").summary(title).body(body).show().map(|_| ())
}

/// Without an application set, notify-rust on macOS looks up an app named "use_default" (macOS asks
/// "Where is use_default?") and sends as Finder. Set once: mac-notification-sys refuses a second call.
#[cfg(target_os = "macos")]
fn send_as_this_app() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails when LaunchServices knows no app with this id (an unbundled `cargo run`).
        if let Err(e) = notify_rust::set_application(shoal::desktop::autostart::BUNDLE_ID) {
            tracing::info!("notifications are not sent as {}: {e}", shoal::desktop::autostart::BUNDLE_ID);
        }
    });
}
