//! Decode GEMV (`quantized_matmul` with one x row) per block format: the integer path
//! (x rounded to 8 bits, `CpuBackend::builder().exact_decode(false)`) against the
//! f32-activation path (the default), same threads, same run, interleaved.
//!
//! ```text
//! cargo run --release -p fusebox-bench --bin decode_gemv -- [THREADS] [REPS] [SHAPES] [FORMATS]
//! ```
//!
//! SHAPES: `OUTxIN` pairs, comma-separated (e.g. `262144x640` for Gemma 3's head);
//! FORMATS: format names (e.g. `q8_0,q5_0`). Both default to the lists below.
//!
//! Prints per format and shape W `[out, in]`: the median time of each path, the weight
//! bandwidth it reaches (W bytes / time) and the speedup of the integer path.

use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, DType, Error, Result, Tensor};

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

/// Median seconds of `reps` calls of each backend, alternating calls so both see the
/// same machine state.
fn time_pair(backends: [&CpuBackend; 2], x: &Tensor, w: &Tensor, reps: usize) -> Result<[f64; 2]> {
    let mut times = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
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
    Ok(times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    }))
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
    let int = CpuBackend::builder().threads(threads).exact_decode(false).build()?;
    let exact = CpuBackend::builder().threads(threads).exact_decode(true).build()?;
    println!("decode GEMV, {threads} threads, median of {reps}; GB/s = W bytes / time");
    println!(
        "{:<7} {:>13} {:>10} {:>8} {:>10} {:>8} {:>7}",
        "format", "W [out, in]", "f32 x µs", "GB/s", "int8 x µs", "GB/s", "ratio"
    );
    for &dtype in &formats {
        for &[n, k] in &shapes {
            // K formats need whole super-blocks of 256: 576 becomes 768.
            let k = k.next_multiple_of(dtype.block_elems());
            let w = int.quantize(&Tensor::from_vec(values(n * k, 7), [n, k])?, dtype)?;
            let x = Tensor::from_vec(values(k, 3), [1, k])?;
            let reps = if n > 10_000 { reps / 4 } else { reps }.max(5);
            let [t_int, t_exact] = time_pair([&int, &exact], &x, &w, reps)?;
            let gb = dtype.storage_bytes(n * k) as f64 / 1e9;
            println!(
                "{:<7} {:>13} {:>10.1} {:>8.1} {:>10.1} {:>8.1} {:>6.2}×",
                dtype.to_string(),
                format!("[{n}, {k}]"),
                t_exact * 1e6,
                gb / t_exact,
                t_int * 1e6,
                gb / t_int,
                t_exact / t_int
            );
        }
    }
    Ok(())
}
