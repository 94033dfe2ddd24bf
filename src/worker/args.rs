//! The command line of a worker process (`shoal worker …`, also understood by the app binary, whose
//! agent starts workers as copies of itself): the stage to run, and the secrets from the environment.

use crate::worker::process::{self, StageDevice, WorkerConfig, FRONT_TOKEN_ENV, SECRET_ENV};
use crate::worker::supervisor::TensorRank;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub model: PathBuf,
    /// FIRST-LAST, inclusive.
    #[arg(long, value_parser = parse_range)]
    pub layers: Range<usize>,
    #[arg(long)]
    pub stage: usize,
    #[arg(long)]
    pub stages: usize,
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    #[arg(long, default_value_t = 4)]
    pub sequences: usize,
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// The KV cache's element type: f16, q8_0 or q4_0.
    #[arg(long, default_value = "f16")]
    pub kv_type: crate::engine::KvType,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Address the data port listens on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub listen: IpAddr,
    /// The device to compute on (default: the best there is).
    #[arg(long)]
    pub device: Option<String>,
    /// Copy the weights into the device's memory even where it could use the mapped file.
    #[arg(long)]
    pub copy_weights: bool,
    /// On the CPU, compute on the weights as the file lays them out, in place (no repacked copies, none
    /// into huge pages).
    #[arg(long, conflicts_with = "copy_weights")]
    pub no_repack: bool,
    /// On Linux's CPU, compute on the weights that are not repacked in place in the mapped file (no copy
    /// into huge pages).
    #[arg(long, conflicts_with_all = ["copy_weights", "no_repack"])]
    pub no_huge_pages: bool,
    /// This worker's rank in a tensor-parallel group (with --tensor-shares).
    #[arg(long, requires = "tensor_shares")]
    pub tensor_rank: Option<usize>,
    /// Every rank's share of the model, in rank order (`1,1`).
    #[arg(long, value_delimiter = ',', requires = "tensor_rank")]
    pub tensor_shares: Vec<f64>,
    /// Where the rank's group runs in the ring when groups are chained as pipeline stages (its layers
    /// are then --layers): its stage, of --group-stages.
    #[arg(long, default_value_t = 0, requires = "tensor_rank")]
    pub group_stage: usize,
    #[arg(long, default_value_t = 1, requires = "tensor_rank")]
    pub group_stages: usize,
    /// Where the stage keeps saved prefixes on disk (the prompt cache's second tier).
    #[arg(long)]
    pub prompt_cache_dir: Option<PathBuf>,
    /// Tokens of saved prefixes the stage keeps in memory, as placement planned.
    #[arg(long)]
    pub saved_prefix_tokens: Option<usize>,
    /// Stage 0: whether requests draft tokens from their history (speculative decoding): auto, on, off.
    #[arg(long, default_value = "auto")]
    pub speculate: crate::engine::Speculation,
    /// Stage 0: most drafted tokens a request's step carries.
    #[arg(long, default_value_t = crate::engine::DEFAULT_DRAFT_TOKENS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=crate::engine::MAX_DRAFT_TOKENS as u64))]
    pub draft_tokens: usize,
}

fn parse_range(s: &str) -> Result<Range<usize>, String> {
    let (a, b) = s.split_once('-').ok_or("expected FIRST-LAST")?;
    let (a, b): (usize, usize) = (a.parse().map_err(|_| "bad FIRST")?, b.parse().map_err(|_| "bad LAST")?);
    if b < a {
        return Err("LAST is before FIRST".into());
    }
    Ok(a..b + 1)
}

/// The device and weight placement the arguments name (the inverse of [`StageDevice::args`]).
fn stage_device(args: &WorkerArgs) -> StageDevice {
    StageDevice {
        name: args.device.clone(),
        weights: crate::ggml::WeightPlacement::chosen(args.copy_weights, args.no_repack, args.no_huge_pages),
    }
}

pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let secret = std::env::var(SECRET_ENV)
        .ok()
        .and_then(|s| hex::decode(s).ok())
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            anyhow::anyhow!("shoal worker is started by `shoal node`, which passes it the cluster secret")
        })?;
    let front_token = std::env::var(FRONT_TOKEN_ENV).unwrap_or_default();
    let device = stage_device(&args);
    let config = WorkerConfig {
        model: args.model,
        layers: args.layers,
        stage: args.stage,
        stages: args.stages,
        context: args.context,
        sequences: args.sequences,
        batch: args.batch,
        kv_type: args.kv_type,
        threads: args.threads,
        listen: args.listen,
        device,
        tensor: args.tensor_rank.map(|rank| TensorRank {
            rank,
            shares: args.tensor_shares,
            ring_stage: args.group_stage,
            ring_stages: args.group_stages.max(1),
        }),
        prompt_cache_dir: args.prompt_cache_dir,
        saved_prefix_tokens: args.saved_prefix_tokens,
        speculation: args.speculate,
        draft_tokens: args.draft_tokens,
    };
    process::run(config, secret, front_token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::WeightPlacement;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    #[test]
    fn a_stage_device_survives_its_worker_arguments() {
        for weights in
            [WeightPlacement::Automatic, WeightPlacement::Copied, WeightPlacement::AsInFile, WeightPlacement::Mapped]
        {
            for name in [None, Some("Vulkan0".to_string())] {
                let device = StageDevice { name, weights };
                let mut line: Vec<String> =
                    ["shoal", "--model", "m.gguf", "--layers", "0-3", "--stage", "0", "--stages", "1"]
                        .map(String::from)
                        .into();
                line.extend(device.args());
                let parsed = Command::try_parse_from(&line).unwrap();
                assert_eq!(stage_device(&parsed.worker), device, "{line:?}");
            }
        }
    }
}
