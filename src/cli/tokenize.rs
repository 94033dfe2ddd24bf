//! `shoal tokenize`: the token ids of stdin's text, as llama.cpp's `llama-tokenize --ids` prints them.

use shoal::model::Model;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The GGUF model file whose tokenizer to use.
    #[arg(long)]
    model: PathBuf,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let text = super::read_stdin()?;
    let model = Model::open(&args.model)?;
    let ids = model.tokenizer()?.encode(&text)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
