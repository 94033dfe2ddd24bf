//! `shoal chat`: a conversation with a model running on the cluster, streamed through the node's
//! OpenAI-compatible API, with each reply's time to first token and token rates.

use super::client::NodeAddress;
use std::io::{BufRead, Write};

#[derive(clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    node: NodeAddress,
    /// The model (default: the first one running).
    #[arg(long)]
    model: Option<String>,
    /// A system message.
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Most tokens of each reply.
    #[arg(long, default_value_t = 512, value_parser = super::at_least_one)]
    max_tokens: usize,
    /// Send one message (instead of reading them from stdin) and exit.
    #[arg(long)]
    message: Option<String>,
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let models: serde_json::Value = args.node.get("/v1/models")?;
            models["data"][0]["id"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow::anyhow!("no model is running; start one with `shoal run MODEL.gguf`"))?
        }
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(serde_json::json!({ "role": "system", "content": system }));
    }
    let interactive = args.message.is_none();
    let mut inputs: Box<dyn Iterator<Item = String>> = match &args.message {
        Some(m) => Box::new(std::iter::once(m.clone())),
        None => Box::new(std::io::stdin().lock().lines().map_while(Result::ok)),
    };
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = inputs.next() else { return Ok(()) };
        if line.trim().is_empty() {
            continue;
        }
        messages.push(serde_json::json!({ "role": "user", "content": line }));
        let body = serde_json::json!({
            "model": model, "messages": messages, "stream": true,
            "temperature": args.temperature, "max_tokens": args.max_tokens,
        });
        let (reply, report) = args.node.stream_chat(body, |piece| {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        })?;
        println!();
        if let Some(r) = report.filter(|r| r.generated_tokens > 0) {
            eprintln!(
                "[{} tokens · first token {:.0} ms · prefill {:.0} tok/s · decode {:.1} tok/s]",
                r.generated_tokens, r.time_to_first_token_ms, r.prefill_tokens_per_second, r.decode_tokens_per_second
            );
        }
        messages.push(serde_json::json!({ "role": "assistant", "content": reply }));
    }
}
