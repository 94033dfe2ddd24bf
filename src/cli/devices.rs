//! `shoal devices`: the devices this build of shoal can compute on (the CPU; a GPU where ggml was built
//! with one), their memory, and which one a stage takes by default; and the `--device`,
//! `--copy-weights`, `--no-repack`, `--no-huge-pages` and `--kv-type` flags of the commands that run a
//! model here.

use shoal::engine::StageOptions;
use shoal::ggml::{Device, WeightPlacement};
use shoal::util::format_bytes;

#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Where and how a model runs on this machine.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// The device to run on, as `shoal devices` names it (default: the first GPU, else the CPU).
    #[arg(long)]
    device: Option<String>,
    /// Copy the weights into the device's memory even where it could compute on the mapped file (what a
    /// discrete GPU needs; on the CPU, a way to test that path).
    #[arg(long)]
    copy_weights: bool,
    /// On the CPU, compute on the weights exactly as the file lays them out, in place in the mapped file:
    /// no copy into ggml's interleaved layout, whose kernels multiply Q4_0, Q4_K, IQ4_NL and MXFP4 (on ARM
    /// also Q5_K, Q6_K and Q8_0) matrices faster, and (on Linux) none into huge pages. Loads faster,
    /// computes slower.
    #[arg(long, conflicts_with = "copy_weights")]
    no_repack: bool,
    /// On Linux's CPU, compute on the weights that are not repacked in place in the mapped file, as macOS
    /// does, rather than on a copy in huge pages (which decodes faster; the copy takes the memory the
    /// mapped pages would). Loads faster, computes slower.
    #[arg(long, conflicts_with_all = ["copy_weights", "no_repack"])]
    no_huge_pages: bool,
    /// The KV cache's element type: f16, q8_0 or q4_0 (about half and a quarter of f16's memory, with
    /// their rounding), as llama.cpp's -ctk/-ctv.
    #[arg(long, default_value = "f16")]
    kv_type: shoal::engine::KvType,
}

impl DeviceArgs {
    /// `options` with the device and weight placement these flags choose.
    pub fn apply(&self, options: StageOptions) -> anyhow::Result<StageOptions> {
        if let Some(name) = &self.device {
            Device::named(name).map_err(anyhow::Error::msg)?;
        }
        let weights = WeightPlacement::chosen(self.copy_weights, self.no_repack, self.no_huge_pages);
        Ok(StageOptions { device: self.device.clone(), weights, kv_type: self.kv_type, ..options })
    }
}

pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    let best = Device::best();
    let devices: Vec<serde_json::Value> = Device::all()
        .iter()
        .map(|d| {
            let (free, total) = d.memory();
            serde_json::json!({
                "name": d.name(), "kind": d.kind().name(), "description": d.description(),
                "memory_free": free, "memory_total": total, "maps_host_memory": d.maps_host_memory(),
                "default": *d == best,
            })
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&devices)?);
        return Ok(());
    }
    for d in &devices {
        println!(
            "{} {:<10} {:<15} {:>9} free of {:<9} {}{}",
            if d["default"] == true { "*" } else { " " },
            d["name"].as_str().unwrap_or_default(),
            d["kind"].as_str().unwrap_or_default(),
            format_bytes(d["memory_free"].as_u64().unwrap_or(0)),
            format_bytes(d["memory_total"].as_u64().unwrap_or(0)),
            d["description"].as_str().unwrap_or_default(),
            if d["maps_host_memory"] == true { "" } else { " (weights are copied to it)" },
        );
    }
    println!("* runs stages unless --device says otherwise");
    Ok(())
}
