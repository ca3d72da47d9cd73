//! `fusebox`: the command line. Parses flags and prints; the maths lives in the library.

mod backends;
mod bench;
mod chat;
mod comm;
mod demo;
mod export;
mod generate;
mod info;
mod memory;
mod pipeline;
mod plot;
mod serve;
mod tokenize;
mod train;

use clap::{Parser, Subcommand};

/// Freed blocks of 1 MiB and more are reused for the next tensor of the same size
/// instead of being unmapped and faulted in again every training step.
#[cfg(not(any(feature = "mimalloc", feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: fusebox::host_cache::CachingAllocator = fusebox::host_cache::CachingAllocator;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// fusebox: transformer training and inference on one ComputeBackend trait.
#[derive(Parser)]
#[command(name = "fusebox", version, about, after_help = backends::ENV_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Decode with the activations rounded to 8 bits and integer dot products against
    /// quantized weights, as llama.cpp does: the default of generate, chat, serve and
    /// bench; for train, demo and export only with this flag (also FUSEBOX_INT8_DECODE=1).
    #[arg(long, global = true, conflicts_with = "exact")]
    int8: bool,
    /// Decode with f32 activations against quantized weights: the closest to the exact
    /// model and the library's default (--int8's 8-bit rounding may flip a near-tie; also
    /// FUSEBOX_INT8_DECODE=0).
    #[arg(long, global = true)]
    exact: bool,
}

impl Command {
    /// Whether the command decodes tokens from a model, where the integer path is the
    /// default: training and its checks keep f32 activations unless `--int8` asks.
    fn decodes(&self) -> bool {
        matches!(self, Command::Generate(_) | Command::Chat(_) | Command::Serve(_) | Command::Bench(_))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Backends compiled in and available, CPU features, ISA level and threads.
    Info(info::InfoArgs),
    /// A short causal-attention demo: forward and backward through the fused kernel.
    Demo(demo::DemoArgs),
    /// Train a GPT/Llama model: the built-in addition task, or --data FILE; or fine-tune a
    /// pretrained one (--init MODEL).
    Train(Box<train::TrainArgs>),
    /// Generate text from a checkpoint, a GGUF file or a Hugging Face directory.
    Generate(Box<generate::GenerateArgs>),
    /// Chat with a model in the terminal (or over a pipe, one message per line).
    Chat(Box<chat::ChatArgs>),
    /// An OpenAI-compatible HTTP server with continuous batching and a chat page.
    Serve(Box<serve::ServeArgs>),
    /// Benchmarks: attention, matmul, ops, train (`--json` for one object per case).
    Bench(bench::BenchArgs),
    /// Token ids and pieces of a text under a model's tokenizer (GGUF or Hugging Face).
    Tokenize(tokenize::TokenizeArgs),
    /// Write a model as a Hugging Face directory or a GGUF file (convert, requantize).
    Export(Box<export::ExportArgs>),
}

fn main() {
    let cli = Cli::parse();
    backends::set_decode_path(if cli.exact {
        backends::DecodePath::Exact
    } else if cli.int8 {
        backends::DecodePath::Int8
    } else {
        backends::DecodePath::Default { int8: cli.command.decodes() }
    });
    // The environment's CPU settings also hold for the CPU that other backends fall back to.
    if let Err(e) = backends::configure_default_cpu() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let result = match cli.command {
        Command::Info(args) => info::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
        Command::Chat(args) => chat::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Serve(args) => serve::run(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
