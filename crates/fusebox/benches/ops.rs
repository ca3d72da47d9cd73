//! Criterion: the memory-bound ops of `fusebox bench ops` at the same sizes (16 MiB per
//! tensor, beyond L2), throughput in bytes = the minimal bytes each op reads and writes.

mod common;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use fusebox::{AdamWConfig, ComputeBackend, Tensor};

use common::{backend, config, random, random_ids, try_once, works};

const ROWS: usize = 1024;
const DIM: usize = 4096;
const CE_ROWS: usize = 128;
const VOCAB: usize = 32000;
const N: usize = ROWS * DIM;
const EPS: f32 = 1e-5;
/// Head size of the Gated DeltaNet norms.
const HEAD_DIM: usize = 128;
/// Conv channels of a Qwen3.5-sized Gated DeltaNet layer (q, k and v: 2·2048 + 6144).
const CONV_CHANNELS: usize = 10240;

fn case<T, E: std::fmt::Debug>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    bytes: usize,
    mut run: impl FnMut() -> Result<T, E>,
) {
    if !works(name, &mut run) {
        return;
    }
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(name, |b| b.iter(|| black_box(run().expect("ran once already"))));
}

fn bench(c: &mut Criterion) {
    let cpu = backend();
    let cpu = &cpu;
    let mut g = c.benchmark_group("ops");
    let (x, y, z, w) = (
        random(&[ROWS, DIM], 1, 1.0),
        random(&[ROWS, DIM], 2, 1.0),
        random(&[ROWS, DIM], 3, 1.0),
        random(&[DIM], 4, 1.0),
    );
    case(&mut g, "add", 12 * N, || cpu.add(&x, &y));
    case(&mut g, "rms_norm", 8 * N, || cpu.rms_norm(&x, &w, EPS));
    if let Some(fwd) = try_once("rms_norm_backward", || cpu.rms_norm(&x, &w, EPS)) {
        case(&mut g, "rms_norm_backward", 12 * N, || cpu.rms_norm_backward(&x, &w, &fwd.rstd, &y));
    }
    case(&mut g, "add_rms_norm", 16 * N, || cpu.add_rms_norm(&x, &y, &w, EPS));
    // The Gated DeltaNet's norms, per head of 128: the gated output norm and L2 on q, k.
    let heads = |t: &Tensor| t.reshape([N / HEAD_DIM, HEAD_DIM]).expect("same size");
    let (xh, yh, zh, wh) = (heads(&x), heads(&y), heads(&z), random(&[HEAD_DIM], 9, 1.0));
    case(&mut g, "rms_norm_gated (D 128)", 12 * N, || cpu.rms_norm_gated(&xh, &zh, &wh, EPS));
    case(&mut g, "rms_norm_gated_backward (D 128)", 20 * N, || cpu.rms_norm_gated_backward(&xh, &zh, &wh, &yh, EPS));
    case(&mut g, "l2_norm (D 128)", 8 * N, || cpu.l2_norm(&xh, 1e-6));
    // One decode step of a Gated DeltaNet layer's conv: C channels, K = 4, the state as ctx.
    let (ctx, tok, taps, bias) = (
        random(&[1, CONV_CHANNELS, 3], 10, 1.0),
        random(&[1, CONV_CHANNELS, 1], 11, 1.0),
        random(&[CONV_CHANNELS, 4], 12, 0.5),
        random(&[CONV_CHANNELS], 13, 0.1),
    );
    case(&mut g, "depthwise_conv1d_silu_ctx (decode step)", 40 * CONV_CHANNELS, || {
        cpu.depthwise_conv1d_silu_ctx(&ctx, &tok, &taps, &bias)
    });
    case(&mut g, "silu_mul", 12 * N, || cpu.silu_mul(&x, &y));
    case(&mut g, "silu_mul_backward", 20 * N, || cpu.silu_mul_backward(&x, &y, &z));
    case(&mut g, "softmax", 8 * N, || cpu.softmax(&x, 1));
    if let Some(sm) = try_once("softmax_backward", || cpu.softmax(&x, 1)) {
        case(&mut g, "softmax_backward", 12 * N, || cpu.softmax_backward(&sm, &y, 1));
    }
    let (logits, targets) = (random(&[CE_ROWS, VOCAB], 5, 8.0), random_ids(CE_ROWS, VOCAB as u32, 6));
    let ce_bytes = 8 * CE_ROWS * VOCAB + 4 * CE_ROWS;
    case(&mut g, "cross_entropy", ce_bytes, || cpu.cross_entropy(&logits, &targets, None));
    case(&mut g, "cross_entropy_backward", ce_bytes, || cpu.cross_entropy_backward(&logits, &targets, None, 1.0));
    let grad = random(&[N], 7, 1e-2);
    let (mut p, mut m, mut v) = (
        random(&[N], 8, 1.0),
        Tensor::from_vec(vec![0f32; N], [N]).expect("n"),
        Tensor::from_vec(vec![0f32; N], [N]).expect("n"),
    );
    let hyper = AdamWConfig { lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, grad_scale: 1.0 };
    let mut step = 0u64;
    case(&mut g, "adamw_update", 28 * N, || {
        step += 1;
        cpu.adamw_update(&mut p, &grad, &mut m, &mut v, &hyper, step)
    });
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = bench }
criterion_main!(benches);
