//! Decode GEMV (`quantized_matmul` with one x row) per block format: the integer path
//! (x rounded to 8 bits, `CpuBackend::builder().exact_decode(false)`) against the
//! f32-activation path (the default), same threads, same run, interleaved. Where the CPU
//! has AVX-512 the integer path also runs with the AVX2 kernels (`isa(Isa::Avx2)`), so
//! the AVX-512 VNNI kernels are seen against them.
//!
//! ```text
//! cargo run --release -p fusebox-bench --bin decode_gemv -- [THREADS] [REPS] [SHAPES] [FORMATS]
//! ```
//!
//! SHAPES: `OUTxIN` pairs, comma-separated (e.g. `262144x640` for Gemma 3's head);
//! FORMATS: format names (e.g. `q8_0,q5_0`). Both default to the lists below.
//!
//! Prints per format and shape W `[out, in]`: the median time of each path, the weight
//! bandwidth it reaches (W bytes / time) and the speedup of the integer path (the best
//! ISA's) over the f32 path. A W larger than the L3 (e.g. `65536x2048`) streams from DRAM.

use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, DType, Error, Isa, Result, Tensor};

/// W shapes `[out, in]`: SmolLM2-135M's MLP up (576 → 1536), down (1536 → 576) and the
/// LM head (576 → 49152); `in` rounded up to whole blocks (768 for the K formats).
const SHAPES: [[usize; 2]; 3] = [[1536, 576], [576, 1536], [49152, 576]];
const FORMATS: [DType; 9] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::IQ4NL,
    DType::MXFP4,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as f32 / u32::MAX as f32 - 0.5
        })
        .collect()
}

/// Median seconds of `reps` calls of each backend, alternating calls so all see the
/// same machine state.
fn time_each(backends: &[&CpuBackend], x: &Tensor, w: &Tensor, reps: usize) -> Result<Vec<f64>> {
    let mut times = vec![Vec::with_capacity(reps); backends.len()];
    for b in backends {
        b.quantized_matmul(x, w)?; // warm up
    }
    for _ in 0..reps {
        for (t, b) in times.iter_mut().zip(backends) {
            let start = Instant::now();
            std::hint::black_box(b.quantized_matmul(x, w)?);
            t.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let threads = args.next().and_then(|a| a.parse().ok()).unwrap_or(2usize);
    let reps = args.next().and_then(|a| a.parse().ok()).unwrap_or(200usize);
    let shapes: Vec<[usize; 2]> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|s| {
                let (n, k) = s.split_once('x').ok_or_else(|| Error::value("decode_gemv", "a shape", "OUTxIN", s))?;
                let dim = |d: &str| d.parse().map_err(|_| Error::value("decode_gemv", "a dimension", "a number", d));
                Ok([dim(n)?, dim(k)?])
            })
            .collect::<Result<_>>()?,
        None => SHAPES.to_vec(),
    };
    let formats: Vec<DType> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|f| {
                FORMATS.iter().copied().find(|d| d.name() == f).ok_or_else(|| {
                    Error::value(
                        "decode_gemv",
                        "a format",
                        "q8_0, q4_0, q4_1, q5_0, iq4_nl, mxfp4, q4_k, q5_k or q6_k",
                        f,
                    )
                })
            })
            .collect::<Result<_>>()?,
        None => FORMATS.to_vec(),
    };
    let exact = CpuBackend::builder().threads(threads).exact_decode(true).build()?;
    let int = CpuBackend::builder().threads(threads).exact_decode(false).build()?;
    // The AVX2 integer kernels beside the AVX-512 ones, where both run here.
    let int_avx2 = if int.isa() == Isa::Avx512 {
        Some(CpuBackend::builder().threads(threads).isa(Isa::Avx2).exact_decode(false).build()?)
    } else {
        None
    };
    let int_name = format!("int8 {}", int.isa().name());
    println!("decode GEMV, {threads} threads, median of {reps}; GB/s = W bytes / time");
    print!("{:<7} {:>14} {:>10} {:>7}", "format", "W [out, in]", "f32 x µs", "GB/s");
    if int_avx2.is_some() {
        print!(" {:>14} {:>7}", "int8 avx2 µs", "GB/s");
    }
    println!(" {:>14} {:>7} {:>7}", format!("{int_name} µs"), "GB/s", "ratio");
    for &dtype in &formats {
        for &[n, k] in &shapes {
            // K formats need whole super-blocks of 256: 576 becomes 768.
            let k = k.next_multiple_of(dtype.block_elems());
            let w = int.quantize(&Tensor::from_vec(values(n * k, 7), [n, k])?, dtype)?;
            let x = Tensor::from_vec(values(k, 3), [1, k])?;
            let reps = if n * k > 10_000_000 { reps / 4 } else { reps }.max(5);
            let mut backends = vec![&exact, &int];
            backends.extend(int_avx2.as_ref());
            let t = time_each(&backends, &x, &w, reps)?;
            let gb = dtype.storage_bytes(n * k) as f64 / 1e9;
            print!("{:<7} {:>14} {:>10.1} {:>7.1}", dtype.to_string(), format!("[{n}, {k}]"), t[0] * 1e6, gb / t[0]);
            if let Some(&t_avx2) = t.get(2) {
                print!(" {:>14.1} {:>7.1}", t_avx2 * 1e6, gb / t_avx2);
            }
            println!(" {:>14.1} {:>7.1} {:>6.2}×", t[1] * 1e6, gb / t[1], t[0] / t[1]);
        }
    }
    Ok(())
}
