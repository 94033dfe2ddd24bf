//! `shoal chat`: a conversation with a model running on the cluster, streamed through the node's
//! OpenAI-compatible API, with each reply's time to first token and token rates. When nothing serves, it
//! says what became of the last instance (failed, being placed again, stopped) instead of only that.

use super::client::NodeAddress;
use shoal::instances::{InstanceInfo, InstanceState};
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
            match models["data"][0]["id"].as_str() {
                Some(id) => id.to_string(),
                None => coming_or_gone(&args.node)?,
            }
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

/// With no model serving: the model of the newest instance if it is launching or being placed again
/// (requests wait for it), or an error saying what became of it (failed, stopped) and why.
fn coming_or_gone(node: &NodeAddress) -> anyhow::Result<String> {
    let launch = format!("start one with `shoal run MODEL.gguf{}`", node.flag());
    let instances: Vec<InstanceInfo> = node.get("/api/instances").unwrap_or_default();
    let Some(last) = instances.iter().max_by_key(|i| i.created_at_ms) else {
        anyhow::bail!("no model is running; {launch}");
    };
    let why = last.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
    match last.state {
        InstanceState::Ready => Ok(last.model.clone()),
        InstanceState::Recovering | InstanceState::Launching => {
            let doing = if last.state == InstanceState::Recovering { "being placed again" } else { "launching" };
            eprintln!("`{}` (instance {}) is {doing}{why}; the reply waits for it", last.model, last.id);
            Ok(last.model.clone())
        }
        InstanceState::Failed => {
            anyhow::bail!("no model is running: `{}` (instance {}) failed{why}; {launch}", last.model, last.id)
        }
        state => anyhow::bail!(
            "no model is running: the last one, `{}` (instance {}), {}{why}; {launch}",
            last.model,
            last.id,
            format!("{state:?}").to_lowercase()
        ),
    }
}
