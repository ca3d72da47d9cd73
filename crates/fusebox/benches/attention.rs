//! Criterion: fused causal attention forward, forward + backward, and decode attention,
//! at the shapes of `fusebox bench attention` / bench/compare.sh. Throughput is in
//! "elements" = FLOPs (forward `2·B·Hq·T²·D`, forward + backward 3.5× that), and bytes of
//! K/V for decode.

mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fusebox::ComputeBackend;

use common::{backend, config, random, works};

/// (batch, Hq, Hkv, T, D)
const FWD: &[(usize, usize, usize, usize, usize)] = &[(1, 8, 8, 1024, 64)];
const FWDBWD: &[(usize, usize, usize, usize, usize)] =
    &[(1, 8, 8, 1024, 64), (4, 12, 12, 256, 64), (1, 32, 8, 512, 128)];

fn bench(c: &mut Criterion) {
    let cpu = backend();
    let mut g = c.benchmark_group("attention");
    for (pass, shapes) in [("fwd", FWD), ("fwdbwd", FWDBWD)] {
        for &(b, hq, hkv, t, d) in shapes {
            let name = format!("{pass}/b{b}_hq{hq}_hkv{hkv}_t{t}_d{d}");
            let (q, k, v, dy) = (
                random(&[b, hq, t, d], 1, 1.0),
                random(&[b, hkv, t, d], 2, 1.0),
                random(&[b, hkv, t, d], 3, 1.0),
                random(&[b, hq, t, d], 4, 1.0),
            );
            let scale = 1.0 / (d as f32).sqrt();
            let run = || -> fusebox::Result<()> {
                let r = cpu.causal_attention(&q, &k, &v, None, None, scale)?;
                if pass == "fwdbwd" {
                    black_box(cpu.causal_attention_backward(&q, &k, &v, &r, &dy, None, None, scale)?);
                }
                black_box(r);
                Ok(())
            };
            if !works(&name, run) {
                continue;
            }
            let flops = 2.0 * (b * hq) as f64 * (t * t * d) as f64 * if pass == "fwdbwd" { 3.5 } else { 1.0 };
            g.throughput(Throughput::Elements(flops as u64));
            g.bench_function(&name, |bench| bench.iter(|| run().expect("ran once already")));
        }
    }
    // Decode: one query over a 4096-long cache, Hq 32, Hkv 8, D 128.
    let (b, hq, hkv, kv_len, d) = (1, 32, 8, 4096, 128);
    let name = format!("decode/b{b}_hq{hq}_hkv{hkv}_t{kv_len}_d{d}");
    let (q, kc, vc) =
        (random(&[b, hq, 1, d], 1, 1.0), random(&[b, hkv, kv_len, d], 2, 1.0), random(&[b, hkv, kv_len, d], 3, 1.0));
    let scale = 1.0 / (d as f32).sqrt();
    let run = || cpu.decode_attention(&q, &kc, &vc, kv_len, None, None, scale);
    if works(&name, run) {
        g.throughput(Throughput::Bytes((2 * b * hkv * kv_len * d * 4) as u64));
        g.bench_function(&name, |bench| bench.iter(|| black_box(run().expect("ran once already"))));
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = bench }
criterion_main!(benches);
