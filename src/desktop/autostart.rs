//! Start at login: a LaunchAgent on macOS (`~/Library/LaunchAgents/dev.shoal.desktop.plist`), an XDG
//! autostart entry elsewhere (`$XDG_CONFIG_HOME/autostart/shoal.desktop`). Turning it off removes the file.
//!
//! On macOS the app inside its bundle is started by bundle identifier through LaunchServices
//! (`/usr/bin/open -b dev.shoal.desktop`), which finds the app wherever it has been moved since, and the
//! agent names the bundle (`AssociatedBundleIdentifiers`) so Login Items settings show it as shoal's. An
//! app that runs translocated (Gatekeeper's temporary read-only copy of a downloaded app that was not
//! moved) is refused: that path is gone at the next login. A bare executable (`cargo run`) and every
//! other platform start the executable by its path (an AppImage's own file, not its mount while it
//! runs). The entry's text is a plain function of the platform and the executable's path, so both
//! platforms' entries are tested everywhere.

use std::io;
use std::path::{Path, PathBuf};

/// The app's bundle identifier (`identifier` in `src-tauri/tauri.conf.json`), also the LaunchAgent's label.
pub const BUNDLE_ID: &str = "dev.shoal.desktop";

/// Where macOS runs a quarantined app from until it is moved (App Translocation).
const TRANSLOCATED: &str = "/AppTranslocation/";

/// Which kind of login item to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// A LaunchAgent property list.
    MacOs,
    /// An XDG autostart desktop entry (Linux and other free desktops).
    Xdg,
}

impl Platform {
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Xdg
        }
    }
}

/// What the login item starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The installed app bundle with this identifier, found by LaunchServices.
    Bundle(String),
    /// This executable, by its path.
    Executable(PathBuf),
}

/// The `.app` bundle `exe` is the main executable of (`X.app/Contents/MacOS/exe`), if any.
pub fn enclosing_bundle(exe: &Path) -> Option<&Path> {
    let macos = exe.parent()?;
    let contents = macos.parent()?;
    let bundle = contents.parent()?;
    let is_app = bundle.extension().is_some_and(|e| e.eq_ignore_ascii_case("app"));
    (macos.file_name()? == "MacOS" && contents.file_name()? == "Contents" && is_app).then_some(bundle)
}

/// What the LaunchAgent should start for the running executable `exe`; an error (to show the person)
/// when no login item could start it again.
pub fn macos_launch(exe: &Path) -> io::Result<Launch> {
    if exe.to_string_lossy().contains(TRANSLOCATED) {
        return Err(io::Error::other(
            "shoal runs from a temporary copy macOS made because it was not moved after downloading: move \
             shoal to the Applications folder, open it from there, then turn on Start at login",
        ));
    }
    Ok(match enclosing_bundle(exe) {
        Some(_) => Launch::Bundle(BUNDLE_ID.to_string()),
        None => Launch::Executable(exe.to_path_buf()),
    })
}

/// The executable an XDG login item starts: the AppImage file itself when running from one (`APPIMAGE`,
/// set by its runtime; the running executable is inside a mount that is gone after it exits).
pub fn xdg_executable(current_exe: PathBuf, appimage: Option<PathBuf>) -> PathBuf {
    appimage.filter(|image| image.is_absolute()).unwrap_or(current_exe)
}

/// Where the login item lives for a user whose home is `home` (and XDG config dir `xdg_config`, if set).
pub fn entry_path(platform: Platform, home: &Path, xdg_config: Option<&Path>) -> PathBuf {
    match platform {
        Platform::MacOs => home.join("Library/LaunchAgents").join(format!("{BUNDLE_ID}.plist")),
        Platform::Xdg => {
            xdg_config.map_or_else(|| home.join(".config"), Path::to_path_buf).join("autostart/shoal.desktop")
        }
    }
}

/// The text of the login item on `platform` that starts the app whose running executable is `exe`.
pub fn entry_contents(platform: Platform, exe: &Path) -> io::Result<String> {
    Ok(match platform {
        Platform::MacOs => launch_agent(&macos_launch(exe)?),
        Platform::Xdg => desktop_entry(exe),
    })
}

fn launch_agent(launch: &Launch) -> String {
    let (arguments, associated) = match launch {
        Launch::Bundle(id) => (vec!["/usr/bin/open".to_string(), "-b".to_string(), id.clone()], Some(id)),
        Launch::Executable(exe) => (vec![exe.display().to_string()], None),
    };
    let strings = |values: &[String]| values.iter().map(|v| format!("<string>{}</string>", xml(v))).collect::<String>();
    let associated = associated.map_or_else(String::new, |id| {
        format!("  <key>AssociatedBundleIdentifiers</key><array>{}</array>\n", strings(std::slice::from_ref(id)))
    });
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
<plist version=\"1.0\">\n<dict>\n\
  <key>Label</key><string>{BUNDLE_ID}</string>\n\
  <key>ProgramArguments</key><array>{}</array>\n\
{associated}\
  <key>RunAtLoad</key><true/>\n\
  <key>ProcessType</key><string>Interactive</string>\n\
</dict>\n</plist>\n",
        strings(&arguments)
    )
}

