//! The fixes the RDMA wizard can make itself: make the Thunderbolt Bridge inactive, and give each
//! cabled Thunderbolt interface a link-local IPv4 (without one the IPv4-mapped GID at index 1 does not
//! exist and queue pairs fail with errno 22). Each fix is a list of exact commands: on macOS shoal runs
//! them behind the system's administrator prompt; elsewhere, or when the prompt is refused, it shows
//! them to paste into Terminal. Commands go through a [`CommandRunner`], so tests record them instead
//! of running them.

use super::checks::{NodeReport, Verdict};
use crate::util::LockExt;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum FixId {
    /// Make the Thunderbolt Bridge (bridge0) inactive: frames loop between Macs cabled in a ring or mesh.
    ThunderboltBridge,
    /// Give each cabled Thunderbolt interface without IPv4 a link-local address.
    LinkLocalIpv4,
}

/// One command as its program and arguments (run without a shell).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemCommand {
    pub program: String,
    pub args: Vec<String>,
}

impl SystemCommand {
    fn new(program: &str, args: &[&str]) -> SystemCommand {
        SystemCommand { program: program.into(), args: args.iter().map(|a| a.to_string()).collect() }
    }

    /// The command as a shell line (arguments quoted where needed).
    pub fn shell_line(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .map(shell_quote)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Quotes a word for a POSIX shell: bare when safe, in double quotes when only spaces need it, else in
/// single quotes.
fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else if word.chars().all(|c| plain(c) || c == ' ') {
        format!("\"{word}\"")
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A fix the doctor's report calls for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Fix {
    pub id: FixId,
    pub title: String,
    pub explanation: String,
    /// Exactly what runs, as it would be pasted into Terminal (with `sudo`).
    pub commands: Vec<String>,
    /// shoal can run it on this node (macOS, behind the administrator prompt).
    pub can_apply: bool,
    #[serde(skip)]
    pub steps: Vec<SystemCommand>,
}

/// The fixes `report` calls for, in the order to make them.
pub fn available(report: &NodeReport) -> Vec<Fix> {
    let on_mac = report.platform == "macos";
    let failed = |id: &str| report.check(id).is_some_and(|c| c.verdict == Verdict::Fail);
    let mut fixes = Vec::new();
    if failed("thunderbolt_bridge") {
        fixes.push(fix(
            FixId::ThunderboltBridge,
            "Make the Thunderbolt Bridge inactive",
            "The Thunderbolt Bridge joins every Thunderbolt port like a hub, so frames loop between Macs cabled \
             to each other. Turning its network service off is what System Settings › Network › Thunderbolt \
             Bridge › Make Inactive does; taking bridge0 down applies it at once.",
            vec![
                SystemCommand::new("networksetup", &["-setnetworkserviceenabled", "Thunderbolt Bridge", "off"]),
                SystemCommand::new("ifconfig", &["bridge0", "down"]),
            ],
            on_mac,
        ));
    }
    let missing: Vec<SystemCommand> = report
        .links
        .iter()
        .filter(|l| l.ipv4.is_empty())
        .filter_map(|l| {
            let interface = l.interface.as_deref()?;
            let address = l.suggested_ipv4.as_deref()?;
            Some(SystemCommand::new("ifconfig", &[interface, "inet", address, "netmask", "255.255.0.0", "alias"]))
        })
        .collect();
    if failed("ipv4") && !missing.is_empty() {
        fixes.push(fix(
            FixId::LinkLocalIpv4,
            "Give each Thunderbolt port a link-local IPv4 address",
            "RDMA addresses a peer by the IPv4 address of its Thunderbolt interface (GID index 1); without one, \
             connecting a queue pair fails. macOS assigns one by itself only minutes after DHCP gives up. The \
             address lasts until the Mac restarts; shoal offers this fix again if it is missing then.",
            missing,
            on_mac,
        ));
    }
    fixes
}

fn fix(id: FixId, title: &str, explanation: &str, steps: Vec<SystemCommand>, can_apply: bool) -> Fix {
    Fix {
        id,
        title: title.into(),
        explanation: explanation.into(),
        commands: steps.iter().map(|s| format!("sudo {}", s.shell_line())).collect(),
        can_apply,
        steps,
    }
}

/// Runs system commands. Tests use [`RecordingRunner`].
pub trait CommandRunner: Send + Sync {
    /// Runs `program` with `args`: its standard output, or what went wrong.
    fn run(&self, program: &str, args: &[String]) -> Result<String, String>;
}

/// Runs commands on this machine.
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, program: &str, args: &[String]) -> Result<String, String> {
        let out = std::process::Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(format!("{program} failed ({}): {}", out.status, stderr.trim()))
        }
    }
}

