//! `shoal ps` lists the model instances the cluster runs (name, state, stages and their nodes) and
//! `shoal stop NAME|ID` stops one, through the node's instance API (`GET`/`DELETE /api/instances`).

use super::client::NodeAddress;
use shoal::instances::{InstanceInfo, InstanceState};

#[derive(clap::Args)]
pub struct PsArgs {
    #[command(flatten)]
    node: NodeAddress,
    /// Also list the instances that ended (stopped, failed, or replaced after a loss).
    #[arg(long, short)]
    all: bool,
    /// Print the JSON of GET /api/instances.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct StopArgs {
    /// The model's name (as `shoal ps` and /v1/models show it) or the instance's id (or its start).
    target: String,
    #[command(flatten)]
    node: NodeAddress,
}

pub fn ps(args: PsArgs) -> anyhow::Result<()> {
    if args.json {
        println!("{}", args.node.get_text("/api/instances")?);
        return Ok(());
    }
    let instances: Vec<InstanceInfo> = args.node.get("/api/instances")?;
    print!("{}", render(&instances, args.all));
    Ok(())
}

/// A table of the instances (the active ones, or all), newest first, with what went wrong for each
/// that is not serving.
pub fn render(instances: &[InstanceInfo], all: bool) -> String {
    let mut shown: Vec<&InstanceInfo> = instances.iter().filter(|i| all || i.state.is_active()).collect();
    if shown.is_empty() {
        let ended = instances.len();
        return match ended {
            0 => "no model runs: launch one with `shoal run MODEL.gguf`\n".into(),
            n => format!("no model runs ({n} ended instance(s): `shoal ps --all` lists them)\n"),
        };
    }
    shown.sort_by_key(|i| std::cmp::Reverse(i.created_at_ms));
    let mut out = format!(
        "{:<10} {:<32} {:<11} {:>7}  {}\n",
        "ID", "MODEL", "STATE", "CONTEXT", "STAGES (node layers state device)"
    );
    for i in shown {
        let stages = i
            .stages
            .iter()
            .map(|s| {
                let state = format!("{:?}", s.state).to_lowercase();
                let device = s.device.as_deref().map(|d| format!(" {d}")).unwrap_or_default();
                format!("{} {}-{} {state}{device}", s.node_name, s.layers.start, s.layers.end.saturating_sub(1))
            })
            .collect::<Vec<_>>()
            .join(" · ");
        out += &format!("{:<10} {:<32} {:<11} {:>7}  {stages}\n", i.id, i.model, state_word(i.state), i.context);
        if let Some(error) = i.error.as_ref().filter(|_| i.state != InstanceState::Ready) {
            out += &format!("{:<10} ! {error}\n", "");
        }
        if let (InstanceState::Replaced, Some(next)) = (i.state, &i.replaced_by) {
            out += &format!("{:<10} placed again as instance {next}\n", "");
        }
        if let Some(line) = prompt_cache_line(i) {
            out += &format!("{:<10} {line}\n", "");
        }
        if let Some(line) = speculation_line(i) {
            out += &format!("{:<10} {line}\n", "");
        }
    }
    out
}

/// What the prompt cache gave back and keeps, as stage 0 counts it (none before a request finished).
fn prompt_cache_line(i: &InstanceInfo) -> Option<String> {
    let stats = i.stages.first()?.stats.as_ref().filter(|s| s.prompt_tokens > 0)?;
    Some(format!(
        "prompt cache: {:.0}% of {} prompt tokens given back; {} tokens saved in memory (room for {}), {} on disk",
        100.0 * stats.cached_tokens as f64 / stats.prompt_tokens as f64,
        stats.prompt_tokens,
        stats.saved_prefix_positions,
        i.plan.saved_prefix_tokens,
        stats.saved_prefix_positions_on_disk
    ))
}

