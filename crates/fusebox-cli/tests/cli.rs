//! The `fusebox` binary end to end: every subcommand's happy path and its errors, and
//! the regressions of the careful-new-user report (bad flags, huge sizes, resumes that
//! overwrote other runs or lost checkpoints, signals). Every run is tiny and 1-threaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test: this build's, or `FUSEBOX_BIN` (to run the same checks
/// against another build, such as one from before a fix).
fn fusebox() -> Command {
    Command::new(std::env::var_os("FUSEBOX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusebox").into()))
}

fn run(args: &[&str]) -> Output {
    fusebox().args(args).output().expect("the fusebox binary runs")
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    fusebox().current_dir(dir).args(args).output().expect("the fusebox binary runs")
}

/// A fresh, empty directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "fusebox-cli-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "status {:?}\nstdout: {}\nstderr: {}", o.status, text(&o.stdout), text(&o.stderr));
}

/// Exit status 1 with one `error:` line that contains `needle`: no panic, no signal.
#[track_caller]
fn assert_error(o: &Output, needle: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stdout: {}\nstderr: {err}", text(&o.stdout));
    assert!(err.contains("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

fn json_of(o: &Output) -> Value {
    let out = text(&o.stdout);
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON line in: {out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// A tiny model: trains a step in milliseconds.
const TINY: &[&str] = &[
    "train",
    "--layers",
    "1",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--batch",
    "4",
    "--threads",
    "1",
    "--eval-every",
    "0",
];

fn train(out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&str> = TINY.to_vec();
    let out = out.to_str().unwrap();
    args.extend(["--out", out]);
    args.extend(extra);
    run(&args)
}

/// Resumes `dir` with small settings (no model-shape flags).
fn resume(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train", "--threads", "1", "--resume", dir.to_str().unwrap()];
    args.extend(extra);
    run(&args)
}

fn latest(out: &Path) -> String {
    std::fs::read_to_string(out.join("latest")).unwrap().trim().to_string()
}

fn metrics_rows(out: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(out.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// Steps of the per-step rows (those with a learning rate), in file order.
fn train_steps(out: &Path) -> Vec<u64> {
    metrics_rows(out).iter().filter(|r| !r[2].is_empty()).map(|r| r[0].parse().unwrap()).collect()
}

fn leftovers(out: &Path) -> Vec<String> {
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.ends_with(".old"))
        .collect()
}

// ---- info ----

#[test]
fn info_prints_text_and_json() {
    let o = run(&["info"]);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("backends compiled in"), "{}", text(&o.stdout));
    let o = run(&["info", "--json"]);
    assert_ok(&o);
    let v = json_of(&o);
    assert!(v["cpu"]["threads"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn unknown_flags_and_subcommands_are_usage_errors() {
    for args in [&["info", "--bogus"][..], &["frobnicate"], &["train", "--steps", "many"], &["train", "--lr"]] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(!text(&o.stderr).contains("panicked"), "{args:?}");
    }
}

// ---- demo ----

#[test]
fn demo_runs_a_small_attention() {
    let o = run(&["demo", "--seq", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "16"]);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("all finite: true"), "{}", text(&o.stdout));
}

#[test]
fn demo_refuses_bad_sizes() {
    assert_error(&run(&["demo", "--seq", "0"]), "--seq");
    assert_error(&run(&["demo", "--heads", "0"]), "--heads");
    assert_error(&run(&["demo", "--heads", "3", "--kv-heads", "2"]), "--kv-heads");
    assert_error(&run(&["demo", "--seq", "100000000000"]), "--seq × --heads × --head-dim");
    assert_error(&run(&["demo", "--seq", "16", "--backend", "nosuch"]), "unknown backend");
}

// ---- train ----

#[test]
fn train_happy_path_then_generate_from_its_checkpoint() {
    let out = temp_dir("happy");
    let o = train(&out, &["--steps", "3", "--json"]);
    assert_ok(&o);
    let v = json_of(&o);
    assert_eq!(v["steps"], 3, "{v}");
    assert_eq!(v["interrupted"], false, "{v}");
    assert_eq!(latest(&out), "step-3");
    assert!(out.join("loss.png").is_file());
    assert_eq!(train_steps(&out), vec![1, 2, 3]);

    let model = out.to_str().unwrap();
    let o = run(&["generate", "--model", model, "--prompt", "12+34=", "--max-tokens", "4", "--threads", "1", "--json"]);
    assert_ok(&o);
    assert!(json_of(&o)["generated_ids"].as_array().is_some());
    let o = run(&["generate", "--model", model, "--prompt", "1+1=", "--max-tokens", "3", "--threads", "1"]);
    assert_ok(&o);
    assert!(text(&o.stdout).starts_with("1+1="), "{}", text(&o.stdout));
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn train_text_data_happy_path() {
    let dir = temp_dir("text");
    let data = dir.join("data.txt");
    std::fs::write(&data, "the quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    let out = dir.join("run");
    let o = train(&out, &["--steps", "2", "--seq", "16", "--data", data.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    assert!(json_of(&o)["accuracy"].is_null());
    let o =
        run(&["train", "--data", dir.join("missing.txt").to_str().unwrap(), "--out", dir.join("r2").to_str().unwrap()]);
    assert_error(&o, "missing.txt");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_hyper_parameters_are_refused_naming_the_flag() {
    let out = temp_dir("badflags");
    let cases: &[(&[&str], &str)] = &[
        (&["--lr", "-1"], "--lr"),
        (&["--lr", "nan"], "--lr"),
        (&["--lr", "0"], "--lr"),
        (&["--lr", "inf"], "--lr"),
        (&["--clip", "nan"], "--clip"),
        (&["--clip", "-1"], "--clip"),
        (&["--weight-decay", "-0.5"], "--weight-decay"),
        (&["--time-limit", "nan"], "--time-limit"),
        (&["--time-limit", "-1"], "--time-limit"),
        (&["--batch", "0"], "--batch"),
        (&["--accumulation", "0"], "--accumulation"),
        (&["--seq", "0"], "--seq"),
        (&["--preset", "gpt5"], "preset"),
        (&["--heads", "3"], "n_heads"),
        (&["--threads", "0"], "--threads"),
    ];
    let r = out.join("r");
    for (extra, needle) in cases {
        let o = run(&[&["train", "--steps", "1", "--out", r.to_str().unwrap()], *extra].concat());
        assert_error(&o, needle);
    }
    // Nothing was written by a refused run.
    assert!(!out.join("r").exists());
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn huge_sizes_are_refused_with_the_memory_figure_before_allocating() {
    let out = temp_dir("huge");
    let r = out.join("r");
    let r = r.to_str().unwrap();
    let data = out.join("data.txt");
    std::fs::write(&data, "x".repeat(100_000)).unwrap();
    let data = data.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--d-model", "100000", "--heads", "1"], "memory"),
        (&["--batch", "1000000000"], "memory"),
        (&["--layers", "1000000000"], "memory"),
        (&["--layers", "18446744073709551615"], "sizes"),
        (&["--seq", "1000000000", "--data", data], "too short"),
        (&["--seq", "5000", "--batch", "10000000", "--data", data], "memory"),
    ];
    for (extra, needle) in cases {
        let start = Instant::now();
        let o = run(&[&["train", "--threads", "1", "--steps", "1", "--out", r], *extra].concat());
        assert_error(&o, needle);
        assert!(start.elapsed() < Duration::from_secs(20), "{extra:?} took {:?}", start.elapsed());
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn resume_validates_batch_and_accumulation() {
    let out = temp_dir("resume-zero");
    assert_ok(&train(&out, &["--steps", "2"]));
    assert_error(&resume(&out, &["--steps", "4", "--batch", "0"]), "--batch");
    assert_error(&resume(&out, &["--steps", "4", "--accumulation", "0"]), "--accumulation");
    assert_error(&resume(&out, &["--steps", "4", "--lr", "-1"]), "--lr");
    assert_error(&resume(&out, &["--steps", "4", "--layers", "3"]), "--layers");
    assert_error(&resume(&out, &["--steps", "4", "--batch", "1000000000"]), "memory");
    assert_error(&resume(&out.join("nosuch"), &[]), "no such checkpoint");
    // The run is untouched by the refused resumes.
    assert_eq!(latest(&out), "step-2");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_fresh_run_refuses_a_non_empty_out_unless_overwrite() {
    let out = temp_dir("overwrite");
    assert_ok(&train(&out, &["--steps", "3"]));
    let o = train(&out, &["--steps", "2"]);
    assert_error(&o, "--overwrite");
    assert_eq!(latest(&out), "step-3");
    assert_eq!(train_steps(&out), vec![1, 2, 3]);
    // --overwrite replaces the run: the old checkpoints and metrics are gone.
    let keep = out.join("notes.txt");
    std::fs::write(&keep, "mine").unwrap();
    assert_ok(&train(&out, &["--steps", "2", "--overwrite"]));
    assert_eq!(latest(&out), "step-2");
    assert!(!out.join("step-3").exists());
    assert_eq!(train_steps(&out), vec![1, 2]);
    assert!(keep.is_file(), "files the run did not write are left alone");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn resume_writes_into_the_directory_it_came_from() {
    let cwd = temp_dir("resume-where");
    let a = cwd.join("a");
    let b = cwd.join("b");
    assert_ok(&train(&a, &["--steps", "2"]));
    assert_ok(&train(&b, &["--steps", "2"]));
    let a_metrics = std::fs::read_to_string(a.join("metrics.csv")).unwrap();
    // From the run directory, and from one of its step directories.
    let o = run_in(&cwd, &["train", "--threads", "1", "--resume", "b", "--steps", "3"]);
    assert_ok(&o);
    let o = run_in(&cwd, &["train", "--threads", "1", "--resume", "b/step-3", "--steps", "4"]);
    assert_ok(&o);
    assert!(!cwd.join("runs").exists(), "nothing written to the default runs/addition");
    assert_eq!(latest(&b), "step-4");
    assert_eq!(train_steps(&b), vec![1, 2, 3, 4]);
    assert_eq!(std::fs::read_to_string(a.join("metrics.csv")).unwrap(), a_metrics, "run a untouched");
    // A fork into another run's directory is refused; into a new one it is allowed.
    let o = run(&[
        "train",
        "--threads",
        "1",
        "--resume",
        b.to_str().unwrap(),
        "--out",
        a.to_str().unwrap(),
        "--steps",
        "5",
    ]);
    assert_error(&o, "--out");
    let c = cwd.join("c");
    let o = run(&[
        "train",
        "--threads",
        "1",
        "--resume",
        b.to_str().unwrap(),
        "--out",
        c.to_str().unwrap(),
        "--steps",
        "5",
    ]);
    assert_ok(&o);
    assert_eq!(latest(&c), "step-5");
    assert_eq!(latest(&b), "step-4");
    std::fs::remove_dir_all(&cwd).unwrap();
}

#[test]
fn a_last_step_that_is_also_a_save_step_is_saved_once_and_whole() {
    let out = temp_dir("laststep");
    assert_ok(&train(&out, &["--steps", "4", "--save-every", "2"]));
    assert_eq!(latest(&out), "step-4");
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    assert!(fusebox_models::checkpoint::is_complete(&out.join("step-4")));
    assert!(fusebox_models::checkpoint::is_complete(&out.join("step-2")));
    // Resuming with --steps at or below the checkpoint's step trains nothing and writes nothing.
    let before = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    let o = resume(&out, &["--steps", "4"]);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("nothing to train"), "{}", text(&o.stdout));
    let o = resume(&out, &["--steps", "3", "--json"]);
    assert_ok(&o);
    assert_eq!(json_of(&o)["trained_steps"], 0);
    assert_eq!(std::fs::read_to_string(out.join("metrics.csv")).unwrap(), before);
    assert_eq!(latest(&out), "step-4");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn stale_tmp_directories_are_recovered_or_removed_on_start() {
    let out = temp_dir("stale");
    assert_ok(&train(&out, &["--steps", "2", "--save-every", "1"]));
    // What the earlier save order left when killed at the last step: `latest → step-2`
    // holding only JSON files, the whole copy stranded in step-2.tmp.
    std::fs::rename(out.join("step-2"), out.join("step-2.tmp")).unwrap();
    std::fs::create_dir_all(out.join("step-2")).unwrap();
    std::fs::copy(out.join("step-2.tmp/config.json"), out.join("step-2/config.json")).unwrap();
    // And an incomplete save of a later step.
    std::fs::create_dir_all(out.join("step-3.tmp")).unwrap();
    std::fs::write(out.join("step-3.tmp/model.safetensors"), b"partial").unwrap();
    let o = resume(&out, &["--steps", "3"]);
    assert_ok(&o);
    let err = text(&o.stderr);
    assert!(err.contains("recovered step-2 from step-2.tmp"), "{err}");
    assert!(err.contains("step-3.tmp"), "{err}");
    assert!(text(&o.stdout).contains("at step 2"), "{}", text(&o.stdout));
    assert_eq!(latest(&out), "step-3");
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_resume_after_a_kill_keeps_the_schedule_and_has_no_duplicate_metrics() {
    let out = temp_dir("killed");
    let o = train(&out, &["--steps", "6", "--save-every", "3", "--warmup", "2", "--lr", "0.01"]);
    assert_ok(&o);
    let full = metrics_rows(&out);
    // As if killed after step 5 (rows 4 and 5 written, step-3 the last checkpoint).
    std::fs::write(out.join("latest"), "step-3\n").unwrap();
    std::fs::remove_dir_all(out.join("step-6")).unwrap();
    let lines: Vec<String> =
        std::fs::read_to_string(out.join("metrics.csv")).unwrap().lines().map(String::from).collect();
    std::fs::write(out.join("metrics.csv"), lines[..6].join("\n") + "\n").unwrap();
    // Resumed without --steps or --lr: the saved schedule (6 steps, lr 0.01, warmup 2) holds.
    let o = resume(&out, &["--json"]);
    assert_ok(&o);
    assert_eq!(json_of(&o)["steps"], 6);
    assert_eq!(train_steps(&out), vec![1, 2, 3, 4, 5, 6], "no duplicate rows for the redone steps");
    let lr = |rows: &[Vec<String>]| rows.iter().filter(|r| !r[2].is_empty()).map(|r| r[2].clone()).collect::<Vec<_>>();
    assert_eq!(lr(&metrics_rows(&out)), lr(&full), "the learning rates of the redone steps");
    // An explicit --steps overrides the schedule, and says so.
    let o = resume(&out, &["--steps", "8"]);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("--steps 8 (saved 6)"), "{}", text(&o.stdout));
    std::fs::remove_dir_all(&out).unwrap();
}

/// Starts a long tiny run and waits until it has written `rows` metrics rows.
fn start_long_run(out: &Path, extra: &[&str]) -> std::process::Child {
    let mut args: Vec<&str> = TINY.to_vec();
    args.extend(["--steps", "1000000", "--out", out.to_str().unwrap()]);
    args.extend(extra);
    let child = fusebox().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(out.join("metrics.csv")).map_or(0, |t| t.lines().count()) < 3 {
        assert!(start.elapsed() < Duration::from_secs(60), "the run wrote no metrics");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn signal(child: &std::process::Child, sig: &str) {
    let ok = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
}

#[test]
fn sigterm_saves_and_exits_cleanly_like_ctrl_c() {
    for sig in ["-TERM", "-INT"] {
        let out = temp_dir("sigterm");
        let child = start_long_run(&out, &["--json"]);
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        assert_ok(&o);
        let v = json_of(&o);
        assert_eq!(v["interrupted"], true, "{sig}: {v}");
        let step = v["steps"].as_u64().unwrap();
        assert_eq!(latest(&out), format!("step-{step}"), "{sig}");
        assert!(fusebox_models::checkpoint::is_complete(&out.join(format!("step-{step}"))));
        // The JSON object is the only stdout.
        assert_eq!(text(&o.stdout).trim().lines().count(), 1, "{}", text(&o.stdout));
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn a_time_limit_at_a_save_step_saves_once() {
    let out = temp_dir("timelimit");
    let o = train(&out, &["--steps", "1000000", "--save-every", "1", "--time-limit", "0.2", "--json"]);
    assert_ok(&o);
    let v = json_of(&o);
    let step = v["steps"].as_u64().unwrap();
    assert_eq!(latest(&out), format!("step-{step}"));
    assert!(leftovers(&out).is_empty());
    std::fs::remove_dir_all(&out).unwrap();
}

// ---- generate ----

#[test]
fn generate_errors_are_clear() {
    let out = temp_dir("generate");
    assert_ok(&train(&out, &["--steps", "1"]));
    let m = out.to_str().unwrap();
    assert_error(&run(&["generate", "--model", out.join("nosuch").to_str().unwrap()]), "no such checkpoint");
    assert_error(&run(&["generate", "--model", m, "--temperature", "-1"]), "--temperature");
    assert_error(&run(&["generate", "--model", m, "--temperature", "nan"]), "--temperature");
    assert_error(&run(&["generate", "--model", m, "--top-p", "0"]), "--top-p");
    assert_error(&run(&["generate", "--model", m, "--repetition-penalty", "0"]), "--repetition-penalty");
    assert_error(&run(&["generate", "--model", m, "--ctx-size", "0"]), "--ctx-size");
    assert_error(&run(&["generate", "--model", m, "--prompt", "hello"]), "prompt character");
    let gguf = out.join("bad.gguf");
    std::fs::write(&gguf, b"not a gguf file at all").unwrap();
    let o = run(&["generate", "--model", gguf.to_str().unwrap(), "--ctx-size", "4294967295"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&out).unwrap();
}

// ---- bench ----

#[test]
fn bench_subcommands_run_small_cases() {
    let o = run(&["bench", "matmul", "--m", "16", "--n", "16", "--k", "16", "--threads", "1", "--json"]);
    assert_ok(&o);
    assert!(text(&o.stdout).contains("matmul/16x16x16"), "{}", text(&o.stdout));
    let o = run(&["bench", "attention", "--seq", "32", "--heads", "2", "--head-dim", "16", "--threads", "1", "--json"]);
    assert_ok(&o);
    let o = run(&["bench", "ops", "--only", "rms_norm", "--rows", "8", "--threads", "1", "--json"]);
    assert_ok(&o);
    let o = run(&[
        "bench",
        "train",
        "--preset",
        "tiny-llama",
        "--batch",
        "1",
        "--seq",
        "8",
        "--steps",
        "1",
        "--threads",
        "1",
        "--json",
    ]);
    assert_ok(&o);
}

#[test]
fn bench_errors_are_clear() {
    assert_error(&run(&["bench", "matmul", "--m", "0"]), "--m");
    assert_error(&run(&["bench", "attention", "--seq", "0"]), "");
    assert_error(&run(&["bench", "train", "--batch", "0", "--preset", "tiny-llama"]), "batch");
    assert_error(&run(&["bench", "train", "--preset", "nosuch"]), "preset");
    assert_error(&run(&["bench", "generate", "--model", "/nonexistent/model.gguf"]), "nonexistent");
    assert_eq!(run(&["bench", "ops", "--rows", "1"]).status.code(), Some(2));
}

#[test]
fn generate_from_an_addition_checkpoint_needs_a_prompt() {
    let out = temp_dir("noprompt");
    assert_ok(&train(&out, &["--steps", "1"]));
    assert_error(&run(&["generate", "--model", out.to_str().unwrap(), "--threads", "1"]), "12+34=");
    std::fs::remove_dir_all(&out).unwrap();
}
