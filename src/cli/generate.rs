//! `shoal generate`: a continuation of a prompt, streamed to stdout; logs and timings go to stderr.

use anyhow::Context;
use shoal::engine::{self, GenerateRequest, LocalPipeline, SamplingParams, StageOptions, WireFormat};
use shoal::model::{ChatMessage, Literals, Markup, Model};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// The prompt; read from stdin when absent.
    #[arg(long)]
    prompt: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256, value_parser = super::at_least_one)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy (the most likely token every time).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the random draw (random when absent).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Stop before this text (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message, with --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Run the model as stages split at these layers, e.g. 10,20 → [0,10), [10,20), [20,n).
    #[arg(long, value_delimiter = ',')]
    split: Vec<usize>,
    /// Compute threads per stage (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    device: super::devices::DeviceArgs,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(long, value_parser = super::at_least_one)]
    ctx_size: Option<usize>,
    /// Send hidden states between stages as f16 instead of f32.
    #[arg(long)]
    f16_boundaries: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let prompt = match args.prompt {
        Some(p) => p,
        None => super::read_stdin()?,
    };
    let model = Model::open(&args.model)?;
    let tokenizer = model.tokenizer()?;
    // A chat's messages are text: only the template's own markup becomes control tokens.
    let mut literals = Literals::default();
    let text = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &prompt));
        let messages = Markup::of(&tokenizer).guard_messages(&messages, &mut literals);
        model.chat_template(&tokenizer)?.render(&messages)?
    } else {
        prompt
    };
    let prompt_ids = tokenizer.encode_guarded(&text, &literals)?;
    let context = args.ctx_size.unwrap_or(model.config().training_context.min(4096));
    let options = args.device.apply(StageOptions {
        context,
        threads: args.threads.unwrap_or_else(engine::default_threads),
        ..StageOptions::default()
    })?;
    let format = if args.f16_boundaries { WireFormat::F16 } else { WireFormat::F32 };
    let mut pipeline = LocalPipeline::load(&model, &args.split, &options, format)?;
    let request = GenerateRequest {
        prompt: prompt_ids,
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            seed: args.seed.unwrap_or_else(rand::random),
            ..SamplingParams::default()
        },
        stop: args.stop,
        ignore_eos: args.ignore_eos,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_error = None;
    let stats = engine::generate(&mut pipeline, &tokenizer, &request, |piece| {
        match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_error = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = write_error {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("writing to stdout");
        }
    }
    if stdout.is_terminal() {
        writeln!(out)?;
    }
    eprintln!(
        "{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, first token after {:.0} ms ({} stage{}, finish: {:?})",
        stats.prompt_tokens,
        stats.prefill_tokens_per_second(),
        stats.generated_tokens,
        stats.decode_tokens_per_second(),
        stats.time_to_first_token.as_secs_f64() * 1000.0,
        pipeline.stages().len(),
        if pipeline.stages().len() == 1 { "" } else { "s" },
        stats.finish_reason,
    );
    Ok(())
}
