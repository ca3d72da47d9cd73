//! `fusebox bench allreduce`: the communicator's in-place f32 all-reduce (sum) from 4 KiB
//! to 256 MiB, run under an MPI launcher (`mpirun -np N fusebox bench allreduce`).
//!
//! Reported as NCCL-tests and the OSU benchmarks do: the time of one all-reduce is the
//! slowest rank's mean over the timed iterations (each rank times the same iterations,
//! started together by a barrier); algorithm bandwidth `algbw = bytes / time`; bus
//! bandwidth `busbw = algbw · 2(n−1)/n`, the per-link traffic of a ring all-reduce, which
//! is comparable across rank counts and with the link's own bandwidth.

use std::time::Instant;

use clap::Args;
use fusebox::{Error, Result};
use fusebox_models::comm::ReduceOp;

use super::measure::{emit, Row};

#[derive(Args)]
pub struct AllReduceBenchArgs {
    /// Smallest message in bytes (multiples of 4: f32).
    #[arg(long, default_value_t = 4 << 10)]
    min_bytes: usize,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Each size is this factor times the previous.
    #[arg(long, default_value_t = 4)]
    factor: usize,
    /// Timed iterations of the smallest size; larger messages get fewer, down to 3.
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// One JSON object per size.
    #[arg(long)]
    json: bool,
}

/// Iterations for a message of `bytes`: about `iters` for small ones, ~64 MiB of traffic
/// per size for large ones, at least 3.
fn iterations(iters: usize, bytes: usize) -> usize {
    iters.min((64usize << 20) / bytes.max(1)).max(3)
}

pub fn run(args: &AllReduceBenchArgs) -> Result<()> {
    let bad = |flag: &str, expected: &str, got: usize| Err(Error::value("bench allreduce", flag, expected, got));
    if args.min_bytes < 4 || !args.min_bytes.is_multiple_of(4) {
        return bad("--min-bytes", "a positive multiple of 4", args.min_bytes);
    }
    if args.max_bytes < args.min_bytes {
        return bad("--max-bytes", "at least --min-bytes", args.max_bytes);
    }
    if args.factor < 2 {
        return bad("--factor", "at least 2", args.factor);
    }
    if args.iters == 0 {
        return bad("--iters", "at least 1", 0);
    }
    let comm = crate::comm::from_environment()?;
    let (rank, n) = (comm.rank(), comm.world_size());
    if rank == 0 && !args.json {
        println!("all-reduce (sum, f32, in place) over {n} rank(s); busbw = algbw · 2(n−1)/n");
        if n == 1 {
            println!("one rank: nothing is communicated; run it under `mpirun -np N`");
        }
    }
    let mut rows = Vec::new();
    let mut bytes = args.min_bytes;
    while bytes <= args.max_bytes {
        let mut buf = vec![1.0f32; bytes / 4];
        let iters = iterations(args.iters, bytes);
        comm.all_reduce(&mut buf, ReduceOp::Sum)?; // warm-up: connections, pinned pages
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        }
        let mut secs = [(t.elapsed().as_secs_f64() / iters as f64) as f32];
        comm.all_reduce(&mut secs, ReduceOp::Max)?;
        let s = f64::from(secs[0]);
        let algbw = bytes as f64 / s / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        rows.push(
            Row::new("allreduce")
                .set("bytes", bytes)
                .set("ranks", n)
                .set("iters", iters)
                .set_opt("us", Some(s * 1e6))
                .set_opt("algbw_gbs", Some(algbw))
                .set_opt("busbw_gbs", Some(busbw)),
        );
        bytes = match bytes.checked_mul(args.factor) {
            Some(b) => b,
            None => break,
        };
    }
    if rank == 0 {
        let columns = [
            ("bytes", "bytes"),
            ("ranks", "ranks"),
            ("iters", "iters"),
            ("time µs", "us"),
            ("algbw GB/s", "algbw_gbs"),
            ("busbw GB/s", "busbw_gbs"),
        ];
        emit(args.json, &columns, &rows);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::iterations;

    #[test]
    fn large_messages_get_fewer_iterations_but_at_least_three() {
        assert_eq!(iterations(100, 4096), 100);
        assert_eq!(iterations(100, 4 << 20), 16);
        assert_eq!(iterations(100, 256 << 20), 3);
    }
}
