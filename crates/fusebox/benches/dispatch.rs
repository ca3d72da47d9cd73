//! Criterion: what starting a parallel loop costs. An empty 2-index loop on the default
//! backend (the team: caller + spinning helpers) against the same loop handed to the
//! backend's rayon pool from outside it (`install`, the caller sleeping until it is done),
//! and an RMS norm small enough (64 rows of 4096) that the start is a large share of it.

mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fusebox::ComputeBackend;

use common::{backend, config, random};

fn dispatch(c: &mut Criterion) {
    let cpu = backend();
    let mut g = c.benchmark_group(format!("dispatch/{}t", cpu.threads()));
    // Work per index large enough that the loop is never run serially.
    g.bench_function("team_empty_loop", |b| {
        b.iter(|| {
            cpu.for_each_index(2, 1 << 20, |i| {
                black_box(i);
            })
        })
    });
    g.bench_function("rayon_install_empty", |b| b.iter(|| cpu.install(|| black_box(1))));
    let (x, w) = (random(&[64, 4096], 1, 1.0), random(&[4096], 2, 1.0));
    g.bench_function("rms_norm_64x4096", |b| b.iter(|| black_box(cpu.rms_norm(&x, &w, 1e-5).expect("rms_norm"))));
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = dispatch }
criterion_main!(benches);
