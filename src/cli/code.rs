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
    #[serde(default)]
    mdns: bool,
    #[serde(default)]
    join_addresses: Vec<std::net::SocketAddr>,
}

pub fn run(args: CodeArgs) -> anyhow::Result<()> {
    let code: Code = args.node.post("/api/cluster/code", serde_json::json!({}))?;
    println!("{}", code.code);
    eprintln!("{}", how_to_join(&code));
    Ok(())
}

/// How the new machine uses the code: by the code alone when this node is found by mDNS, and with one
/// of this node's addresses (`CODE@HOST:PORT`) where multicast does not reach or mDNS is off.
fn how_to_join(code: &Code) -> String {
    let minutes = code.expires_in_seconds / 60;
    let with_address = |a: &std::net::SocketAddr| format!("shoal node --join {}@{a}", code.code);
    let addresses = match code.join_addresses.as_slice() {
        [] => format!("shoal node --join {}@HOST:PORT (this node's address and control port)", code.code),
        [one] => with_address(one),
        [first, rest @ ..] => format!(
            "{}  (or @{})",
            with_address(first),
            rest.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", @")
        ),
    };
    if code.mdns {
        format!(
            "Valid for {minutes} minutes. On the new machine run:  shoal node --join {}\nWhere multicast is blocked:  {addresses}",
            code.code
        )
    } else {
        format!("Valid for {minutes} minutes. mDNS is off on this node, so give its address; on the new machine run:  {addresses}")
    }
}