fn xml(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn desktop_entry(exe: &Path) -> String {
    // The Exec key quotes arguments with double quotes and escapes `"`, `` ` ``, `$` and `\` inside.
    let quoted: String = exe
        .display()
        .to_string()
        .chars()
        .flat_map(|c| match c {
            '"' | '`' | '$' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    format!(
        "[Desktop Entry]\nType=Application\nName=shoal\nComment=Run one large language model across several \
         computers\nExec=\"{quoted}\"\nTerminal=false\nX-GNOME-Autostart-enabled=true\n"
    )
}

pub struct Autostart {
    platform: Platform,
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
        let platform = Platform::current();
        let mut exe = std::env::current_exe()?;
        if platform == Platform::Xdg {
            exe = xdg_executable(exe, std::env::var_os("APPIMAGE").map(PathBuf::from));
        }
        Ok(Autostart::new(platform, entry_path(platform, &home, xdg.as_deref()), exe))
    }

    pub fn new(platform: Platform, path: PathBuf, exe: PathBuf) -> Autostart {
        Autostart { platform, path, exe }
    }

    pub fn is_enabled(&self) -> bool {
        self.path.is_file()
    }

    /// Writes or removes the login item; refuses (with the reason to show) when it could not start the app.
    pub fn set_enabled(&self, enabled: bool) -> io::Result<()> {
        if enabled {
            let contents = entry_contents(self.platform, &self.exe)?;
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&self.path, contents)
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

    const INSTALLED: &str = "/Applications/shoal.app/Contents/MacOS/shoal-app";
    const TRANSLOCATED_EXE: &str =
        "/private/var/folders/x1/abc/T/AppTranslocation/6A1B-22C3/d/shoal.app/Contents/MacOS/shoal-app";

    #[test]
    fn turning_it_on_writes_an_entry_that_starts_this_executable_and_off_removes_it() {
        let home = tempfile::tempdir().unwrap();
        let path = entry_path(Platform::Xdg, home.path(), None);
        assert_eq!(path, home.path().join(".config/autostart/shoal.desktop"));
        let autostart = Autostart::new(Platform::Xdg, path.clone(), PathBuf::from("/opt/shoal $HOME/shoal-app"));
        assert!(!autostart.is_enabled());
        autostart.set_enabled(true).unwrap();
        assert!(autostart.is_enabled());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[Desktop Entry]\nType=Application\n"), "{text}");
        assert!(text.contains("\nExec=\"/opt/shoal \\$HOME/shoal-app\"\n"), "{text}");
        autostart.set_enabled(false).unwrap();
        assert!(!autostart.is_enabled());
        autostart.set_enabled(false).unwrap();
    }

    #[test]
    fn the_xdg_config_dir_is_respected_and_the_launch_agent_is_named_by_the_bundle_id() {
        let path = entry_path(Platform::Xdg, Path::new("/home/a"), Some(Path::new("/cfg")));
        assert_eq!(path, PathBuf::from("/cfg/autostart/shoal.desktop"));
        let path = entry_path(Platform::MacOs, Path::new("/Users/a"), Some(Path::new("/cfg")));
        assert_eq!(path, PathBuf::from("/Users/a/Library/LaunchAgents/dev.shoal.desktop.plist"));
    }

    #[test]
    fn a_bundled_app_is_started_through_launch_services_by_its_bundle_id() {
        assert_eq!(enclosing_bundle(Path::new(INSTALLED)), Some(Path::new("/Applications/shoal.app")));
        let launch = macos_launch(Path::new(INSTALLED)).unwrap();
        assert_eq!(launch, Launch::Bundle("dev.shoal.desktop".into()));
        let plist = entry_contents(Platform::MacOs, Path::new(INSTALLED)).unwrap();
        assert!(plist.contains("<key>Label</key><string>dev.shoal.desktop</string>"), "{plist}");
        assert!(
            plist.contains(
                "<key>ProgramArguments</key><array><string>/usr/bin/open</string><string>-b</string>\
                 <string>dev.shoal.desktop</string></array>"
            ),
            "{plist}"
        );
        assert!(
            plist.contains("<key>AssociatedBundleIdentifiers</key><array><string>dev.shoal.desktop</string></array>"),
            "{plist}"
        );
        assert!(plist.contains("<key>RunAtLoad</key><true/>"), "{plist}");
        assert!(!plist.contains(INSTALLED), "the bundle's path must not be in the agent: {plist}");
        assert_well_formed(&plist);
    }

    #[test]
    fn a_bare_executable_is_started_by_its_path_with_xml_escaped() {
        let exe = Path::new("/Users/a/src/shoal & co/target/release/shoal-app");
        assert_eq!(enclosing_bundle(exe), None);
        assert_eq!(macos_launch(exe).unwrap(), Launch::Executable(exe.to_path_buf()));
        let plist = entry_contents(Platform::MacOs, exe).unwrap();
        assert!(
            plist.contains(
                "<key>ProgramArguments</key><array><string>/Users/a/src/shoal &amp; co/target/release/shoal-app\
                 </string></array>"
            ),
            "{plist}"
        );
        assert!(!plist.contains("AssociatedBundleIdentifiers"), "{plist}");
        assert_well_formed(&plist);
        // Not a bundle: the executable must sit in Contents/MacOS of a directory named *.app.
        assert_eq!(enclosing_bundle(Path::new("/x/shoal.app/MacOS/shoal-app")), None);
        assert_eq!(enclosing_bundle(Path::new("/x/shoal/Contents/MacOS/shoal-app")), None);
        assert_eq!(enclosing_bundle(Path::new("shoal-app")), None);
    }

    #[test]
    fn a_translocated_app_is_refused_with_what_to_do_and_nothing_is_written() {
        let error = entry_contents(Platform::MacOs, Path::new(TRANSLOCATED_EXE)).unwrap_err();
        assert!(error.to_string().contains("move shoal to the Applications folder"), "{error}");
        let home = tempfile::tempdir().unwrap();
        let path = entry_path(Platform::MacOs, home.path(), None);
        let autostart = Autostart::new(Platform::MacOs, path.clone(), PathBuf::from(TRANSLOCATED_EXE));
        assert!(autostart.set_enabled(true).is_err());
        assert!(!path.exists() && !autostart.is_enabled());
        // On Linux the same path is just a path (no translocation there).
        let entry = entry_contents(Platform::Xdg, Path::new(TRANSLOCATED_EXE)).unwrap();
        assert!(entry.contains(&format!("Exec=\"{TRANSLOCATED_EXE}\"")), "{entry}");
    }

    #[test]
    fn an_appimage_is_started_from_its_file_not_its_mount() {
        let mounted = PathBuf::from("/tmp/.mount_shoalX1/usr/bin/shoal-app");
        let image = PathBuf::from("/home/a/Apps/shoal_0.1.0_amd64.AppImage");
        assert_eq!(xdg_executable(mounted.clone(), Some(image.clone())), image);
        assert_eq!(xdg_executable(mounted.clone(), None), mounted);
        assert_eq!(xdg_executable(mounted.clone(), Some(PathBuf::from("relative"))), mounted);
    }

    #[test]
    fn turning_on_a_launch_agent_writes_it_under_library_launch_agents() {
        let home = tempfile::tempdir().unwrap();
        let path = entry_path(Platform::MacOs, home.path(), None);
        let autostart = Autostart::new(Platform::MacOs, path.clone(), PathBuf::from(INSTALLED));
        autostart.set_enabled(true).unwrap();
        let text = std::fs::read_to_string(home.path().join("Library/LaunchAgents/dev.shoal.desktop.plist")).unwrap();
        assert!(text.contains("<string>/usr/bin/open</string>"), "{text}");
        autostart.set_enabled(false).unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn the_bundle_id_is_the_apps_identifier_and_its_info_plist_names_the_service_discovery_advertises() {
        let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("src-tauri");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(app.join("tauri.conf.json")).unwrap()).unwrap();
        assert_eq!(config["identifier"], BUNDLE_ID);
        let plist = std::fs::read_to_string(app.join("Info.plist")).unwrap();
        assert_well_formed(&plist);
        let service = crate::discovery::SERVICE_TYPE.trim_end_matches(".local.");
        assert!(plist.contains(&format!("<key>NSBonjourServices</key>\n\t<array>\n\t\t<string>{service}</string>")));
        assert!(plist.contains("<key>NSLocalNetworkUsageDescription</key>"), "{plist}");
        assert!(plist.contains("<key>LSUIElement</key>\n\t<true/>"), "{plist}");
    }

    /// Every tag opened is closed in order (the property list parses as XML).
    fn assert_well_formed(plist: &str) {
        let body = &plist[plist.find("<plist").unwrap()..];
        let body = without_comments(body);
        let body = body.as_str();
        let mut open: Vec<&str> = Vec::new();
        let mut rest = body;
        while let Some(start) = rest.find('<') {
            let end = start + rest[start..].find('>').unwrap();
            let tag = &rest[start + 1..end];
            rest = &rest[end + 1..];
            if tag.ends_with('/') {
                continue;
            }
            let name = tag.split_whitespace().next().unwrap();
            match name.strip_prefix('/') {
                Some(closing) => assert_eq!(open.pop(), Some(closing), "{plist}"),
                None => open.push(name),
            }
        }
        assert!(open.is_empty(), "unclosed {open:?} in {plist}");
    }

    fn without_comments(text: &str) -> String {
        let mut kept = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("<!--") {
            kept.push_str(&rest[..start]);
            rest = &rest[start + rest[start..].find("-->").unwrap() + 3..];
        }
        kept + rest
    }
}
