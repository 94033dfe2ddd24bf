//! `shoal leave`: the node leaves its cluster and starts a one-node cluster of its own.

use super::client::NodeAddress;
use shoal::cluster::ClusterSnapshot;

#[derive(clap::Args)]
pub struct LeaveArgs {
    #[command(flatten)]
    node: NodeAddress,
}

pub fn run(args: LeaveArgs) -> anyhow::Result<()> {
    let snapshot: ClusterSnapshot = args.node.post("/api/cluster/leave", serde_json::json!({}))?;
    println!("left; the node is now alone in cluster {}", snapshot.cluster_id);
    Ok(())
}
