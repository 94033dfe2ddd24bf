//! The tray (menu-bar) icon and its menu: the cluster in one line, the running model and its decode rate,
//! and the actions. Refreshed every second from the in-process node; the icon is redrawn only when the
//! look changes.

use crate::{window, SharedNode};
use shoal::desktop::autostart::Autostart;
use shoal::desktop::icon::tray_icon;
use shoal::desktop::tray::summarize;
use shoal::desktop::{TrayLook, TraySummary};
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
    let open = MenuItem::with_id(app, "open", "Open dashboard", true, None::<&str>)?;
    let join = MenuItem::with_id(app, "join", "Join a cluster…", true, None::<&str>)?;
    let leave = MenuItem::with_id(app, "leave", "Leave cluster", summary.look != TrayLook::Alone, None::<&str>)?;
    let rdma = MenuItem::with_id(app, "rdma", "RDMA setup…", true, None::<&str>)?;
    let autostart = Autostart::for_current_user().ok();
    let login_on = autostart.as_ref().is_some_and(Autostart::is_enabled);
    let login = CheckMenuItem::with_id(app, "login", "Start at login", autostart.is_some(), login_on, None::<&str>)?;
    let quit = MenuItem::with_id(app, "quit", "Quit shoal", true, None::<&str>)?;
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
    match event.id().as_ref() {
        "open" => window::show(app, None),
        "join" => window::show(app, Some("mesh/join")),
        "rdma" => window::show(app, Some("setup")),
        "leave" => {
            let node = node.lock().expect("node");
            let agent = node.agent.clone();
            node.spawn(async move { agent.leave().await });
        }
        "login" => {
            let wanted = login.is_checked().unwrap_or(false);
            let result = Autostart::for_current_user().and_then(|a| a.set_enabled(wanted));
            if let Err(e) = result {
                tracing::warn!("cannot change start at login: {e}");
                let _ = login.set_checked(!wanted);
            }
        }
        "quit" => app.exit(0),
        _ => {}
    }
}

fn current(node: &SharedNode) -> TraySummary {
    let node = node.lock().expect("node");
    let agent = &node.agent;
    let instances: Vec<_> = agent.registry().instances.values().cloned().collect();
    summarize(&agent.snapshot(), &instances, &agent.rates())
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
