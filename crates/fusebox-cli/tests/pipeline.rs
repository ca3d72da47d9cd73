//! One model over two MPI ranks (`mpirun -np 2 fusebox generate|chat …`, cargo feature
//! `mpi`): greedy tokens identical to one process for SmolLM2 and Gemma 3, each rank
//! holding a part of the model; the same under a memory cap one process does not fit;
//! `--layer-split` and bad splits; the chat over a pipe; a killed rank ends the job
//! within seconds. Skips, saying why, without the feature, `mpirun` or the models
//! (scripts/fetch-smollm2.sh, scripts/fetch-gemma3.sh).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some(
            "built without the `mpi` feature (cargo test -p fusebox-cli --features mpi --test pipeline)".into(),
        );
    }
    match Command::new("mpirun").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("mpirun not found (apt-get install openmpi-bin libopenmpi-dev)".into()),
    }
}

fn model(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not found (scripts/fetch-smollm2.sh, scripts/fetch-gemma3.sh)", p.display());
        None
    }
}

fn fusebox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fusebox"))
}

/// `mpirun -np N fusebox …` (as root and on fewer cores than ranks, as CI runs).
fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", &n.to_string()]);
    c.arg(env!("CARGO_BIN_EXE_fusebox"));
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "status {:?}\nstdout: {}\nstderr: {}", o.status, text(&o.stdout), text(&o.stderr));
    let line = text(&o.stdout).lines().rev().find(|l| l.starts_with('{')).map(str::to_string);
    serde_json::from_str(&line.unwrap_or_else(|| panic!("no JSON line in {}", text(&o.stdout)))).unwrap()
}

const GREEDY: [&str; 10] =
    ["--temperature", "0", "--max-tokens", "24", "--threads", "1", "--json", "--ctx-size", "256", "--prompt"];
const PROMPT: &str = "The capital of France is Paris, and the capital of Germany is";

/// Greedy generation of `file` on one process and on two ranks; asserts the same tokens
/// and returns (one process's peak resident bytes, each rank's).
fn same_tokens_on_two_ranks(file: &Path, extra: &[&str]) -> (u64, Vec<u64>) {
    let one = json_of(&fusebox().arg("generate").arg("--model").arg(file).args(GREEDY).arg(PROMPT).output().unwrap());
    let two = json_of(
        &mpirun(2).arg("generate").arg("--model").arg(file).args(GREEDY).arg(PROMPT).args(extra).output().unwrap(),
    );
    assert_eq!(two["generated_ids"], one["generated_ids"], "{}", file.display());
    let ranks = two["pipeline"]["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    let peaks = ranks.iter().map(|r| r["peak_resident_bytes"].as_u64().unwrap()).collect();
    (one["peak_resident_bytes"].as_u64().unwrap(), peaks)
}

#[test]
fn two_ranks_generate_one_processs_tokens_each_holding_part_of_the_model() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    // Measured: SmolLM2 0.66–0.70 on rank 0 and 0.64 on rank 1 of one process's 135 MiB
    // (each rank's code, MPI and runtime take about 24 MiB, which one process pays once),
    // Gemma 3 0.58 and 0.56 of 322 MiB (its tied 170 MiB head split by rows between the
    // two; rank 1 keeps no vocabulary). Gemma 3's bound is the pipeline's goal (60% of one
    // process); SmolLM2's guards against a rank loading what it does not hold.
    for (name, limit) in [("SmolLM2-135M-Instruct.Q4_1.gguf", 0.75), ("gemma-3-270m-q4_k_m.gguf", 0.60)] {
        let Some(file) = model(name) else { continue };
        let (one, ranks) = same_tokens_on_two_ranks(&file, &[]);
        for (r, peak) in ranks.iter().enumerate() {
            let ratio = *peak as f64 / one as f64;
            eprintln!("{name}: rank {r} peak resident {peak} bytes, {ratio:.2} of one process's {one}");
            assert!(ratio <= limit, "{name}: rank {r} holds {ratio:.2} of one process's memory");
        }
    }
}

