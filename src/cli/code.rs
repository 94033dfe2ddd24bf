//! `shoal code`: makes a join code on a node, for a new machine to join its cluster.

use super::client::NodeAddress;

#[derive(clap::Args)]
pub struct CodeArgs {
    #[command(flatten)]
    node: NodeAddress,
}

#[derive(serde::Deserialize)]
struct Code {
    code: String,
    expires_in_seconds: u64,
}

pub fn run(args: CodeArgs) -> anyhow::Result<()> {
    let code: Code = args.node.post("/api/cluster/code", serde_json::json!({}))?;
    println!("{}", code.code);
    eprintln!(
        "Valid for {} minutes. On the new machine run:  shoal node --join {}",
        code.expires_in_seconds / 60,
        code.code
    );
    Ok(())
}