/// Records the commands it is given instead of running them, and answers with `answer`.
#[derive(Default)]
pub struct RecordingRunner {
    pub calls: Mutex<Vec<Vec<String>>>,
    /// `Err` makes every command fail with that message.
    pub answer: Option<Result<String, String>>,
}

impl CommandRunner for RecordingRunner {
    fn run(&self, program: &str, args: &[String]) -> Result<String, String> {
        let mut call = vec![program.to_string()];
        call.extend(args.iter().cloned());
        self.calls.locked().push(call);
        self.answer.clone().unwrap_or(Ok(String::new()))
    }
}

/// What became of a fix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum FixOutcome {
    Applied {
        fix: FixId,
        commands: Vec<String>,
    },
    /// The administrator prompt was dismissed.
    Cancelled {
        fix: FixId,
        commands: Vec<String>,
    },
    Failed {
        fix: FixId,
        error: String,
        commands: Vec<String>,
    },
    /// This node cannot run it: paste the commands into Terminal on the Mac.
    ShowOnly {
        fix: FixId,
        reason: String,
        commands: Vec<String>,
    },
}

/// An AppleScript string literal of `text`.
fn applescript_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', r"\\").replace('"', "\\\""))
}

/// The `osascript` arguments that run `steps` as root behind macOS's administrator prompt.
pub fn administrator_prompt(steps: &[SystemCommand]) -> Vec<String> {
    let script = steps.iter().map(SystemCommand::shell_line).collect::<Vec<_>>().join(" && ");
    vec!["-e".into(), format!("do shell script {} with administrator privileges", applescript_string(&script))]
}

/// Makes `fix`: on macOS through the administrator prompt, elsewhere only shown.
pub fn apply(fix: &Fix, runner: &dyn CommandRunner) -> FixOutcome {
    let commands = fix.commands.clone();
    if !fix.can_apply {
        return FixOutcome::ShowOnly {
            fix: fix.id,
            reason: "shoal can make this change only on a Mac: run these commands in Terminal there".into(),
            commands,
        };
    }
    match runner.run("osascript", &administrator_prompt(&fix.steps)) {
        Ok(_) => FixOutcome::Applied { fix: fix.id, commands },
        // AppleScript's "User canceled." is error -128.
        Err(e) if e.contains("-128") || e.to_ascii_lowercase().contains("user canceled") => {
            FixOutcome::Cancelled { fix: fix.id, commands }
        }
        Err(error) => FixOutcome::Failed { fix: fix.id, error, commands },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_only_where_needed() {
        assert_eq!(shell_quote("en4"), "en4");
        assert_eq!(shell_quote("Thunderbolt Bridge"), "\"Thunderbolt Bridge\"");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "\"\"");
    }

    #[test]
    fn the_administrator_prompt_escapes_quotes_for_applescript() {
        let steps = [SystemCommand::new("networksetup", &["-setnetworkserviceenabled", "Thunderbolt Bridge", "off"])];
        assert_eq!(
            administrator_prompt(&steps),
            [
                "-e",
                r#"do shell script "networksetup -setnetworkserviceenabled \"Thunderbolt Bridge\" off" with administrator privileges"#
            ]
        );
    }
}
