//! Data-parallel training under `mpirun` (cargo feature `mpi`): 2 ranks × 1 thread train
//! with the same losses as 1 process with accumulation 2 — the addition task from
//! scratch, and fine-tuning the tiny Hugging Face llama of `fusebox-models/tests/fixtures/
//! arch/` with LoRA adapters and with every parameter; a 2-rank checkpoint resumes on 1
//! process with the same losses; a rank killed mid-run ends the job within seconds and the
//! last checkpoint loads. Skips, saying why, without the feature or without `mpirun`
//! (Debian: openmpi-bin libopenmpi-dev).

use std::process::Command;

#[cfg(feature = "mpi")]
mod fine_tune;

/// Why the MPI tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some("built without the `mpi` feature (cargo test -p fusebox-cli --features mpi --test mpi)".into());
    }
    match Command::new("mpirun").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("mpirun not found (apt-get install openmpi-bin libopenmpi-dev)".into()),
    }
}

#[test]
#[cfg_attr(not(feature = "mpi"), allow(clippy::single_match))]
fn two_ranks_train_like_one_process_with_accumulation_two() {
    match unavailable() {
        Some(why) => eprintln!("skipping: {why}"),
        None => {
            #[cfg(feature = "mpi")]
            with_mpi::parity();
        }
    }
}

#[test]
#[cfg_attr(not(feature = "mpi"), allow(clippy::single_match))]
fn two_ranks_train_a_mixture_of_experts_like_one_process() {
    match unavailable() {
        Some(why) => eprintln!("skipping: {why}"),
        None => {
            #[cfg(feature = "mpi")]
            with_mpi::moe_parity();
        }
    }
}

#[test]
#[cfg_attr(not(feature = "mpi"), allow(clippy::single_match))]
fn two_ranks_fine_tune_like_one_process_with_accumulation_two() {
    match unavailable() {
        Some(why) => eprintln!("skipping: {why}"),
        None => {
            #[cfg(feature = "mpi")]
            with_mpi::fine_tuning_parity();
        }
    }
}

#[test]
#[cfg_attr(not(feature = "mpi"), allow(clippy::single_match))]
fn zero_sharded_ranks_train_like_unsharded_and_resume_on_one_process() {
    match unavailable() {
        Some(why) => eprintln!("skipping: {why}"),
        None => {
            #[cfg(feature = "mpi")]
            with_mpi::zero_parity();
        }
    }
}

