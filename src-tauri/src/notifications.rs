//! Desktop notifications (notify-rust): the core's [`NoticeBoard`] decides which cluster events deserve
//! one; this shows them, except while the dashboard window has focus.

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
            tokio::task::spawn_blocking(move || {
                let shown =
                    notify_rust::Notification::new().appname("shoal").summary(&notice.title).body(&notice.body).show();
                match shown {
                    Ok(_) => tracing::info!("notified: {}", notice.title),
                    Err(e) => tracing::info!("notification not shown ({e}): {}", notice.title),
                }
            });
        }
    });
}
