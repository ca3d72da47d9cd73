//! Adapter limits: a tensor beyond `max_buffer_size` is a clear error naming the
//! limit; tables beyond one storage binding (lavapipe: 128 MiB, smaller than GPT-2's
//! token embedding) are gathered and multiplied block by block, matching the CPU.
//!
//! Without an adapter the tests print why and pass, unless
//! `FUSEBOX_REQUIRE_GPU_ADAPTER=1` (CI), where they fail.

use fusebox::{ComputeBackend, CpuBackend, DType, Shape, Tensor};
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

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, seed: u64) -> Vec<f32> {
    fusebox::rng::Rng::new(seed).uniform_vec(n, -0.5, 0.5)
}

#[test]
fn a_tensor_beyond_the_largest_buffer_is_an_error_naming_the_limit() {
    let Some(b) = backend_or_skip() else { return };
    // 2^31 f32 elements = 8 GiB: beyond lavapipe's max_buffer_size (and most GPUs').
    let e = b.zeros(&Shape::new(vec![1 << 31]), DType::F32).unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains("max_buffer_size"), "{e}");
    // The backend still works afterwards.
    let x = b.upload(&Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap()).unwrap();
    let y = b.add(&x, &x).unwrap();
    assert_eq!(b.to_host(&y).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn tables_beyond_one_binding_are_split_into_row_blocks() {
    let Some(b) = backend_or_skip() else { return };
    let cpu = CpuBackend::new().unwrap();
    println!("{}", b.limits_summary());
    // 36,000 × 1,024 f32 = 147 MB (> 128 MiB), like GPT-2's 50,257 × 768 embedding.
    let (vocab, d) = (36_000usize, 1_024usize);
    let table = Tensor::from_vec(values(vocab * d, 7), [vocab, d]).unwrap();
    let table_gpu = b.upload(&table).unwrap();
    let ids = Tensor::from_vec(vec![0u32, 1, 17_000, 35_999, 20_000, 3], [2, 3]).unwrap();
    let want = cpu.embedding(&ids, &table).unwrap();
    let got = b.to_host(&b.embedding(&b.upload(&ids).unwrap(), &table_gpu).unwrap()).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());

    // The tied lm head: logits = x · tableᵀ over every row block.
    let x = Tensor::from_vec(values(2 * d, 9), [2, d]).unwrap();
    let want = cpu.linear_forward(&x, &table, None).unwrap().to_vec::<f32>().unwrap();
    let got = b.linear_forward(&b.upload(&x).unwrap(), &table_gpu, None).unwrap();
    let got = b.to_host(&got).unwrap().to_vec::<f32>().unwrap();
    let worst = want.iter().zip(&got).map(|(w, g)| (w - g).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "largest difference {worst}");
}

#[test]
fn f16_tables_that_widen_beyond_one_binding_are_converted_in_pieces() {
    let Some(b) = backend_or_skip() else { return };
    let cpu = CpuBackend::new().unwrap();
    // 36,000 × 1,024 f16 = 74 MB fits one binding; widened to f32 (147 MB) it does not.
    let (vocab, d) = (36_000usize, 1_024usize);
    let table = Tensor::from_f32_as(&values(vocab * d, 11), [vocab, d], DType::F16).unwrap();
    let table_gpu = b.upload(&table).unwrap();
    let ids = Tensor::from_vec(vec![0u32, 1, 17_000, 35_999, 20_000, 3], [2, 3]).unwrap();
    let want = cpu.embedding(&ids, &table).unwrap();
    let got = b.to_host(&b.embedding(&b.upload(&ids).unwrap(), &table_gpu).unwrap()).unwrap();
    assert_eq!(got.dtype(), DType::F16);
    assert_eq!(got.host_bytes().unwrap(), want.host_bytes().unwrap());

    // The tied lm head in f16: the weight is widened piece by piece, then multiplied by
    // row blocks; the logits come back in f16.
    let x = Tensor::from_f32_as(&values(2 * d, 13), [2, d], DType::F16).unwrap();
    let want = cpu.linear_forward(&x, &table, None).unwrap().to_vec_f32().unwrap();
    let got = b.to_host(&b.linear_forward(&b.upload(&x).unwrap(), &table_gpu, None).unwrap()).unwrap();
    assert_eq!(got.dtype(), DType::F16);
    let got = got.to_vec_f32().unwrap();
    let worst = want.iter().zip(&got).map(|(w, g)| (w - g).abs() / (1.0 + w.abs())).fold(0.0f32, f32::max);
    assert!(worst < 4e-3, "largest difference {worst}");
}
