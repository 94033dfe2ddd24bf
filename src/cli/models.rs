//! `shoal models` (the models this machine has, as a table or with `--json` the JSON of
//! `GET /api/models`), `shoal models add PATH`, and `shoal pull REPO[:FILE] [--layers FIRST-LAST |
//! --rank RANK/NODES]` with a progress bar.

use shoal::model::library::{Library, LibraryModel, ModelSource};
use shoal::model::pull::{self, Hub, PullRequest, PullState};
use shoal::model::shard;
use shoal::node::DataDir;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ModelsArgs {
    /// shoal's data directory (its models are in `models/` inside it).
    #[arg(long, env = "SHOAL_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Print the JSON of GET /api/models.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    action: Option<ModelsAction>,
}

#[derive(clap::Subcommand)]
enum ModelsAction {
    /// Add a GGUF file elsewhere on this machine to the library.
    Add {
        /// The GGUF file.
        path: PathBuf,
    },
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// ORG/NAME (its GGUF model) or ORG/NAME:FILE (a file, or a quantization such as Q4_K_M).
    model: String,
    /// Fetch only what a stage running these layers reads (FIRST-LAST, both included, as
    /// `shoal run --layers` writes them): the GGUF header and those tensors, into a sparse file.
    #[arg(long, value_name = "FIRST-LAST", conflicts_with = "rank")]
    layers: Option<String>,
    /// Fetch only what one node of a tensor-parallel group of equal nodes reads (RANK/NODES, 0/2 for the
    /// first of two): the GGUF header, what every node holds whole and its slice of every layer, into a
    /// sparse file. A launch that gives this node another share fetches what it lacks.
    #[arg(long, value_name = "RANK/NODES")]
    rank: Option<String>,
    /// The branch, tag or commit to download.
    #[arg(long, default_value = "main")]
    revision: String,
    /// shoal's data directory (downloads go to `models/` inside it).
    #[arg(long, env = "SHOAL_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let library = Library::new(&DataDir::new(args.data_dir.as_deref())?);
    if let Some(ModelsAction::Add { path }) = args.action {
        let model = library.add(&path)?;
        println!("added {} ({})", model.path.display(), model.name);
        if let Some(problem) = &model.problem {
            println!("note: shoal cannot run it as it is: {problem}");
        }
        return Ok(());
    }
    let models = library.list();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&models)?);
    } else {
        print!("{}", render(&models));
    }
    Ok(())
}

fn render(models: &[LibraryModel]) -> String {
    if models.is_empty() {
        return "no models yet: download one with `shoal pull ORG/NAME`, or add a file with `shoal models add PATH`\n"
            .into();
    }
    let mut out = format!(
        "{:<36} {:<8} {:>7} {:<9} {:>6} {:>8} {:>10} {:<5} {:<12}\n",
        "MODEL", "ARCH", "PARAMS", "QUANT", "LAYERS", "CONTEXT", "SIZE", "RUNS", "SOURCE"
    );
    let dash = || "-".to_string();
    for m in models {
        let source = match &m.source {
            ModelSource::Shoal => "shoal".to_string(),
            ModelSource::HuggingFace { repo, .. } => format!("hf:{repo}"),
            ModelSource::Added => "added".to_string(),
        };
        let parts = match &m.shard {
            // A tensor-parallel rank's shard holds a slice of every layer ("rank 1 of 2"), not layers.
            Some(shard) if shard.layers.starts_with("rank") => format!(" (shard: {}'s slice)", shard.layers),
            Some(shard) => format!(" (shard: layers {})", shard.layers),
            None if m.parts.len() > 1 => format!(" ({} parts)", m.parts.len()),
            None => String::new(),
        };
        out += &format!(
            "{:<36} {:<8} {:>7} {:<9} {:>6} {:>8} {:>10} {:<5} {:<12}\n",
            format!("{}{parts}", m.name),
            m.architecture.clone().unwrap_or_else(dash),
            m.parameters.map(parameters).unwrap_or_else(dash),
            m.quantization.clone().unwrap_or_else(dash),
            m.layers.map(|l| l.to_string()).unwrap_or_else(dash),
            m.context_length.map(|c| c.to_string()).unwrap_or_else(dash),
            super::status::size(m.size_bytes),
            if m.runnable { "yes" } else { "no" },
            source,
        );
        match &m.title {
            Some(title) => out += &format!("    {title} · {}\n", m.path.display()),
            None => out += &format!("    {}\n", m.path.display()),
        }
        if let Some(problem) = &m.problem {
            out += &format!("    ! {problem}\n");
        }
        if let Some(note) = &m.note {
            out += &format!("    · {note}\n");
        }
    }
    out
}

fn parameters(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    }
}

pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    let mut request = PullRequest::parse(&args.model)?;
    request.revision = Some(args.revision);
    let library = Library::new(&DataDir::new(args.data_dir.as_deref())?);
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {percent}%",
        )?
        .progress_chars("=> "),
    );
    let share = match (&args.layers, &args.rank) {
        (Some(layers), _) => Some(shard::StageShare::Layers(shard::parse_layers(layers)?)),
        (None, Some(rank)) => Some(shard::parse_rank(rank)?),
        (None, None) => None,
    };
    let mut state = PullState::Resolving;
    let mut report = |p: &pull::PullProgress| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
        if p.state != state || bar.message() != p.file {
            state = p.state;
            let verb = match p.state {
                PullState::Verifying => "verifying",
                _ => "",
            };
            bar.set_message(format!("{verb} {}", p.file).trim().to_string());
        }
    };
    let (hub, models_dir) = (Hub::from_env(), library.models_dir());
    let paths = match &share {
        Some(share) => shard::pull_share(&hub, &models_dir, &request, share, &mut report).map(|path| vec![path]),
        None => pull::pull(&hub, &models_dir, &request, &mut report),
    };
    match paths {
        Ok(paths) => {
            bar.finish();
            match &share {
                Some(share) => eprintln!("fetched {} into {} (a shard)", share.label(), paths[0].display()),
                None => eprintln!("downloaded {}", paths[0].display()),
            }
            for path in paths {
                println!("{}", path.display());
            }
            Ok(())
        }
        Err(e) => {
            bar.abandon();
            Err(e)
        }
    }
}
