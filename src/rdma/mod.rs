//! The RDMA doctor: every prerequisite of RDMA over Thunderbolt (macOS version, rdma_ctl, devices and
//! ports, Thunderbolt 5 links and cabling, the Thunderbolt Bridge, IPv4 on each Thunderbolt interface,
//! the peers' advertised rdma service), from the system tools' output — run live, or replayed from a
//! folder of captured outputs for support requests and tests. Parsers are pure functions
//! ([`parse`]); the checks turn their results into verdicts with reasons and fixes ([`checks`]). The
//! guided setup ([`wizard`]) walks a person through turning RDMA on and makes the fixes it can
//! ([`fixes`]).

pub mod checks;
pub mod cluster;
pub mod fixes;
pub mod parse;
pub mod wizard;
mod wizard_text;

pub use checks::{Check, NodeReport, ThunderboltLink, Verdict};
pub use cluster::{assess, Cable, ClusterRdma, NodeRdma};

use std::path::Path;

/// The outputs the doctor reads; `None` where a command was not run (its checks are unknown).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Captures {
    /// "macos", "linux", …
    pub platform: String,
    pub sw_vers: Option<String>,
    pub rdma_ctl_status: Option<String>,
    pub ibv_devices: Option<String>,
    pub ibv_devinfo: Option<String>,
    pub thunderbolt: Option<String>,
    pub hardware_ports: Option<String>,
    pub ifconfig: Option<String>,
}

/// The replay folder's file of each command.
pub const FILES: [&str; 7] = [
    "sw_vers.txt",
    "rdma_ctl_status.txt",
    "ibv_devices.txt",
    "ibv_devinfo.txt",
    "system_profiler_SPThunderboltDataType.txt",
    "networksetup_listallhardwareports.txt",
    "ifconfig.txt",
];

impl Captures {
    /// Outputs captured on a Mac, one file per command (see [`FILES`]); missing files are not run.
    pub fn replay(dir: &Path) -> std::io::Result<Captures> {
        if !dir.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not a folder", dir.display()),
            ));
        }
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        Ok(Captures {
            platform: "macos".into(),
            sw_vers: read(FILES[0]),
            rdma_ctl_status: read(FILES[1]),
            ibv_devices: read(FILES[2]),
            ibv_devinfo: read(FILES[3]).or_else(|| read("ibv_devinfo.stderr.txt")),
            thunderbolt: read(FILES[4]),
            hardware_ports: read(FILES[5]),
            ifconfig: read(FILES[6]),
        })
    }

    /// Runs the tools on this machine (the macOS ones only on macOS). Output and error text are both kept:
    /// the tools report "no devices" on stderr.
    pub fn live() -> Captures {
        let run = |program: &str, args: &[&str]| -> Option<String> {
            let out = std::process::Command::new(program).args(args).output().ok()?;
            Some(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        };
        let platform = std::env::consts::OS.to_string();
        let mut c =
            Captures { platform: if platform == "macos" { "macos".into() } else { platform }, ..Default::default() };
        if c.platform == "macos" {
            c.sw_vers = run("sw_vers", &[]);
            c.rdma_ctl_status = run("rdma_ctl", &["status"]);
            c.thunderbolt = run("system_profiler", &["SPThunderboltDataType"]);
            c.hardware_ports = run("networksetup", &["-listallhardwareports"]);
            c.ifconfig = run("ifconfig", &[]);
        }
        // Off macOS, with the rdma feature, the verbs library itself says which devices there are.
        let from_shim = if c.platform == "macos" { None } else { crate::transport::rdma::device_list_text() };
        c.ibv_devices = from_shim.or_else(|| run("ibv_devices", &[])).or_else(|| Some(linux_device_list()));
        c.ibv_devinfo = run("ibv_devinfo", &[]);
        c
    }
}

/// Without rdma-core's tools: the kernel's RDMA devices from sysfs, in `ibv_devices`' layout.
fn linux_device_list() -> String {
    let names: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let mut text = String::from("    device          \t   node GUID\n    ------          \t----------------\n");
    for n in names {
        text += &format!("    {n:<16}\t0000000000000000\n");
    }
    text
}

/// The doctor's report for this machine.
pub fn doctor(captures: &Captures) -> NodeReport {
    checks::run(captures)
}

/// A report as people read it.
pub fn render(report: &NodeReport) -> String {
    let mut out = String::new();
    for c in &report.checks {
        let mark = match c.verdict {
            Verdict::Pass => "✓",
            Verdict::Fail => "✗",
            Verdict::Unknown => "?",
        };
        out += &format!("{mark} {:<44} {}\n", c.title, c.reason);
        if c.verdict != Verdict::Pass && !c.fix.is_empty() {
            out += &format!("  {:<44} fix: {}\n", "", c.fix);
        }
    }
    out += &if report.usable_interfaces.is_empty() {
        "\nRDMA is not usable on this node: shoal uses TCP for its links.\n".to_string()
    } else {
        format!("\nRDMA is ready on {}.\n", report.usable_interfaces.join(", "))
    };
    out
}
