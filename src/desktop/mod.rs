//! What the menu-bar app shows and does, kept here so it is tested without a window: the tray's look and
//! menu lines from the cluster ([`tray`]), which events become desktop notifications ([`notices`]),
//! start at login ([`autostart`]), the tray icon's pixels ([`icon`]), the in-process node ([`runner`]) and
//! whether there is a display to open a window on ([`display`]), and what quitting would stop ([`quit`]).
//! The Tauri crate (`src-tauri/`) only renders these.

pub mod autostart;
pub mod display;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod icon;
pub mod notices;
pub mod quit;
pub mod runner;
pub mod tray;

pub use notices::{Notice, NoticeBoard};
pub use runner::BackgroundNode;
pub use tray::{TrayAction, TrayLook, TraySummary};
