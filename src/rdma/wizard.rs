//! The guided RDMA setup: a state machine over the steps a non-expert follows to turn on RDMA over
//! Thunderbolt — why, the prerequisites (the doctor), what will happen, the Recovery-mode steps, waiting
//! for the restart, and verification (the doctor again, with a clear result). Its state lives in
//! `rdma-wizard.json` in the node's data directory, so after the restart the wizard resumes at
//! verification: the restart is detected by the boot time changing ([`boot_time`]; callers pass it in,
//! so tests can simulate a restart).

use super::checks::{Check, NodeReport, Verdict};
use super::fixes::{self, CommandRunner, Fix, FixId, FixOutcome};
use crate::node::DataDir;
use serde::{Deserialize, Serialize};

/// The wizard's file in the data directory.
pub const STATE_FILE: &str = "rdma-wizard.json";

/// Boot times of one boot read at different moments can differ by a second (Linux computes btime from
/// the uptime); a restart moves it by far more.
const BOOT_TIME_SLACK_SECS: u64 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "WizardStepId")]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Why,
    Prerequisites,
    WhatHappens,
    Recovery,
    WaitingForReboot,
    Verify,
}

const ORDER: [Step; 6] =
    [Step::Why, Step::Prerequisites, Step::WhatHappens, Step::Recovery, Step::WaitingForReboot, Step::Verify];

impl Step {
    fn index(self) -> usize {
        ORDER.iter().position(|s| *s == self).expect("every step is in ORDER")
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct WizardState {
    pub started: bool,
    pub step: Step,
    /// The boot time (seconds since the epoch) when the wizard began waiting for the restart.
    #[serde(default)]
    pub boot_time_at_wait: Option<u64>,
    /// The restart was seen: the boot time changed while waiting.
    #[serde(default)]
    pub rebooted: bool,
    /// The fixes made or attempted, latest last.
    #[serde(default)]
    pub fixes: Vec<FixOutcome>,
    pub updated_at_ms: u64,
}

impl Default for WizardState {
    fn default() -> Self {
        WizardState {
            started: false,
            step: Step::Why,
            boot_time_at_wait: None,
            rebooted: false,
            fixes: Vec::new(),
            updated_at_ms: 0,
        }
    }
}

/// What the user asked for (`POST /api/rdma/wizard`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "WizardAction")]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    Start,
    Next,
    Back,
    Reset,
    ApplyFix { fix: FixId },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WizardError {
    #[error("the setup has not started: send {{\"action\": \"start\"}} first")]
    NotStarted,
    #[error(
        "the doctor does not call for the fix {0:?} on this node (it is already fine, or there is nothing to fix)"
    )]
    FixNotOffered(FixId),
    #[error("cannot save the setup's progress in {path}: {error}")]
    Save { path: String, error: String },
}

/// The wizard over its state file.
pub struct Wizard {
    dir: DataDir,
    state: WizardState,
}

