//! Start at login: a LaunchAgent on macOS (`~/Library/LaunchAgents/dev.shoal.app.plist`), an XDG
//! autostart entry elsewhere (`$XDG_CONFIG_HOME/autostart/shoal.desktop`). The entry starts the app's
//! own executable; turning it off removes the file.

use std::io;
use std::path::{Path, PathBuf};

const LAUNCH_AGENT_LABEL: &str = "dev.shoal.app";

/// Where the login item lives for a user whose home is `home` (and XDG config dir `xdg_config`, if set).
pub fn entry_path(home: &Path, xdg_config: Option<&Path>) -> PathBuf {
    if cfg!(target_os = "macos") {
        home.join("Library/LaunchAgents").join(format!("{LAUNCH_AGENT_LABEL}.plist"))
    } else {
        xdg_config.map_or_else(|| home.join(".config"), Path::to_path_buf).join("autostart/shoal.desktop")
    }
}

/// The login item that starts `exe`.
pub fn entry_contents(exe: &Path) -> String {
    let exe = exe.display().to_string();
    if cfg!(target_os = "macos") {
        let escaped = exe.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
<plist version=\"1.0\">\n<dict>\n\
  <key>Label</key><string>{LAUNCH_AGENT_LABEL}</string>\n\
  <key>ProgramArguments</key><array><string>{escaped}</string></array>\n\
  <key>RunAtLoad</key><true/>\n\
  <key>ProcessType</key><string>Interactive</string>\n\
</dict>\n</plist>\n"
        )
    } else {
        // The Exec key quotes arguments with double quotes and escapes `"`, `` ` ``, `$` and `\` inside.
        let quoted: String = exe
            .chars()
            .flat_map(|c| match c {
                '"' | '`' | '$' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!(
            "[Desktop Entry]\nType=Application\nName=shoal\nComment=Run one large language model across \
             several computers\nExec=\"{quoted}\"\nTerminal=false\nX-GNOME-Autostart-enabled=true\n"
        )
    }
}

pub struct Autostart {
    path: PathBuf,
    exe: PathBuf,
}

impl Autostart {
    /// Start at login for this user and this executable.
    pub fn for_current_user() -> io::Result<Autostart> {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "HOME is not set"))?;
        let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from);
        Ok(Autostart::new(entry_path(&home, xdg.as_deref()), std::env::current_exe()?))
    }

    pub fn new(path: PathBuf, exe: PathBuf) -> Autostart {
        Autostart { path, exe }
    }

    pub fn is_enabled(&self) -> bool {
        self.path.is_file()
    }

    pub fn set_enabled(&self, enabled: bool) -> io::Result<()> {
        if enabled {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&self.path, entry_contents(&self.exe))
        } else {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turning_it_on_writes_an_entry_that_starts_this_executable_and_off_removes_it() {
        let home = tempfile::tempdir().unwrap();
        let path = entry_path(home.path(), None);
        let autostart = Autostart::new(path.clone(), PathBuf::from("/opt/shoal $HOME/shoal-app"));
        assert!(!autostart.is_enabled());
        autostart.set_enabled(true).unwrap();
        assert!(autostart.is_enabled());
        let text = std::fs::read_to_string(&path).unwrap();
        if cfg!(target_os = "macos") {
            assert!(text.contains("<string>/opt/shoal $HOME/shoal-app</string>"));
        } else {
            assert_eq!(path, home.path().join(".config/autostart/shoal.desktop"));
            assert!(text.contains("Exec=\"/opt/shoal \\$HOME/shoal-app\"\n"), "{text}");
        }
        autostart.set_enabled(false).unwrap();
        assert!(!autostart.is_enabled());
        autostart.set_enabled(false).unwrap();
    }

    #[test]
    #[cfg(not(target_os = "macos"))]
    fn the_xdg_config_dir_is_respected() {
        let path = entry_path(Path::new("/home/a"), Some(Path::new("/cfg")));
        assert_eq!(path, PathBuf::from("/cfg/autostart/shoal.desktop"));
    }
}
