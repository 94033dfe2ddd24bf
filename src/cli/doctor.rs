//! `shoal doctor`: whether this node can use RDMA over Thunderbolt, every prerequisite with a verdict,
//! a reason and a fix; `--replay DIR` checks captured outputs instead of running the tools.

use shoal::rdma::{self, Captures};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Check the outputs captured in DIR (sw_vers.txt, rdma_ctl_status.txt, ibv_devices.txt,
    /// ibv_devinfo.txt, system_profiler_SPThunderboltDataType.txt, networksetup_listallhardwareports.txt,
    /// ifconfig.txt) instead of running the tools.
    #[arg(long)]
    replay: Option<PathBuf>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let captures = match &args.replay {
        Some(dir) => Captures::replay(dir).map_err(|e| anyhow::anyhow!("cannot replay {}: {e}", dir.display()))?,
        None => Captures::live(),
    };
    let report = rdma::doctor(&captures);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", rdma::render(&report));
    }
    Ok(())
}
