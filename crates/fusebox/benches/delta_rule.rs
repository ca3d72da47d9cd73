//! Criterion: the gated delta rule. The chunked forward and forward + backward at the
//! shape of issue 39's comparison with transformers (B 1, 16 heads, Dk = Dv = 128,
//! T 4096, 2 threads; `scripts/bench_delta_rule_vs_torch.py` runs this bench and
//! transformers' `torch_chunk_gated_delta_rule` in the same run), throughput in FLOPs of
//! the chunked algorithm (forward `2·B·H·T·(2·64·Dk + 64·Dv + 3·Dk·Dv)`, approximately;
//! forward + backward counted 3× that); and the decode step at 16 and 32 value heads of
//! 128 × 128, throughput in bytes of state read and written (one pass each way).

mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fusebox::{ComputeBackend, CpuBackend, Tensor};

use common::{config, random, works};

/// Values like the model's: q, k rows of unit length, g < 0, β in (0, 1).
fn inputs(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> [Tensor; 5] {
    let unit = |seed: u64| {
        let x = random(&[b, t, hk, dk], seed, 1.0);
        let mut v = x.to_vec_f32().expect("f32");
        for row in v.chunks_mut(dk) {
            let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= n);
        }
        Tensor::from_vec(v, x.dims().to_vec()).expect("shape")
    };
    let shift = |x: Tensor, by: f32| {
        let v: Vec<f32> = x.to_vec_f32().expect("f32").iter().map(|a| a + by).collect();
        Tensor::from_vec(v, x.dims().to_vec()).expect("shape")
    };
    [
        unit(1),
        unit(2),
        random(&[b, t, hv, dv], 3, 1.0),
        shift(random(&[b, t, hv], 4, 0.1), -0.15),
        shift(random(&[b, t, hv], 5, 0.4), 0.5),
    ]
}

fn bench(c: &mut Criterion) {
    let cpu = CpuBackend::with_threads(2).expect("a 2-thread CPU backend");
    let mut g = c.benchmark_group("delta_rule");
    let (b, t, h, d) = (1, 4096, 16, 128);
    let [q, k, v, gate, beta] = inputs(b, t, h, h, d, d);
    let dy = random(&[b, t, h, d], 6, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let flops = 2.0 * (b * h * t) as f64 * (2.0 * 64.0 * d as f64 + 64.0 * d as f64 + 3.0 * (d * d) as f64);
    for pass in ["fwd", "fwdbwd"] {
        let name = format!("chunked_{pass}/b{b}_h{h}_t{t}_d{d}_2threads");
        let run = || -> fusebox::Result<()> {
            let r = cpu.gated_delta_rule(&q, &k, &v, &gate, &beta, None, scale)?;
            if pass == "fwdbwd" {
                black_box(cpu.gated_delta_rule_backward(&q, &k, &v, &gate, &beta, None, &dy, None, scale)?);
            }
            black_box(r);
            Ok(())
        };
        if !works(&name, run) {
            continue;
        }
        g.throughput(Throughput::Elements((flops * if pass == "fwd" { 1.0 } else { 3.0 }) as u64));
        g.bench_function(&name, |bench| bench.iter(|| run().expect("ran once already")));
    }
    for hv in [16, 32] {
        let name = format!("step/b1_hv{hv}_dk{d}_dv{d}_2threads");
        let [q, k, v, gate, beta] = inputs(1, 1, hv / 2, hv, d, d);
        let reshape = |x: &Tensor| {
            let mut dims = x.dims().to_vec();
            dims.remove(1);
            x.reshape(dims).expect("same size")
        };
        let (q, k, v, gate, beta) = (reshape(&q), reshape(&k), reshape(&v), reshape(&gate), reshape(&beta));
        let mut state = random(&[1, hv, d, d], 7, 0.1);
        if !works(&name, || cpu.gated_delta_rule_step(&q, &k, &v, &gate, &beta, &mut state, scale)) {
            continue;
        }
        g.throughput(Throughput::Bytes((2 * hv * d * d * 4) as u64));
        g.bench_function(&name, |bench| {
            bench.iter(|| {
                black_box(cpu.gated_delta_rule_step(&q, &k, &v, &gate, &beta, &mut state, scale).expect("ran"))
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = bench }
criterion_main!(benches);
