//! `fusebox info [--json]`.

use clap::Args;
use fusebox::cpu::simd::{cpu_features, Isa};
use fusebox::{ComputeBackend, Op};

use crate::backends::{available as available_backends, create as create_backend, wgpu_details};
use serde_json::json;

#[derive(Args)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Names the build knows, whether each can be created here, and why not.
fn backend_status() -> Vec<(String, bool, String)> {
    ["cpu", "wgpu", "cuda"]
        .iter()
        .map(|&name| match create_backend(name) {
            Ok(b) => (name.to_string(), true, b.name().to_string()),
            Err(e) => (name.to_string(), false, e.to_string()),
        })
        .collect()
}

pub fn run(args: &InfoArgs) -> fusebox::Result<()> {
    // The CPU as the environment configures it (see `fusebox --help`).
    let cpu = fusebox::default_cpu();
    let detected = Isa::detected();
    let used = cpu.isa();
    let features = cpu_features();
    let backends = backend_status();
    let native_ops = Op::ALL.iter().filter(|&&op| cpu.supports(op)).count();
    let wgpu = wgpu_details();
    if args.json {
        let value = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "backends_compiled": available_backends(),
            "backends": backends.iter().map(|(n, ok, detail)| json!({"name": n, "available": ok, "detail": detail})).collect::<Vec<_>>(),
            "cpu": {
                "arch": std::env::consts::ARCH,
                "isa_detected": detected.name(),
                "isa_used": used.name(),
                "isa_available": Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>(),
                "features": features,
                "threads": cpu.threads(),
                "ops": Op::ALL.len(),
                "native_ops": native_ops,
            },
            "wgpu": wgpu.as_ref().map(|w| json!({
                "adapters": w.adapters,
                "adapter": w.opened.as_ref().ok().map(|(adapter, _)| adapter),
                "limits": w.opened.as_ref().ok().map(|(_, limits)| limits),
                "error": w.opened.as_ref().err(),
                "native_ops": w.native_ops,
                "native_op_count": w.native_ops.len(),
                "fallback_ops": Op::ALL.iter().map(|o| o.name()).filter(|n| !w.native_ops.contains(n)).collect::<Vec<_>>(),
            })),
        });
        println!("{value}");
        return Ok(());
    }
    println!("fusebox {}", env!("CARGO_PKG_VERSION"));
    println!("backends compiled in: {}", available_backends().join(", "));
    for (name, ok, detail) in &backends {
        println!("  {name:<5} {}  {detail}", if *ok { "available  " } else { "unavailable" });
    }
    println!(
        "cpu: {} · ISA detected {} · used {} · {} threads",
        std::env::consts::ARCH,
        detected.name(),
        used.name(),
        cpu.threads()
    );
    println!("ISA paths available: {}", Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", "));
    println!("cpu features: {}", features.join(" "));
    println!("ops: {} in the ComputeBackend trait, {native_ops} native on cpu", Op::ALL.len());
    if let Some(w) = &wgpu {
        println!("wgpu adapters (FUSEBOX_WGPU_ADAPTER takes an index or a name):");
        for a in &w.adapters {
            println!("  {a}");
        }
        match &w.opened {
            Ok((adapter, limits)) => {
                println!("wgpu adapter: {adapter}");
                println!("wgpu limits: {limits}");
            }
            Err(e) => println!("wgpu: {e}"),
        }
        println!("wgpu: {} ops native (the rest fall back to the cpu):", w.native_ops.len());
        for chunk in w.native_ops.chunks(8) {
            println!("  {}", chunk.join(" "));
        }
    }
    Ok(())
}
