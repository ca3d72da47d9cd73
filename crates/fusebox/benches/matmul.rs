//! Criterion: sgemm through `matmul` at 1024³ and 2048³ (throughput in "elements" =
//! FLOPs, `2·m·n·k`), the cases of `fusebox bench matmul` / bench/compare.sh.

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
}

criterion_group! { name = benches; config = config(); targets = bench }
criterion_main!(benches);
