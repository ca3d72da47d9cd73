//! The conformance suite on `WgpuBackend`, counting the cases that ran on the GPU path.
//!
//! Without an adapter the test prints why and passes, unless
//! `FUSEBOX_REQUIRE_GPU_ADAPTER=1` (CI), where it fails.

use std::collections::BTreeMap;

use fusebox::{ComputeBackend, CpuBackend, DType, Op, Shape, Tensor};
use fusebox_conformance::suite::{family_cases, FAMILIES};
use fusebox_conformance::{all_cases, coverage_gaps, run_cases, Case, CaseKind};
use fusebox_wgpu::WgpuBackend;

fn backend_or_skip() -> Option<WgpuBackend> {
    match WgpuBackend::new() {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var("FUSEBOX_REQUIRE_GPU_ADAPTER").is_ok_and(|v| v == "1") {
                panic!("FUSEBOX_REQUIRE_GPU_ADAPTER=1 but no wgpu adapter: {e}");
            }
            println!("skipped: no wgpu adapter ({e})");
            None
        }
    }
}

#[test]
fn wgpu_backend_passes_the_conformance_suite() {
    let Some(backend) = backend_or_skip() else { return };
    println!("backend: {}  adapter: {}", backend.name(), backend.adapter_info());
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    // Per op and per family: (cases run, cases that ran on the GPU path).
    let mut per_op: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut per_family: Vec<(&str, usize, usize)> = Vec::new();
    let mut on_gpu = 0;
    let mut total = 0;
    for &family in FAMILIES {
        let cases: Vec<Case<WgpuBackend>> = family_cases(family).unwrap_or_default();
        let mut fam = (family, 0, 0);
        for case in &cases {
            let before = backend.native_dispatches();
            let report = run_cases(&backend, std::slice::from_ref(case), None);
            let native = backend.native_dispatches() > before;
            failures.extend(report.failures);
            total += 1;
            fam.1 += 1;
            let e = per_op.entry(case.op.name()).or_default();
            e.0 += 1;
            // A bad-input case that ended in the CPU's error did no GPU work, and a
            // twin-vs-finite-differences case runs no backend op: neither counts.
            if native && backend.supports(case.op) && case.kind != CaseKind::TwinGradient {
                on_gpu += 1;
                fam.2 += 1;
                e.1 += 1;
            }
        }
        per_family.push(fam);
    }
    let cases = all_cases::<WgpuBackend>();
    let seconds = start.elapsed().as_secs_f64();
    for (op, (n, g)) in &per_op {
        println!("  {op:<28} {g:>4} of {n:>4} cases on the GPU path");
    }
    // Queries and transfers do no kernel work of their own.
    let no_kernel = [
        Op::Name,
        Op::Device,
        Op::Supports,
        Op::UsesDeviceStorage,
        Op::Upload,
        Op::ToHost,
        Op::SupportsCausalAttention,
    ];
    let missing: Vec<&str> = per_op
        .iter()
        .filter(|(op, (_, g))| {
            *g == 0 && Op::from_name(op).is_some_and(|o| backend.supports(o) && !no_kernel.contains(&o))
        })
        .map(|(op, _)| *op)
        .collect();
    for (family, n, g) in &per_family {
        println!("  family {family:<12} {g:>4} of {n:>4} cases on the GPU path");
    }
    println!("{on_gpu} cases ran on the GPU path (of {total}) in {seconds:.1}s");
    let gaps = coverage_gaps(&cases);
    for f in &failures {
        println!("FAILED: {f}");
    }
    println!("{} passed, {} failed", total - failures.len(), failures.len());
    assert!(gaps.is_empty(), "coverage gaps: {gaps:?}");
    assert!(failures.is_empty(), "{} conformance failures (listed above)", failures.len());
    assert!(missing.is_empty(), "native ops with no case on the GPU path: {missing:?}");
}

/// An op call on a backend, its tensors passed through `up` (an upload, or nothing).
type Call = Box<dyn Fn(&dyn ComputeBackend, &dyn Fn(&Tensor) -> Tensor) -> fusebox::Result<()>>;

fn call(f: impl Fn(&dyn ComputeBackend, &dyn Fn(&Tensor) -> Tensor) -> fusebox::Result<()> + 'static) -> Call {
    Box::new(f)
}

/// Invalid calls of the ops whose spec wgpu calls first return the CPU's error word for
/// word, whether the operands are on the device or the host (and a quantized weight is
/// `linear_forward`'s error, as on the CPU, not a detour to `quantized_matmul`).
#[test]
fn invalid_calls_return_the_cpu_error() {
    let Some(b) = backend_or_skip() else { return };
    let cpu = CpuBackend::new().expect("a CPU backend");
    let t = |dims: &[usize], dtype: DType| Tensor::zeros(dims.to_vec(), dtype).expect("a zero tensor");
    let (x, w) = (t(&[4, 3], DType::F32), t(&[5, 3], DType::F32));
    let (x32, q, ids, dy) =
        (t(&[2, 32], DType::F32), t(&[5, 32], DType::Q8_0), t(&[3], DType::U32), t(&[4, 4], DType::F32));
    let calls: Vec<(&str, Call)> = vec![
        ("matmul k", {
            let (x, w) = (x.clone(), w.clone());
            call(move |be, up| be.matmul(&up(&x), &up(&w), false, false).map(|_| ()))
        }),
        ("batched_matmul rank", {
            let (x, w) = (x.clone(), w.clone());
            call(move |be, up| be.batched_matmul(&up(&x), &up(&w), false, true).map(|_| ()))
        }),
        ("linear_forward quantized w", call(move |be, up| be.linear_forward(&up(&x32), &up(&q), None).map(|_| ()))),
        ("linear_backward d_out", {
            let (x, w) = (x.clone(), w.clone());
            call(move |be, up| be.linear_backward(&up(&x), &up(&w), &up(&dy), true).map(|_| ()))
        }),
        ("permute perm", {
            let x = x.clone();
            call(move |be, up| be.permute(&up(&x), &[1, 1]).map(|_| ()))
        }),
        ("transpose axis", {
            let x = x.clone();
            call(move |be, up| be.transpose(&up(&x), 0, 2).map(|_| ()))
        }),
        ("cast u32 to f16", {
            let ids = ids.clone();
            call(move |be, up| be.cast(&up(&ids), DType::F16).map(|_| ()))
        }),
        ("copy_into shape", {
            let (x, dst) = (x.clone(), t(&[3, 4], DType::F32));
            call(move |be, up| be.copy_into(&mut up(&dst), &up(&x)))
        }),
        ("fill u32", call(move |be, up| be.fill(&mut up(&ids), 1.0))),
        ("zeros blocks", call(|be, _| be.zeros(&Shape::new(vec![2, 33]), DType::Q8_0).map(|_| ()))),
        ("sum_to_shape target", call(move |be, up| be.sum_to_shape(&up(&x), &Shape::new(vec![3, 3])).map(|_| ()))),
    ];
    let on_host = |x: &Tensor| x.clone();
    let on_device = |x: &Tensor| b.upload(x).expect("upload");
    for (name, call) in &calls {
        let want = call(&cpu, &on_host).expect_err(name).to_string();
        let got = call(&b, &on_device).expect_err(name).to_string();
        assert_eq!(got, want, "{name}");
        let got = call(&b, &on_host).expect_err(name).to_string();
        assert_eq!(got, want, "{name} (host operands)");
    }
}