impl Wizard {
    /// The wizard as saved in `dir` (a fresh one when there is none, or it is unreadable). If it was
    /// waiting for the restart and `boot_time` shows one happened, it moves on to verification.
    pub fn load(dir: &DataDir, boot_time: Option<u64>) -> Wizard {
        let path = dir.file(STATE_FILE);
        let state = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!("{} is damaged ({e}); the RDMA setup starts over", path.display());
                WizardState::default()
            }),
            Err(_) => WizardState::default(),
        };
        let mut wizard = Wizard { dir: dir.clone(), state };
        if wizard.state.step == Step::WaitingForReboot && restarted(wizard.state.boot_time_at_wait, boot_time) {
            wizard.state.step = Step::Verify;
            wizard.state.rebooted = true;
            if let Err(e) = wizard.save() {
                tracing::warn!("{e}");
            }
        }
        wizard
    }

    pub fn state(&self) -> &WizardState {
        &self.state
    }

    /// Carries out `action` with the doctor's current `report` and saves the result. A fix runs through
    /// `runner`; its outcome is returned and kept in the state.
    pub fn act(
        &mut self,
        action: &Action,
        report: &NodeReport,
        runner: &dyn CommandRunner,
        boot_time: Option<u64>,
    ) -> Result<Option<FixOutcome>, WizardError> {
        let mut outcome = None;
        match action {
            Action::Start => {
                self.state = WizardState { started: true, ..WizardState::default() };
            }
            Action::Reset => {
                self.state = WizardState::default();
                return match std::fs::remove_file(self.dir.file(STATE_FILE)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(self.save_error(e)),
                    _ => Ok(None),
                };
            }
            Action::Next | Action::Back if !self.state.started => return Err(WizardError::NotStarted),
            Action::Next => self.next(report, boot_time),
            Action::Back => self.back(),
            Action::ApplyFix { fix } => {
                let Some(found) = fixes::available(report).into_iter().find(|f| f.id == *fix) else {
                    return Err(WizardError::FixNotOffered(*fix));
                };
                let result = fixes::apply(&found, runner);
                self.state.fixes.push(result.clone());
                outcome = Some(result);
            }
        }
        self.save()?;
        Ok(outcome)
    }

    fn next(&mut self, report: &NodeReport, boot_time: Option<u64>) {
        self.state.step = match self.state.step {
            // RDMA already on: nothing to do in Recovery, go straight to verification.
            Step::Prerequisites if rdma_enabled(report) == Some(true) => Step::Verify,
            Step::Recovery => {
                self.state.boot_time_at_wait = boot_time;
                self.state.rebooted = false;
                Step::WaitingForReboot
            }
            Step::Verify => Step::Verify,
            other => ORDER[other.index() + 1],
        };
    }

    fn back(&mut self) {
        self.state.step = match self.state.step {
            Step::Why => Step::Why,
            // Back from verification means doing the Recovery steps again (the restart to wait for is
            // then a new one).
            Step::Verify => Step::Recovery,
            other => ORDER[other.index() - 1],
        };
    }

    fn save(&mut self) -> Result<(), WizardError> {
        self.state.updated_at_ms = crate::util::now_ms();
        let bytes = serde_json::to_vec_pretty(&self.state).expect("the wizard state serialises");
        self.dir.write(STATE_FILE, &bytes, false).map_err(|e| self.save_error(e))
    }

    fn save_error(&self, error: std::io::Error) -> WizardError {
        WizardError::Save { path: self.dir.file(STATE_FILE).display().to_string(), error: error.to_string() }
    }

    /// Everything the Setup view shows, with the doctor's current `report`.
    pub fn view(&self, report: &NodeReport) -> WizardView {
        let current = self.state.step.index();
        let steps = ORDER
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let (title, body) = super::wizard_text::step_text(*step);
                let status = match i.cmp(&current) {
                    std::cmp::Ordering::Less => StepStatus::Done,
                    std::cmp::Ordering::Equal => StepStatus::Current,
                    std::cmp::Ordering::Greater => StepStatus::Upcoming,
                };
                let commands = match step {
                    Step::Recovery => vec![super::wizard_text::ENABLE_COMMAND.to_string()],
                    _ => Vec::new(),
                };
                StepView { id: *step, title: title.into(), body, commands, status }
            })
            .collect();
        WizardView {
            state: self.state.clone(),
            steps,
            doctor: DoctorSummary::of(report),
            fixes: fixes::available(report),
            verification: (self.state.step == Step::Verify).then(|| verify(report)),
        }
    }
}

/// Whether the boot time moved on from `before` to `now`: the machine restarted in between.
pub fn restarted(before: Option<u64>, now: Option<u64>) -> bool {
    matches!((before, now), (Some(b), Some(n)) if n > b + BOOT_TIME_SLACK_SECS)
}

fn rdma_enabled(report: &NodeReport) -> Option<bool> {
    match report.check("rdma_ctl")?.verdict {
        Verdict::Pass => Some(true),
        Verdict::Fail => Some(false),
        Verdict::Unknown => None,
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "WizardStep")]
pub struct StepView {
    pub id: Step,
    pub title: String,
    pub body: Vec<String>,
    /// Commands the step asks the user to type (shown for copying).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    pub status: StepStatus,
}

/// Where the user is relative to a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Done,
    Current,
    Upcoming,
}

/// The doctor's findings in brief, for the wizard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct DoctorSummary {
    pub platform: String,
    pub rdma_enabled: Option<bool>,
    pub usable_interfaces: Vec<String>,
    pub passed: usize,
    pub failed: usize,
    pub unknown: usize,
    pub checks: Vec<Check>,
}

