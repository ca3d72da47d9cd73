//! `fusebox`: the command line. Parses flags and prints; the maths lives in the library.

mod demo;
mod info;

use clap::{Parser, Subcommand};

/// fusebox: transformer training and inference on one ComputeBackend trait.
#[derive(Parser)]
#[command(name = "fusebox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Backends compiled in and available, CPU features, ISA level and threads.
    Info(info::InfoArgs),
    /// A short causal-attention demo: forward and backward through the fused kernel.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(&args),
        Command::Demo(args) => demo::run(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