#[test]
fn a_user_split_and_a_16_bit_wire_and_bad_splits() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    same_tokens_on_two_ranks(&file, &["--layer-split", "20,10"]);
    // The head whole on the last rank, or a user's share of it on rank 0.
    same_tokens_on_two_ranks(&file, &["--head-split", "0"]);
    same_tokens_on_two_ranks(&file, &["--head-split", "20000"]);
    let mut too_many = mpirun(2);
    too_many.arg("generate").arg("--model").arg(&file).args(GREEDY).arg(PROMPT).args(["--head-split", "49153"]);
    let o = too_many.output().unwrap();
    assert!(!o.status.success() && text(&o.stderr).contains("0..=49152"), "{}", text(&o.stderr));
    let mut alone = fusebox();
    alone.arg("generate").arg("--model").arg(&file).args(GREEDY).arg(PROMPT).args(["--head-split", "64"]);
    let o = alone.output().unwrap();
    assert!(!o.status.success() && text(&o.stderr).contains("two or more MPI ranks"), "{}", text(&o.stderr));
    // bf16 rounds the hidden state between the ranks: the run works; how far it agrees
    // is measured in docs/distributed.md, not asserted.
    let o =
        mpirun(2).arg("generate").arg("--model").arg(&file).args(GREEDY).arg(PROMPT).args(["--wire", "bf16"]).output();
    let v = json_of(&o.unwrap());
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 24);
    for (split, says) in
        [("10,10", "adding up to the model's 30"), ("30,0", "at least one block"), ("30", "one per process")]
    {
        let o = mpirun(2)
            .arg("generate")
            .arg("--model")
            .arg(&file)
            .args(GREEDY)
            .arg(PROMPT)
            .args(["--layer-split", split])
            .output()
            .unwrap();
        assert!(!o.status.success());
        assert!(text(&o.stderr).contains(says), "--layer-split {split}: {}", text(&o.stderr));
    }
    let o =
        mpirun(2).arg("generate").arg("--model").arg(&file).args(GREEDY).arg(PROMPT).args(["--wire", "f8"]).output();
    let o = o.unwrap();
    assert!(!o.status.success() && text(&o.stderr).contains("f32, f16 or bf16"), "{}", text(&o.stderr));
}

#[test]
fn more_ranks_than_blocks_are_refused_before_loading() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    // The tiny Hugging Face llama of fusebox-models' fixtures has 2 blocks.
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/llama");
    let o = mpirun(3).arg("generate").arg("--model").arg(&tiny).args(GREEDY).arg("hi").output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("1..=2"), "{}", text(&o.stderr));
}

#[test]
fn under_a_memory_cap_one_process_fails_and_two_ranks_generate() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    if Command::new("prlimit").arg("--version").output().is_err() {
        return eprintln!("skipping: prlimit not found (util-linux)");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    // RLIMIT_DATA caps a process's private writable memory (heap, anonymous maps): what
    // the weights copied from the file, the KV cache and the activations take. The file's
    // own read-only map is not counted.
    let cap = "--data=120000000";
    let one = Command::new("prlimit")
        .arg(cap)
        .arg(env!("CARGO_BIN_EXE_fusebox"))
        .arg("generate")
        .arg("--model")
        .arg(&file)
        .args(GREEDY)
        .arg(PROMPT)
        .output()
        .unwrap();
    assert!(!one.status.success(), "one process fits under {cap}: {}", text(&one.stderr));
    let two = Command::new("prlimit")
        .arg(cap)
        .args(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_fusebox"))
        .arg("generate")
        .arg("--model")
        .arg(&file)
        .args(GREEDY)
        .arg(PROMPT)
        .output()
        .unwrap();
    let v = json_of(&two);
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 24);
}

#[test]
fn chat_over_a_pipe_on_two_ranks_answers_as_one_process() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let run = |mut c: Command| -> Vec<String> {
        use std::io::Write;
        let mut child = c
            .arg("chat")
            .arg("--model")
            .arg(&file)
            .args(["--json", "--temperature", "0", "--threads", "1", "--max-tokens", "12", "--ctx-size", "512"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"What is 2+2?\nAnd 3+3?\n/reset\nHi\n").unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reply"].to_string())
            .collect()
    };
    let one = run(fusebox());
    assert_eq!(one.len(), 3);
    assert_eq!(run(mpirun(2)), one);
}

