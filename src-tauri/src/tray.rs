//! The tray (menu-bar) icon and its menu: the cluster in one line, the running model and its decode rate,
//! and the actions. Refreshed every second from the in-process node; the icon is redrawn only when the
//! look changes.

use crate::{notifications, window, SharedNode};
use shoal::desktop::autostart::Autostart;
use shoal::desktop::icon::tray_icon;
use shoal::desktop::tray::summarize;
use shoal::desktop::{TrayAction, TrayLook, TraySummary};
use std::time::Duration;
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Wry};

const ICON_SIZE: u32 = 64;
/// macOS tints template images to suit the menu bar; elsewhere the icon keeps its colours.
const TEMPLATE: bool = cfg!(target_os = "macos");

struct Menus {
    cluster: MenuItem<Wry>,
    model: MenuItem<Wry>,
    leave: MenuItem<Wry>,
}

pub fn create(app: &AppHandle, node: SharedNode) -> anyhow::Result<()> {
    let summary = current(&node);
    let cluster = MenuItem::with_id(app, "cluster", &summary.cluster_line, false, None::<&str>)?;
    let model = MenuItem::with_id(app, "model", &summary.model_line, false, None::<&str>)?;
    let item =
        |action: TrayAction, enabled: bool| MenuItem::with_id(app, action.id(), action.label(), enabled, None::<&str>);
    let open = item(TrayAction::OpenDashboard, true)?;
    let join = item(TrayAction::Join, true)?;
    let leave = item(TrayAction::Leave, summary.look != TrayLook::Alone)?;
    let rdma = item(TrayAction::RdmaSetup, true)?;
    let autostart = Autostart::for_current_user().ok();
    let login_on = autostart.as_ref().is_some_and(Autostart::is_enabled);
    let login = TrayAction::StartAtLogin;
    let login = CheckMenuItem::with_id(app, login.id(), login.label(), autostart.is_some(), login_on, None::<&str>)?;
    let quit = item(TrayAction::Quit, true)?;
    let separator = || PredefinedMenuItem::separator(app);
    let menu = Menu::with_items(
        app,
        &[&cluster, &model, &separator()?, &open, &join, &leave, &rdma, &separator()?, &login, &quit],
    )?;

    let for_menu = node.clone();
    let tray = TrayIconBuilder::with_id("shoal")
        .icon(icon(summary.look))
        .icon_as_template(TEMPLATE)
        .tooltip(&summary.tooltip)
        .menu(&menu)
        .on_menu_event(move |app, event| on_menu(app, &event, &for_menu, &login))
        .build(app)?;
    let menus = Menus { cluster, model, leave };
    let handle = node.lock().expect("node");
    let for_loop = node.clone();
    handle.spawn(refresh_every_second(for_loop, tray, menus, summary));
    Ok(())
}

fn on_menu(app: &AppHandle, event: &MenuEvent, node: &SharedNode, login: &CheckMenuItem<Wry>) {
    let Some(action) = TrayAction::from_id(event.id().as_ref()) else { return };
    if let Some(route) = action.dashboard_route() {
        window::show(app, route);
        return;
    }
    match action {
        TrayAction::Leave => {
            let node = node.lock().expect("node");
            let agent = node.agent.clone();
            node.spawn(async move { agent.leave().await });
        }
        TrayAction::StartAtLogin => {
            let wanted = login.is_checked().unwrap_or(false);
            let result = Autostart::for_current_user().and_then(|a| a.set_enabled(wanted));
            if let Err(e) = result {
                tracing::warn!("cannot change start at login: {e}");
                let _ = login.set_checked(!wanted);
                // Why it did not change (on macOS: move the app out of its translocated copy first).
                let why = e.to_string();
                std::thread::spawn(move || {
                    if let Err(e) = notifications::show("Start at login not changed", &why) {
                        tracing::info!("notification not shown ({e}): {why}");
                    }
                });
            }
        }
        // Quitting would stop models that run here: the dashboard asks first ("Quit anyway" quits).
        TrayAction::Quit if !node.lock().expect("node").quitting_stops().is_empty() => window::show(app, Some("quit")),
        TrayAction::Quit => app.exit(0),
        TrayAction::OpenDashboard | TrayAction::Join | TrayAction::RdmaSetup => {}
    }
}

fn current(node: &SharedNode) -> TraySummary {
    let node = node.lock().expect("node");
    let instances: Vec<_> = node.instances.registry().instances.values().cloned().collect();
    summarize(&node.agent.snapshot(), &instances, &node.instances.rates())
}

async fn refresh_every_second(node: SharedNode, tray: TrayIcon, menus: Menus, mut shown: TraySummary) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticks.tick().await;
        let summary = current(&node);
        if summary == shown {
            continue;
        }
        if summary.look != shown.look {
            let _ = tray.set_icon(Some(icon(summary.look)));
            let _ = tray.set_icon_as_template(TEMPLATE);
            let _ = menus.leave.set_enabled(summary.look != TrayLook::Alone);
        }
        let _ = menus.cluster.set_text(&summary.cluster_line);
        let _ = menus.model.set_text(&summary.model_line);
        let _ = tray.set_tooltip(Some(&summary.tooltip));
        #[cfg(target_os = "macos")]
        let _ = tray.set_title(summary.title.as_deref());
        shown = summary;
    }
}

fn icon(look: TrayLook) -> Image<'static> {
    Image::new_owned(tray_icon(look, ICON_SIZE, TEMPLATE), ICON_SIZE, ICON_SIZE)
}