impl DoctorSummary {
    pub fn of(report: &NodeReport) -> DoctorSummary {
        let count = |v: Verdict| report.checks.iter().filter(|c| c.verdict == v).count();
        DoctorSummary {
            platform: report.platform.clone(),
            rdma_enabled: rdma_enabled(report),
            usable_interfaces: report.usable_interfaces.clone(),
            passed: count(Verdict::Pass),
            failed: count(Verdict::Fail),
            unknown: count(Verdict::Unknown),
            checks: report.checks.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum VerifyResult {
    /// RDMA is on and every check passes: the links can use it.
    EnabledAndHealthy,
    /// `rdma_ctl status` still says disabled: the Recovery step did not take.
    StillDisabled,
    /// RDMA is on, but other prerequisites fail (each with its fix).
    OtherFailures,
    /// This node is not a Mac: RDMA over Thunderbolt is a macOS feature.
    NotAMac,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Verification {
    pub result: VerifyResult,
    pub message: String,
    /// The checks that fail (or cannot be told), with their fixes.
    pub failures: Vec<Check>,
}

/// The verdict of the verification step on the doctor's `report`.
pub fn verify(report: &NodeReport) -> Verification {
    let not_passing: Vec<Check> = report.checks.iter().filter(|c| c.verdict != Verdict::Pass).cloned().collect();
    let failing = not_passing.iter().filter(|c| c.verdict == Verdict::Fail).count();
    let (result, message) = if report.platform != "macos" {
        (
            VerifyResult::NotAMac,
            format!(
                "This node runs {}: RDMA over Thunderbolt needs macOS 26.2 or later. Its links use TCP.",
                report.platform
            ),
        )
    } else if rdma_enabled(report) == Some(false) {
        (
            VerifyResult::StillDisabled,
            "RDMA is still disabled. `rdma_ctl enable` only works in the Terminal of macOS Recovery: go back to \
             the Recovery steps, follow them once more, and make sure Terminal printed no error."
                .to_string(),
        )
    } else if failing == 0 && !report.usable_interfaces.is_empty() {
        (
            VerifyResult::EnabledAndHealthy,
            format!(
                "RDMA is enabled and healthy on {}. shoal uses it for links to Macs on those cables.",
                report.usable_interfaces.join(", ")
            ),
        )
    } else {
        (
            VerifyResult::OtherFailures,
            format!(
                "{}, but {} not yet ready: fix what is listed below (shoal can make some fixes itself), then check again.",
                if rdma_enabled(report) == Some(true) { "RDMA is enabled" } else { "RDMA may be enabled" },
                if not_passing.len() == 1 { "one thing is" } else { "some things are" }
            ),
        )
    };
    Verification { result, message, failures: not_passing }
}

/// Everything `GET /api/rdma/wizard` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct WizardView {
    pub state: WizardState,
    pub steps: Vec<StepView>,
    pub doctor: DoctorSummary,
    pub fixes: Vec<Fix>,
    /// Present at the verification step.
    pub verification: Option<Verification>,
}

/// This machine's boot time in seconds since the epoch: `kern.boottime` on macOS (read from the kernel,
/// no process spawned), `btime` of `/proc/stat` on Linux.
pub fn boot_time() -> Option<u64> {
    if cfg!(target_os = "macos") {
        crate::os::seconds_from_timeval(&crate::os::sysctl_bytes("kern.boottime")?)
    } else {
        parse_proc_stat_btime(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// `/proc/stat`: the `btime SECONDS` line.
pub fn parse_proc_stat_btime(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_times_are_read_from_both_systems() {
        let stat = "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1795989325\nprocesses 12\n";
        assert_eq!(parse_proc_stat_btime(stat), Some(1795989325));
        assert_eq!(parse_proc_stat_btime("cpu 1\n"), None);
        assert!(boot_time().is_some(), "this machine's boot time");
    }

    #[test]
    fn only_a_real_move_of_the_boot_time_is_a_restart() {
        assert!(!restarted(Some(1000), Some(1001)), "btime jitter");
        assert!(restarted(Some(1000), Some(1600)));
        assert!(!restarted(None, Some(1600)));
        assert!(!restarted(Some(1000), None));
    }
}