/// The process of MPI rank `rank` whose command line has the argument `marker` (waits
/// up to a minute for it to start).
fn pid_of_rank(rank: usize, marker: &str) -> u32 {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    let started = std::time::Instant::now();
    loop {
        assert!(started.elapsed().as_secs() < 60, "rank {rank} never started");
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                env.split(|&b| b == 0).any(|kv| kv == want.as_bytes())
                    && cmd.split(|&b| b == 0).any(|a| a == marker.as_bytes())
            });
        if let Some(pid) = found {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Once the job has run `after` seconds past rank 1's start (found by `marker` among its
/// arguments), kills rank 1 and returns the job's exit status, asserting that it ended
/// within 5 s of the kill.
#[track_caller]
fn kill_rank_1(job: &mut std::process::Child, marker: &str, after: u64) -> std::process::ExitStatus {
    let pid = pid_of_rank(1, marker);
    std::thread::sleep(std::time::Duration::from_secs(after));
    assert!(job.try_wait().unwrap().is_none(), "the job ended before the kill");
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let killed = std::time::Instant::now();
    loop {
        if let Some(s) = job.try_wait().unwrap() {
            return s;
        }
        assert!(killed.elapsed().as_secs() < 5, "the job still runs 5 s after rank 1 was killed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_killed_rank_ends_the_job_within_seconds_naming_it() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let mut job = mpirun(2)
        .arg("generate")
        .arg("--model")
        .arg(&file)
        .args(["--temperature", "0", "--max-tokens", "100000", "--threads", "1", "--ctx-size", "2048"])
        .args(["--prompt", "Once upon a time"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until rank 1 runs and the pipeline steps, then kill rank 1.
    let status = kill_rank_1(&mut job, "Once upon a time", 3);
    let o = job.wait_with_output().unwrap();
    assert!(!status.success());
    let err = text(&o.stderr);
    assert!(err.contains("rank 1"), "{err}");
}

/// One HTTP/1.1 request with `Connection: close`; the status and the body.
fn http(addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(300))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// A started server: the process, its address, and the rest of its stderr.
fn start_server(mut c: Command) -> (std::process::Child, String, std::io::BufReader<std::process::ChildStderr>) {
    use std::io::BufRead;
    let mut child = c.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve ended before listening");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    (child, addr, err)
}

/// Eight concurrent greedy chats (and one stream) against `addr`; the eight answers.
fn eight_answers(addr: &str) -> Vec<String> {
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let body = serde_json::json!({"messages": [{"role": "user", "content": format!("Name {i} things found at sea.")}],
                                              "temperature": 0, "max_tokens": 20, "stream": i == 7});
                let (status, text) = http(&addr, "/v1/chat/completions", &body.to_string());
                assert_eq!(status, 200, "{text}");
                if i == 7 {
                    // The stream's content deltas, joined.
                    assert!(text.contains("data: [DONE]"), "{text}");
                    text.lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
                        .collect::<String>()
                } else {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
                }
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn serve_on_two_ranks_answers_eight_clients_as_one_process() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let args = ["--port", "0", "--parallel", "8", "--ctx-size", "256", "--threads"];
    // The same thread count per process: a prompt's matmul panels follow it (docs/decode.md),
    // and the default 8-bit activations can turn their last-bit differences into another
    // near-tie choice.
    let mut one = fusebox();
    one.arg("serve").arg("--model").arg(&file).args(args).arg("1");
    let (mut child, addr, _) = start_server(one);
    let want = eight_answers(&addr);
    child.kill().unwrap();
    child.wait().unwrap();

    let mut two = mpirun(2);
    two.arg("serve").arg("--model").arg(&file).args(args).arg("1");
    let (mut job, addr, mut err) = start_server(two);
    assert_eq!(eight_answers(&addr), want);
    // SIGTERM to mpirun reaches every rank: rank 0 stops the server, then ends the
    // followers (their counters are printed), within seconds.
    let t = std::time::Instant::now();
    Command::new("kill").args(["-TERM", &job.id().to_string()]).status().unwrap();
    while job.try_wait().unwrap().is_none() {
        assert!(t.elapsed().as_secs() < 10, "serve on two ranks still runs 10 s after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(rest.contains("[pipeline] rank 1:") && rest.contains("stopped"), "{rest}");
}

#[test]
fn a_killed_rank_ends_a_split_server_within_seconds_naming_it() {
    if let Some(why) = unavailable() {
        return eprintln!("skipping: {why}");
    }
    let Some(file) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let mut two = mpirun(2);
    two.arg("serve").arg("--model").arg(&file).args(["--port", "0", "--parallel", "2", "--threads", "1"]);
    two.args(["--alias", "killed-rank-test"]);
    let (mut job, addr, mut err) = start_server(two);
    let long = serde_json::json!({"messages": [{"role": "user", "content": "Write a very long story."}],
                                  "temperature": 0, "max_tokens": 1500});
    let client = std::thread::spawn(move || {
        let body = long.to_string();
        std::panic::catch_unwind(|| http(&addr, "/v1/chat/completions", &body)).ok()
    });
    let status = kill_rank_1(&mut job, "killed-rank-test", 2);
    assert!(!status.success());
    // The request in flight does not hang: its connection ends with the job.
    let answered = client.join().unwrap();
    assert!(answered.as_ref().is_none_or(|(code, _)| *code != 200), "{answered:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(rest.contains("rank 1"), "{rest}");
}
