//! `fusebox demo`: fused causal attention forward and backward on a GQA shape, with
//! timings and a check that the output is finite and the logsumexp is sane.

use std::time::Instant;

use clap::Args;
use fusebox::Tensor;

#[derive(Args)]
pub struct DemoArgs {
    /// Backend to run on.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Sequence length.
    #[arg(long, default_value_t = 1024)]
    seq: usize,
    /// Query heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Key/value heads (GQA when fewer than query heads).
    #[arg(long, default_value_t = 2)]
    kv_heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    fusebox::rng::Rng::new(seed).uniform_vec(n, -1.0, 1.0)
}

/// Checks the sizes before anything is allocated: positive, GQA-compatible, and inputs,
/// outputs and gradients (about 12 tensors of `T × heads × head_dim` f32) that fit in the
/// memory available.
fn check(args: &DemoArgs) -> fusebox::Result<()> {
    let bad = |flag: &str, expected: &str, got: String| Err(fusebox::Error::value("demo", flag, expected, got));
    for (flag, v) in
        [("--seq", args.seq), ("--heads", args.heads), ("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim)]
    {
        if v == 0 {
            return bad(flag, "at least 1", "0".into());
        }
    }
    if !args.heads.is_multiple_of(args.kv_heads) {
        return bad("--kv-heads", &format!("a divisor of --heads {}", args.heads), args.kv_heads.to_string());
    }
    let bytes = (args.seq as u128) * (args.heads as u128) * (args.head_dim as u128) * 4 * 12;
    let avail = crate::memory::available_memory().map_or(isize::MAX as u128, u128::from);
    if bytes > avail.min(isize::MAX as u128) {
        return bad(
            "--seq × --heads × --head-dim",
            &format!("tensors that fit in the {} available", crate::memory::gib(avail.min(u64::MAX as u128) as u64)),
            format!("about {:.3e} bytes", bytes as f64),
        );
    }
    Ok(())
}

pub fn run(args: &DemoArgs) -> fusebox::Result<()> {
    check(args)?;
    let backend = crate::backends::create(&args.backend)?;
    let (b, hq, hkv, t, d) = (1, args.heads, args.kv_heads, args.seq, args.head_dim);
    let q = Tensor::from_vec(values(b * hq * t * d, 1), [b, hq, t, d])?;
    let k = Tensor::from_vec(values(b * hkv * t * d, 2), [b, hkv, t, d])?;
    let v = Tensor::from_vec(values(b * hkv * t * d, 3), [b, hkv, t, d])?;
    let d_out = Tensor::from_vec(values(b * hq * t * d, 4), [b, hq, t, d])?;
    let (q, k, v, d_out) = (backend.upload(&q)?, backend.upload(&k)?, backend.upload(&v)?, backend.upload(&d_out)?);
    let scale = 1.0 / (d as f32).sqrt();
    println!(
        "causal attention on '{}': batch {b}, {hq} query heads over {hkv} kv heads (GQA {}), T {t}, head_dim {d}",
        backend.name(),
        hq / hkv.max(1)
    );
    // Warm up once so the timings exclude first-touch page faults.
    backend.causal_attention(&q, &k, &v, None, None, scale)?;
    let start = Instant::now();
    let fwd = backend.causal_attention(&q, &k, &v, None, None, scale)?;
    backend.synchronize()?;
    let fwd_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let grads = backend.causal_attention_backward(&q, &k, &v, &fwd, &d_out, None, None, scale)?;
    backend.synchronize()?;
    let bwd_s = start.elapsed().as_secs_f64();

    // Causal forward FLOPs: 2·B·Hq·T²·D (the causal half of 4·B·Hq·T²·D); backward 2.5×.
    let flops = 2.0 * (b * hq) as f64 * (t * t) as f64 * d as f64;
    let out = backend.to_host(&fwd.output)?.to_vec_f32()?;
    let lse = backend.to_host(&fwd.logsumexp)?.to_vec::<f32>()?;
    let dq = backend.to_host(&grads.dq)?.to_vec_f32()?;
    let finite = out.iter().chain(&dq).all(|x| x.is_finite());
    println!("forward : {:8.2} ms  {:7.1} GFLOP/s", fwd_s * 1e3, flops / fwd_s / 1e9);
    println!("backward: {:8.2} ms  {:7.1} GFLOP/s", bwd_s * 1e3, 2.5 * flops / bwd_s / 1e9);
    println!(
        "saved for backward: logsumexp {:?} ({} floats; no T×T matrix), first rows {:.4} {:.4} … last {:.4}",
        fwd.logsumexp.dims(),
        lse.len(),
        lse[0],
        lse[1.min(lse.len() - 1)],
        lse[lse.len() - 1]
    );
    println!(
        "gradients: dq {:?}, dk {:?}, dv {:?}; all finite: {finite}",
        grads.dq.dims(),
        grads.dk.dims(),
        grads.dv.dims()
    );
    if !finite {
        return Err(fusebox::Error::value("demo", "attention output", "finite values", "NaN or infinity"));
    }
    Ok(())
}