#[test]
#[cfg_attr(not(feature = "mpi"), allow(clippy::single_match))]
fn a_killed_rank_ends_the_job_and_the_last_checkpoint_loads() {
    match unavailable() {
        Some(why) => eprintln!("skipping: {why}"),
        None => {
            #[cfg(feature = "mpi")]
            with_mpi::killed_rank();
        }
    }
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use super::fine_tune::fusebox;

    /// `mpirun -np 2 fusebox …` (as root and on fewer cores than ranks, as CI runs).
    fn mpirun2() -> Command {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]);
        c.arg(env!("CARGO_BIN_EXE_fusebox"));
        c
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fusebox-mpi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[track_caller]
    fn assert_ok(o: &Output) {
        let t = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(o.status.success(), "status {:?}\nstdout: {}\nstderr: {}", o.status, t(&o.stdout), t(&o.stderr));
    }

    /// `(step, loss)` of every training row of `metrics.csv`.
    fn losses(out: &Path) -> Vec<(u64, f64)> {
        let text = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let c: Vec<&str> = l.split(',').collect();
                // Training rows have a learning rate; the final evaluation row does not.
                (!c[2].is_empty()).then(|| (c[0].parse().unwrap(), c[1].parse().unwrap()))
            })
            .collect()
    }

    #[track_caller]
    fn assert_same_losses(a: &[(u64, f64)], b: &[(u64, f64)]) {
        assert_losses_within(a, b, 1e-5);
    }

    #[track_caller]
    fn assert_losses_within(a: &[(u64, f64)], b: &[(u64, f64)], tolerance: f64) {
        assert_eq!(a.len(), b.len(), "{a:?}\n{b:?}");
        for (&(sa, la), &(sb, lb)) in a.iter().zip(b) {
            assert_eq!(sa, sb);
            let rel = (la - lb).abs() / la.abs().max(1e-30);
            assert!(rel <= tolerance, "step {sa}: loss {la} vs {lb} (relative {rel:.2e})");
        }
    }

    /// Steps of every parity run.
    const STEPS: &str = "50";

    /// The settings every parity run shares: 50 steps, 1 thread per process, no
    /// evaluation on the way, one JSON line.
    const COMMON: [&str; 9] = ["--steps", STEPS, "--threads", "1", "--eval-every", "0", "--seed", "7", "--json"];

    /// Runs `fusebox train ARGS` on 1 process with accumulation 2 into `dir/one` and on 2
    /// ranks (with `two_extra` besides) into `dir/two`; asserts both train 50 steps with
    /// losses within 1e-5 of each other (relative) and only rank 0 printed. Returns the
    /// 1-process losses and the 2-rank output directory.
    fn assert_two_ranks_match_accumulation(
        dir: &Path,
        args: &[&str],
        two_extra: &[&str],
    ) -> (Vec<(u64, f64)>, PathBuf) {
        assert_two_ranks_match_accumulation_within(dir, args, two_extra, 1e-5)
    }

    /// [`assert_two_ranks_match_accumulation`] with the losses within `tolerance`.
    fn assert_two_ranks_match_accumulation_within(
        dir: &Path,
        args: &[&str],
        two_extra: &[&str],
        tolerance: f64,
    ) -> (Vec<(u64, f64)>, PathBuf) {
        let (one, two) = (dir.join("one"), dir.join("two"));
        let o = fusebox().args(args).args(COMMON).args(["--accumulation", "2", "--out"]).arg(&one).output().unwrap();
        assert_ok(&o);
        let o = mpirun2().args(args).args(COMMON).args(two_extra).arg("--out").arg(&two).output().unwrap();
        assert_ok(&o);
        let reference = losses(&one);
        assert_eq!(reference.len(), 50);
        assert_losses_within(&losses(&two), &reference, tolerance);
        // Only rank 0 writes: one JSON line, one set of files.
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with('{')).count(), 1);
        assert!(two.join("loss.png").exists() && two.join("step-50").is_dir());
        (reference, two)
    }
    /// The step of the newest `step-N` directory in `out`.
    fn last_step(out: &Path) -> u64 {
        std::fs::read_dir(out)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
            .max()
            .unwrap()
    }

    /// The pid of the running `fusebox` process of MPI rank `rank` whose command line names `out`.
    fn rank_pid(rank: u32, out: &Path) -> Option<String> {
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        let out = out.to_str()?.as_bytes().to_vec();
        std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).find_map(
            |pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
                let names_out = cmdline.split(|&b| b == 0).any(|a| a == out.as_slice());
                let is_rank = env.split(|&b| b == 0).any(|kv| kv == want.as_bytes());
                (names_out && is_rank).then(|| pid.to_string())
            },
        )
    }

    pub fn parity() {
        let dir = temp_dir("parity");
        let run = ["train", "--batch", "16"];
        let (reference, two) = assert_two_ranks_match_accumulation(&dir, &run, &["--save-every", "25"]);
        assert!(two.join("step-25").is_dir());

        // The 2-rank checkpoint at step 25 on 1 process: accumulation 2 keeps the global
        // batch, and steps 26..50 repeat.
        let resumed = dir.join("resumed");
        let o = fusebox()
            .args(["train", "--threads", "1", "--json", "--resume"])
            .arg(two.join("step-25"))
            .arg("--out")
            .arg(&resumed)
            .output()
            .unwrap();
        assert_ok(&o);
        assert_same_losses(&losses(&resumed), &reference[25..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--zero 1` and `--zero 2` on 2 ranks (point-to-point reduce-scatter and all-gather): the
    /// losses of `--zero 0` within 1e-6 relative over 50 steps; the sharded checkpoint at
    /// step 25 resumes on 1 process (whole moments) with the same losses.
    pub fn zero_parity() {
        let dir = temp_dir("zero");
        let run = |out: &Path, zero: &str| {
            let o = mpirun2()
                .args(["train", "--batch", "16", "--zero", zero, "--save-every", "25"])
                .args(COMMON)
                .arg("--out")
                .arg(out)
                .output()
                .unwrap();
            assert_ok(&o);
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let plain = dir.join("zero0");
        run(&plain, "0");
        let reference = losses(&plain);
        assert_eq!(reference.len(), 50);
        for zero in ["1", "2"] {
            let out = dir.join(format!("zero{zero}"));
            let json = run(&out, zero);
            assert!(json.contains(&format!("\"zero\":{zero}")), "{json}");
            for (&(step, a), &(_, b)) in losses(&out).iter().zip(&reference) {
                let rel = (a - b).abs() / b.abs();
                assert!(rel <= 1e-6, "--zero {zero} step {step}: loss {a} vs {b} (relative {rel:.2e})");
            }
            let ckpt = out.join("step-25");
            for f in
                ["optimizer-shards.json", "optimizer-shard-0-of-2.safetensors", "optimizer-shard-1-of-2.safetensors"]
            {
                assert!(ckpt.join(f).is_file(), "{f}");
            }
        }
        let resumed = dir.join("resumed");
        let o = fusebox()
            .args(["train", "--threads", "1", "--json", "--resume"])
            .arg(dir.join("zero1/step-25"))
            .arg("--out")
            .arg(&resumed)
            .output()
            .unwrap();
        assert_ok(&o);
        assert_same_losses(&losses(&resumed), &reference[25..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Qwen3-MoE from scratch: the experts' gradients and each micro-batch's
    /// load-balancing loss are the same split over ranks as accumulated on one process.
    /// The ranks add the gradients in another order (the embedding rows after the
    /// averaged dense part), and top-k routing turns that f32 rounding into a different
    /// expert for a token at a near-tie: the losses agree to print precision for 48
    /// steps, then one such flip moves a step's loss by 7e-5. Hence 1e-3, not 1e-5.
    pub fn moe_parity() {
        let dir = temp_dir("moe");
        let args = ["train", "--arch", "qwen3_moe", "--batch", "16"];
        assert_two_ranks_match_accumulation_within(&dir, &args, &[], 1e-3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    pub fn fine_tuning_parity() {
        let dir = temp_dir("finetune");
        let (base, data) = (super::fine_tune::llama(), super::fine_tune::text_data(&dir));
        let run = ["train", "--init", &base, "--data", &data, "--batch", "4", "--seq", "16"];
        // LoRA: the adapters' gradients averaged after each backward.
        let lora = dir.join("lora");
        std::fs::create_dir_all(&lora).unwrap();
        let (_, two) = assert_two_ranks_match_accumulation(&lora, &[&run[..], &["--lora-rank", "8"]].concat(), &[]);
        let trainer = std::fs::read_to_string(two.join("step-50/trainer.json")).unwrap();
        assert!(trainer.contains("\"lora\"") && trainer.contains("\"world_size\": 2"), "{trainer}");
        // Every parameter: buckets averaged while the backward runs.
        let full = dir.join("full");
        std::fs::create_dir_all(&full).unwrap();
        assert_two_ranks_match_accumulation(&full, &run, &[]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    pub fn killed_rank() {
        use std::time::{Duration, Instant};
        let dir = temp_dir("kill");
        let out = dir.join("run");
        let mut job = mpirun2()
            .args(["train", "--steps", "100000", "--batch", "16", "--threads", "1", "--eval-every", "0"])
            .args(["--save-every", "5", "--json", "--out"])
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !out.join("step-10").is_dir() {
            assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint after 2 minutes");
            assert!(job.try_wait().unwrap().is_none(), "the job ended before its second checkpoint");
            std::thread::sleep(Duration::from_millis(50));
        }
        let victim = rank_pid(1, &out).expect("rank 1 of the job is running");
        let killed = Instant::now();
        assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
        let status = loop {
            if let Some(s) = job.try_wait().unwrap() {
                break s;
            }
            if killed.elapsed() > Duration::from_secs(30) {
                let _ = job.kill();
                panic!("the job still runs 30 s after rank 1 was killed");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = killed.elapsed();
        let o = job.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!status.success(), "the job exited 0 after a rank was killed");
        assert!(took < Duration::from_secs(10), "the job took {took:?} to end after rank 1 was killed");
        eprintln!("the job ended {took:?} after rank 1 was killed: {status}\n{err}");
        // The last complete checkpoint loads: one more step from it on 1 process.
        let o = fusebox()
            .args(["train", "--threads", "1", "--json", "--steps"])
            .arg(format!("{}", last_step(&out) + 1))
            .arg("--resume")
            .arg(&out)
            .output()
            .unwrap();
        assert_ok(&o);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
