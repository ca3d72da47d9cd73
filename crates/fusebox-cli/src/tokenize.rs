//! `fusebox tokenize --model M [--text T | --file F] [--json] [--no-bos] [--special]`:
//! the token ids of a text and the piece of text each stands for, as llama.cpp's
//! `llama-tokenize` prints them. Only the tokenizer is read (GGUF metadata, or
//! `tokenizer.json` + `tokenizer_config.json`), never the weights.

use std::path::{Path, PathBuf};

use clap::Args;
use fusebox::{Error, Result};
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::Tokenizer;
use serde_json::json;

#[derive(Args)]
pub struct TokenizeArgs {
    /// A .gguf file, or a Hugging Face directory (or its tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The text to tokenize.
    #[arg(long, conflicts_with = "file")]
    text: Option<String>,
    /// A UTF-8 file whose whole contents are tokenized.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Print one JSON object: {"ids": [...], "pieces": [...], "count": n}.
    #[arg(long)]
    json: bool,
    /// Add no BOS/EOS even where the model asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Parse special-token text (`<|im_start|>`, `<start_of_turn>`) as those tokens.
    #[arg(long)]
    special: bool,
}

/// The tokenizer of a GGUF file or a Hugging Face directory.
fn load(path: &Path) -> Result<Tokenizer> {
    let with_path = |e: Error| Error::Io(format!("{}: {e}", path.display()));
    if path.is_dir() {
        return Tokenizer::from_hf_dir(path).map_err(with_path);
    }
    if path.file_name().is_some_and(|n| n == "tokenizer.json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        return Tokenizer::from_hf_dir(dir).map_err(with_path);
    }
    if !path.exists() {
        return Err(Error::Io(format!("{}: no such file or directory", path.display())));
    }
    let file = GgufFile::open(path).map_err(with_path)?;
    Tokenizer::from_gguf(file.metadata()).map_err(with_path)
}

/// What token `id` decodes to, special tokens written out (invalid UTF-8 as U+FFFD).
fn piece(tok: &Tokenizer, id: u32) -> Result<String> {
    let mut bytes = Vec::new();
    tok.token_bytes(id, false, &mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub fn run(args: &TokenizeArgs) -> Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| Error::Io(format!("{}: {e}", f.display())))?,
        (None, None) => return Err(Error::Io("tokenize: give the text with --text TEXT or --file FILE".into())),
    };
    let tok = load(&args.model)?;
    let ids = tok.tokenize(&text, !args.no_bos, args.special);
    let pieces = ids.iter().map(|&id| piece(&tok, id)).collect::<Result<Vec<_>>>()?;
    if args.json {
        println!("{}", json!({"ids": ids, "pieces": pieces, "count": ids.len()}));
    } else {
        for (id, p) in ids.iter().zip(&pieces) {
            println!("{id:>6} -> '{p}'");
        }
    }
    Ok(())
}
