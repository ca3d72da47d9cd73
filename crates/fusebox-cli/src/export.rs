//! `fusebox export --model M --format hf|gguf [--dtype f32|f16|bf16] [--quant q8_0|q4_0|q4_k…]
//! --out PATH`: writes a model as a Hugging Face directory (`transformers` loads it) or a
//! GGUF file (llama.cpp loads it), with its tokenizer and chat template. `M` is a GGUF
//! file or a Hugging Face directory: HF ↔ GGUF conversion and requantization.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use fusebox::{CpuBackend, Error, Result};
use fusebox_models::export::{self, gguf, FloatType, TokenizerInfo};
use fusebox_models::{finetune, open};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A Hugging Face directory: config.json, model.safetensors, tokenizer files.
    Hf,
    /// One GGUF file.
    Gguf,
    /// A LoRA checkpoint's adapters as Hugging Face PEFT writes them
    /// (adapter_config.json, adapter_model.safetensors), not merged.
    Peft,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The model: a .gguf file or a Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// What to write.
    #[arg(long, value_enum)]
    format: Format,
    /// Float type of the weights written unquantized: f32 (default, lossless for an
    /// f32 model), f16 or bf16. With --quant, the type of matrices that cannot be
    /// quantized; norms and biases stay f32 in GGUF.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// GGUF only: quantize the matrices to this block format (q8_0, q6_k, q5_k, q5_1,
    /// q5_0, q4_k, q4_1, q4_0, q3_k, q2_k, iq4_nl, iq4_xs); the output head gets q6_k
    /// unless this is q8_0, as llama.cpp's llama-quantize does.
    #[arg(long)]
    quant: Option<String>,
    /// Where to write: a directory (hf) or a file (gguf). An earlier export there is replaced.
    #[arg(long)]
    out: PathBuf,
}

/// Where the model comes from.
enum Source {
    /// A GGUF file or a Hugging Face directory.
    Pretrained,
    /// A fusebox training or fine-tuning checkpoint directory.
    Checkpoint,
}

fn source(path: &Path) -> Result<Source> {
    if !path.exists() {
        return Err(Error::Io(format!("{}: no such file or directory", path.display())));
    }
    // A fine-tuning checkpoint first: it may also hold a config.json.
    if finetune::is_finetune_checkpoint(path) {
        Ok(Source::Checkpoint)
    } else if open::is_pretrained(path) {
        Ok(Source::Pretrained)
    } else {
        Err(Error::Io(format!(
            "{}: neither a GGUF file, a Hugging Face model directory nor a fine-tuning checkpoint",
            path.display()
        )))
    }
}

pub fn run(args: &ExportArgs) -> Result<()> {
    let float = FloatType::parse(&args.dtype)?;
    let quant = args.quant.as_deref().map(gguf::parse_quant).transpose()?;
    if quant.is_some() && args.format == Format::Peft {
        return Err(Error::unsupported("export", "--quant is for --format gguf (PEFT adapters are written in f32)"));
    }
    if quant.is_some() && args.format == Format::Hf {
        return Err(Error::unsupported(
            "export",
            "--quant is for --format gguf (a Hugging Face export is written in --dtype f32, f16 or bf16)",
        ));
    }
    let cpu = CpuBackend::builder().build()?;
    let start = Instant::now();
    if args.format == Format::Peft {
        if !finetune::is_finetune_checkpoint(&args.model) {
            return Err(Error::unsupported(
                "export --format peft",
                format!("{} is not a LoRA fine-tuning checkpoint", args.model.display()),
            ));
        }
        let (arch, adapters, base) = finetune::load_adapters(&cpu, &args.model)?;
        export::peft::write(&cpu, &arch, &adapters, &base.path.display().to_string(), &args.out)?;
        eprintln!("wrote {} in {:.1}s", args.out.display(), start.elapsed().as_secs_f64());
        return Ok(());
    }
    let (network, tokenizer, template) = match source(&args.model)? {
        Source::Pretrained => {
            let model = open::load(&cpu, &args.model)?;
            let (info, template) = export::read_tokenizer_source(&args.model)?;
            eprintln!("loaded {} ({})", args.model.display(), model.description);
            (model.network, info, template)
        }
        Source::Checkpoint => {
            let (network, tokenizer, template) = finetune::load_merged(&cpu, &args.model)?;
            let base = match &tokenizer {
                finetune::TokenizerSource::Gguf(path) | finetune::TokenizerSource::Hf(path) => path,
            };
            let (info, base_template) = export::read_tokenizer_source(base)?;
            eprintln!("loaded fine-tuning checkpoint {} (LoRA adapters, if any, merged)", args.model.display());
            (network, info, template.or(base_template))
        }
    };
    write(&cpu, &network, &tokenizer, template.as_deref(), args, float, quant)?;
    eprintln!("wrote {} in {:.1}s", args.out.display(), start.elapsed().as_secs_f64());
    Ok(())
}

fn write(
    cpu: &CpuBackend,
    network: &fusebox_models::Transformer,
    tokenizer: &TokenizerInfo,
    template: Option<&str>,
    args: &ExportArgs,
    float: FloatType,
    quant: Option<fusebox::DType>,
) -> Result<()> {
    match args.format {
        Format::Hf => export::write_hf(cpu, network, tokenizer, template, &args.out, float),
        Format::Gguf => {
            export::write_gguf(cpu, network, tokenizer, template, &args.out, &gguf::Options { float, quant })
        }
        Format::Peft => Err(Error::unsupported("export", "--format peft writes adapters, not a network")),
    }
}
