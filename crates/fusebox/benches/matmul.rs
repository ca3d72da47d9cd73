//! Criterion: sgemm through `matmul` at 1024³ and 2048³ (throughput in "elements" =
//! FLOPs, `2·m·n·k`), the cases of `fusebox bench matmul` / bench/compare.sh; and the
//! linear layer `y = x·Wᵀ` in f32 (`linear_forward`) and with BF16 operands
//! (`linear_forward_bf16`) at GPT-2's MLP shape, 256 and 2,048 rows.

mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fusebox::ComputeBackend;

use common::{backend, config, random, works};

fn bench(c: &mut Criterion) {
    let cpu = backend();
    let mut g = c.benchmark_group("matmul");
    for n in [1024usize, 2048] {
        let name = format!("{n}x{n}x{n}");
        let (a, b) = (random(&[n, n], 1, 1.0), random(&[n, n], 2, 1.0));
        let run = || cpu.matmul(&a, &b, false, false);
        if !works(&name, run) {
            continue;
        }
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_function(&name, |bench| bench.iter(|| black_box(run().expect("ran once already"))));
    }
    g.finish();
    let mut g = c.benchmark_group("linear");
    for rows in [256usize, 2048] {
        let (x, w) = (random(&[rows, 768], 3, 1.0), random(&[3072, 768], 4, 1.0));
        g.throughput(Throughput::Elements(2 * (rows * 768 * 3072) as u64));
        let f32_name = format!("f32 {rows}x768->3072");
        if works(&f32_name, || cpu.linear_forward(&x, &w, None)) {
            g.bench_function(&f32_name, |bench| bench.iter(|| black_box(cpu.linear_forward(&x, &w, None).unwrap())));
        }
        let bf16_name = format!("bf16 {rows}x768->3072");
        if works(&bf16_name, || cpu.linear_forward_bf16(&x, &w, None)) {
            g.bench_function(&bf16_name, |bench| {
                bench.iter(|| black_box(cpu.linear_forward_bf16(&x, &w, None).unwrap()))
            });
        }
    }
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = bench }
criterion_main!(benches);