/// What speculative decoding kept of its drafts, as stage 0 counts it (none before a request drafted),
/// and the decode rate it gave against none, from the cost of a drafted row stage 0 measured.
fn speculation_line(i: &InstanceInfo) -> Option<String> {
    let stats = i.stages.first()?.stats.as_ref().filter(|s| s.drafted_tokens > 0)?;
    let generated = stats.generated_tokens.max(1) as f64;
    let mut line = format!(
        "speculation: {:.0}% of {} drafted tokens kept; {:.0}% of the generated tokens came from drafts",
        100.0 * stats.accepted_tokens as f64 / stats.drafted_tokens as f64,
        stats.drafted_tokens,
        100.0 * stats.accepted_tokens as f64 / generated,
    );
    if let Some(cost) = stats.draft_row_cost {
        let speedup =
            shoal::engine::estimated_speedup(stats.generated_tokens, stats.drafted_tokens, stats.accepted_tokens, cost);
        line += &format!("; about {speedup:.2}x the decode rate without (a drafted row costs {cost:.2} of a step)");
    }
    Some(line)
}

fn state_word(state: InstanceState) -> String {
    format!("{state:?}").to_lowercase()
}

pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let instances: Vec<InstanceInfo> = args.node.get("/api/instances")?;
    let targets = matching(&instances, &args.target)?;
    for id in targets {
        let stopped: InstanceInfo = args.node.delete(&format!("/api/instances/{id}"))?;
        println!("stopped instance {} (`{}`)", stopped.id, stopped.model);
    }
    Ok(())
}

/// The active instances `target` names: by model name, by id, or by the start of an id (when only one
/// has it).
pub fn matching(instances: &[InstanceInfo], target: &str) -> anyhow::Result<Vec<String>> {
    let active = || instances.iter().filter(|i| i.state.is_active());
    let by_name: Vec<String> = active().filter(|i| i.model == target).map(|i| i.id.clone()).collect();
    if !by_name.is_empty() {
        return Ok(by_name);
    }
    if let Some(i) = instances.iter().find(|i| i.id == target) {
        if !i.state.is_active() {
            anyhow::bail!("instance {} (`{}`) has already ended ({})", i.id, i.model, state_word(i.state));
        }
        return Ok(vec![i.id.clone()]);
    }
    let by_prefix: Vec<&InstanceInfo> = active().filter(|i| i.id.starts_with(target)).collect();
    match by_prefix.as_slice() {
        [one] => Ok(vec![one.id.clone()]),
        [] => {
            let names: Vec<String> = active().map(|i| format!("{} ({})", i.model, i.id)).collect();
            if names.is_empty() {
                anyhow::bail!("nothing named {target:?} runs: no model runs at all")
            }
            anyhow::bail!("nothing named {target:?} runs; running: {}", names.join(", "))
        }
        _ => anyhow::bail!("{target:?} starts the id of several instances: give more of it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal::worker::StageStats;

    #[test]
    fn the_prompt_cache_line_says_what_was_given_back_and_what_is_kept() {
        let mut info =
            serde_json::from_str::<Vec<InstanceInfo>>(include_str!("../../ui/tests/fixtures/instances.json"))
                .unwrap()
                .remove(0);
        info.plan.saved_prefix_tokens = 8192;
        info.stages[0].stats = None;
        assert_eq!(prompt_cache_line(&info), None, "no request yet");
        let stats = StageStats {
            prompt_tokens: 4000,
            cached_tokens: 3000,
            saved_prefix_positions: 1700,
            saved_prefix_positions_on_disk: 5100,
            ..Default::default()
        };
        info.stages[0].stats = Some(stats);
        assert_eq!(
            prompt_cache_line(&info).unwrap(),
            "prompt cache: 75% of 4000 prompt tokens given back; 1700 tokens saved in memory (room for 8192), 5100 on disk"
        );
        assert!(render(&[info.clone()], true).contains("prompt cache: 75%"));
        assert_eq!(speculation_line(&info), None, "nothing drafted yet");
        let stats = info.stages[0].stats.as_mut().unwrap();
        (stats.drafted_tokens, stats.accepted_tokens, stats.generated_tokens) = (400, 300, 600);
        assert_eq!(
            speculation_line(&info).unwrap(),
            "speculation: 75% of 400 drafted tokens kept; 50% of the generated tokens came from drafts"
        );
        info.stages[0].stats.as_mut().unwrap().draft_row_cost = Some(0.25);
        assert!(speculation_line(&info)
            .unwrap()
            .ends_with("; about 1.50x the decode rate without (a drafted row costs 0.25 of a step)"));
    }
}
