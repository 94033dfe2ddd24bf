//! shoal's menu-bar app: the same node agent as `shoal node`, run in-process, with a tray icon whose
//! look and menu follow the cluster, desktop notifications, start at login, and a window showing the
//! dashboard that the node serves. Everything else (views, actions) is the dashboard talking HTTP to the
//! node, so the app stays a thin shell over the core (`shoal::desktop`).
//!
//! The app binary is also the worker: the agent starts each model stage as `shoal-app worker …`.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod args;
mod notifications;
mod tray;
mod window;

use args::{AppArgs, AppCommand};
use clap::Parser;
use shoal::desktop::BackgroundNode;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use tauri::{Manager, RunEvent};

/// The node, shared by the tray, the notifications and the exit handler.
pub type SharedNode = Arc<Mutex<BackgroundNode>>;

fn main() -> ExitCode {
    let args = AppArgs::parse();
    if let Some(AppCommand::Worker(worker)) = args.command {
        return report(shoal::worker::args::run(worker));
    }
    args::init_logging();
    if let Some(reason) = shoal::desktop::display::missing_display(|name| std::env::var(name).ok()) {
        eprintln!("shoal-app: {reason}");
        return ExitCode::FAILURE;
    }
    let node = match BackgroundNode::start(args.node) {
        Ok(node) => node,
        Err(e) => return report(Err(e)),
    };
    eprintln!("shoal: node {} — dashboard {}", node.agent.identity.name, node.dashboard_url());
    report(run(Arc::new(Mutex::new(node))))
}

fn run(node: SharedNode) -> anyhow::Result<()> {
    let for_setup = node.clone();
    let app = tauri::Builder::default()
        .setup(move |app| {
            #[cfg(target_os = "macos")]
            app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            let handle = app.handle().clone();
            let url = for_setup.lock().expect("node").dashboard_url();
            window::open(&handle, &url)?;
            tray::create(&handle, for_setup.clone())?;
            notifications::start(&handle, &for_setup);
            // The dashboard's "Quit anyway" (POST /api/quit) ends the app as the tray's Quit does.
            let quitter = handle.clone();
            for_setup.lock().expect("node").quit.set(move || quitter.exit(0));
            app.manage(for_setup.clone());
            Ok(())
        })
        .on_window_event(window::on_event)
        .build(tauri::generate_context!())?;
    let mut exit_code = 0;
    app.run(move |_app, event| match event {
        // Closing the window keeps the app in the menu bar; only Quit (an explicit exit code) ends it.
        RunEvent::ExitRequested { api, code: None, .. } => api.prevent_exit(),
        RunEvent::ExitRequested { code: Some(code), .. } => exit_code = code,
        // Once the node has stopped (its workers ended, its state saved) nothing is left to do: end the
        // process here rather than run the window's, the tray's and the C libraries' teardown, which
        // crashed once in CI at Quit (SIGSEGV, not reproduced in 70 runs here).
        RunEvent::Exit => {
            node.lock().expect("node").stop();
            shoal::os::exit_at_once(exit_code)
        }
        _ => {}
    });
    Ok(())
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", shoal::errors::chain(&e));
            ExitCode::FAILURE
        }
    }
}
