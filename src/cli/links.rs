//! `shoal links`: every link's kind, round-trip times and throughput; `--measure` runs new bulk
//! transfers on every link first and waits for them.

use super::client::NodeAddress;
use super::status::links_table;
use shoal::cluster::ClusterSnapshot;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct LinksArgs {
    #[command(flatten)]
    node: NodeAddress,
    /// Measure every link's throughput now (a bulk transfer each way).
    #[arg(long)]
    measure: bool,
    #[arg(long)]
    json: bool,
}

#[derive(serde::Deserialize)]
struct Started {
    started_at_ms: u64,
}

pub fn run(args: LinksArgs) -> anyhow::Result<()> {
    if args.measure {
        let started: Started = args.node.post("/api/links/measure", serde_json::json!({}))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s: ClusterSnapshot = args.node.get("/api/cluster")?;
            let fresh =
                |r: &shoal::links::LinkReport| r.throughput_measured_at_ms.is_some_and(|t| t >= started.started_at_ms);
            let done = s.links.iter().all(|l| l.reports.len() == 2 && l.reports.iter().all(fresh));
            if done || Instant::now() > deadline {
                if !done {
                    eprintln!("some links were not measured within a minute; showing what is known");
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let s: ClusterSnapshot = args.node.get("/api/cluster")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s.links)?);
    } else if s.links.is_empty() {
        println!("no links: this node is alone in its cluster");
    } else {
        let names: HashMap<_, _> = s.nodes.iter().map(|n| (n.id, n.name.clone())).collect();
        print!("{}", links_table(&s.links, &names));
    }
    Ok(())
}
