//! The words of each step of the RDMA setup wizard, in plain language for someone who has never booted
//! into macOS Recovery. Figures are the measured ones of shared/research/rdma.md.

use super::wizard::Step;

/// The command that turns RDMA on, in the Terminal of macOS Recovery.
pub const ENABLE_COMMAND: &str = "rdma_ctl enable";

/// The Recovery steps for Macs with Apple silicon, one action each.
pub const RECOVERY_STEPS: [&str; 7] = [
    "Save your work and choose Apple menu › Shut Down. Wait until the Mac is fully off.",
    "Press and hold the power button. Keep holding it until \"Loading startup options\" appears, then let go.",
    "Click Options, then click Continue. Sign in with an administrator account if asked.",
    "In the menu bar, choose Utilities › Terminal.",
    "Type `rdma_ctl enable` and press Return. It should print no error.",
    "Choose Apple menu › Restart.",
    "After the restart, open shoal again: this setup continues by itself and checks the result.",
];

/// The title and paragraphs of `step`.
pub fn step_text(step: Step) -> (&'static str, Vec<String>) {
    let lines = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    match step {
        Step::Why => (
            "Why turn on RDMA",
            lines(&[
                "RDMA lets Macs cabled with Thunderbolt 5 pass data to each other's memory directly, without the \
                 network stack: a message takes about 5 microseconds instead of about 300 over TCP.",
                "A model split across Macs sends data between them for every token, so lower latency means more \
                 tokens per second: clusters using RDMA have reported two to four times the decode rate of the \
                 same cables over TCP.",
                "It is a one-time setup per Mac. shoal keeps using TCP on any link where RDMA is not available, \
                 so nothing breaks while you set it up.",
            ]),
        ),
        Step::Prerequisites => (
            "Check the prerequisites",
            lines(&[
                "shoal checked this Mac: macOS 26.2 or later, Thunderbolt 5 cables to the other Macs, the \
                 Thunderbolt Bridge, an IPv4 address on each Thunderbolt port, and whether RDMA is already on.",
                "Fix what fails before going on; shoal can make some fixes itself. If RDMA is already enabled, \
                 Next goes straight to the final check.",
            ]),
        ),
        Step::WhatHappens => (
            "What will happen",
            lines(&[
                "RDMA can only be turned on from macOS Recovery, a special startup mode; Apple does not allow it \
                 from a running Mac, even for an administrator.",
                "You will shut this Mac down, start it into Recovery, type one command in Terminal, and restart. \
                 It takes about five minutes. Nothing on the Mac is erased or changed besides this setting.",
                "Do this on every Mac of the cluster: a Thunderbolt port is ready only when the Macs at both ends \
                 have RDMA on. Keep this page's steps on your phone or another screen while this Mac is off.",
            ]),
        ),
        Step::Recovery => ("Turn RDMA on in macOS Recovery", lines(&RECOVERY_STEPS)),
        Step::WaitingForReboot => (
            "Waiting for the restart",
            lines(&[
                "Follow the Recovery steps now. shoal notices the restart by itself and continues with the final \
                 check when you open it again.",
                "Already restarted? Choose Next to check now.",
            ]),
        ),
        Step::Verify => (
            "Check the result",
            lines(&["shoal ran its checks again. The result below says whether RDMA is enabled and healthy, still \
                 disabled, or enabled with something else left to fix."]),
        ),
    }
}
