//! `shoal status`: the cluster as a node sees it — members, memory pool, links, nearby clusters, and the
//! model instances that run — as tables, or with `--json` exactly the JSON of `GET /api/cluster`.

use super::client::NodeAddress;
use shoal::cluster::{ClusterSnapshot, LinkView};
use shoal::instances::InstanceInfo;
use std::collections::HashMap;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    node: NodeAddress,
    /// Print the JSON of GET /api/cluster.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let text = args.node.get_text("/api/cluster")?;
    if args.json {
        println!("{text}");
        return Ok(());
    }
    let snapshot: ClusterSnapshot = serde_json::from_str(&text)?;
    print!("{}", render(&snapshot));
    let instances: Vec<InstanceInfo> = args.node.get("/api/instances")?;
    print!("\n{}", super::ps::render(&instances, false));
    Ok(())
}

/// A size in decimal units, as the dashboard and macOS show it ("24 GB", "512 MB").
pub fn size(bytes: u64) -> String {
    shoal::util::format_bytes(bytes)
}

pub fn rate(bps: Option<u64>) -> String {
    match bps {
        None => "-".into(),
        Some(b) if b >= 1_000_000_000 => format!("{:.1} Gbit/s", b as f64 / 1e9),
        Some(b) => format!("{:.0} Mbit/s", b as f64 / 1e6),
    }
}

pub fn micros(us: Option<u64>) -> String {
    us.map_or("-".into(), |u| format!("{:.2} ms", u as f64 / 1000.0))
}

pub fn render(s: &ClusterSnapshot) -> String {
    let mut out = String::new();
    let names: HashMap<_, _> = s.nodes.iter().map(|n| (n.id, n.name.clone())).collect();
    out += &format!(
        "cluster {} · {} node(s), {} up · pool {} ({} available)\n\n",
        s.cluster_id,
        s.nodes.len(),
        s.pool.nodes_up,
        size(s.pool.memory_total),
        size(s.pool.memory_available)
    );
    out += &format!(
        "{:<20} {:<9} {:<10} {:<22} {:<10} {:<28} {:<5}\n",
        "NODE", "ID", "STATUS", "MEMORY avail/total", "SHOAL", "CPU", "LOAD"
    );
    let mut nodes: Vec<_> = s.nodes.iter().collect();
    nodes.sort_by_key(|n| (!n.is_self, n.name.clone()));
    for n in nodes {
        let (mem, shoal, cpu, load) = match &n.telemetry {
            Some(t) => (
                format!("{} / {}", size(t.memory_available), size(t.memory_total)),
                size(t.memory_used_by_shoal),
                format!(
                    "{} ({} cores)",
                    t.chip.clone().unwrap_or_else(|| t.cpu_model.chars().take(18).collect()),
                    t.cpu_cores
                ),
                format!("{:.2}", t.load_1m),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let name = if n.is_self { format!("{} *", n.name) } else { n.name.clone() };
        out += &format!(
            "{:<20} {:<9} {:<10} {:<22} {:<10} {:<28} {:<5}\n",
            name,
            n.id.short(),
            n.status,
            mem,
            shoal,
            cpu,
            load
        );
    }
    if !s.links.is_empty() {
        out += "\n";
        out += &links_table(&s.links, &names);
    }
    for c in &s.nearby {
        out += &format!("\nnearby cluster {}:", c.cluster_id);
        for n in &c.nodes {
            let addr = n.control.first().map(|a| a.to_string()).unwrap_or_default();
            out += &format!(" {} ({addr})", n.name);
        }
        out += "\n";
    }
    out
}

pub fn links_table(links: &[LinkView], names: &HashMap<shoal::node::NodeId, String>) -> String {
    let name = |id| names.get(&id).cloned().unwrap_or_else(|| id.short());
    // ECHO: the round trip of small frames between waiting threads, as a model's traffic sees it (the
    // agent's RTT adds its runtime's wake-ups).
    let mut out = format!(
        "{:<36} {:<12} {:<20} {:<10} {:<28} {:<6}\n",
        "LINK", "KIND", "RTT p50 / p99", "ECHO", "THROUGHPUT → / ←", "ERRORS"
    );
    for l in links {
        out += &format!(
            "{:<36} {:<12} {:<20} {:<10} {:<28} {:<6}\n",
            format!("{} ↔ {}", name(l.a), name(l.b)),
            format!("{:?}", l.kind).to_lowercase(),
            format!("{} / {}", micros(l.rtt_p50_us), micros(l.rtt_p99_us)),
            micros(l.echo_rtt_us),
            format!("{} / {}", rate(l.throughput_a_to_b_bps), rate(l.throughput_b_to_a_bps)),
            l.errors
        );
    }
    out
}
