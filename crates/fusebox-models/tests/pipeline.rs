//! Pipeline stages in one process: every fixture architecture (dense, sliding-window,
//! mixture-of-experts, Gated DeltaNet hybrids, tied and untied heads) split into two and
//! three stages gives, through the f32 wire, the logits of the whole model bit for bit;
//! each stage holds only its tensors; and the protocol ([`Pipeline`] on rank 0,
//! [`pipeline::follow`] on the others) runs over an in-process communicator, threads
//! for ranks, with one process's greedy tokens.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use fusebox::{ComputeBackend, CpuBackend, Error, Result, Tensor};
use fusebox_models::comm::{Communicator, PendingAllReduce, ReduceOp};
use fusebox_models::generate::{generate, Session};
use fusebox_models::pipeline::{self, Pipeline, Wire};
use fusebox_models::sampler::{Sampler, SamplerConfig};
use fusebox_models::transformer::{Stage, StageInput, Transformer};
use fusebox_models::weights::{self, Purpose, Shards};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name)
}

/// The fixture `name` holding the blocks `layers` (all of them when `None`).
fn load(b: &dyn ComputeBackend, name: &str, layers: Option<std::ops::Range<usize>>) -> Transformer {
    load_with(b, name, &|n, _| match &layers {
        Some(r) => Stage::new(r.clone(), n),
        None => Ok(Stage::whole(n)),
    })
}

/// The fixture `name` holding the stage `stage(blocks, vocabulary)` gives.
fn load_with(b: &dyn ComputeBackend, name: &str, stage: &dyn Fn(usize, usize) -> Result<Stage>) -> Transformer {
    let config = weights::read_config(&dir(name)).unwrap();
    let shards = Shards::open(&dir(name)).unwrap();
    let plan = weights::hf_plan(&config, &shards).unwrap();
    weights::load_hf_stage(b, &shards, plan, Purpose::Inference, &|sizes| stage(sizes.layers.len(), sizes.vocab))
        .unwrap()
}

/// The stages of `split` (blocks per stage; the head's first `lead` rows on the first
/// stage, the rest on the last; `lead` 0: the whole head on the last).
fn load_split(b: &dyn ComputeBackend, name: &str, layers: &[std::ops::Range<usize>], lead: usize) -> Vec<Transformer> {
    (0..layers.len())
        .map(|rank| {
            load_with(b, name, &|n, vocab| {
                let split = pipeline::Split { layers: layers.to_vec(), lead_head_rows: lead, vocab };
                assert_eq!(split.layers.last().unwrap().end, n);
                split.stage(rank)
            })
        })
        .collect()
}

const ARCHS: [&str; 11] = [
    "llama",
    "llama_linear_tied",
    "gpt2",
    "gemma3",
    "phi3",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
    "qwen3_5",
    "qwen3_next",
];

/// The logits of a 5-token prompt then 3 single tokens through `stages`, chained.
fn chained(b: &dyn ComputeBackend, stages: &[Transformer], wire: Wire) -> Vec<Vec<f32>> {
    let mut caches: Vec<_> = stages.iter().map(|m| m.new_cache(b, 16).unwrap()).collect();
    let steps: [&[u32]; 4] = [&[1, 5, 9, 2, 7], &[3], &[11], &[4]];
    let mut out = Vec::new();
    for ids in steps {
        let mut input = StageInput::Tokens(ids);
        for (i, (m, cache)) in stages.iter().zip(&mut caches).enumerate() {
            let o = m.forward_stage(b, input, cache).unwrap();
            if i + 1 == stages.len() {
                // A split head: the first stage's rows of the logits lead the last's.
                let h = m.head_input(b, &o.h, false).unwrap();
                let mut logits = stages[0].head_logits(b, &h).unwrap().to_vec::<f32>().unwrap();
                if stages.len() == 1 || stages[0].stage().head_share(m.arch.vocab_size).is_empty() {
                    logits.clear();
                }
                logits.extend(m.head_logits(b, &h).unwrap().to_vec::<f32>().unwrap());
                out.push(logits);
                break;
            }
            // Through the wire's rounding, as another process would receive it.
            let round = |t: &Tensor| -> Tensor {
                let v: Vec<f32> = t.to_vec::<f32>().unwrap();
                let v: Vec<f32> = match wire {
                    Wire::F32 => v,
                    Wire::F16 => v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
                    Wire::BF16 => v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect(),
                };
                Tensor::from_vec(v, t.shape().clone()).unwrap()
            };
            input = StageInput::Hidden { x: round(&o.x), h: round(&o.h) };
        }
    }
    out
}

#[test]
fn stages_chained_give_the_whole_models_logits_bit_for_bit() {
    let b = CpuBackend::with_threads(1).unwrap();
    for name in ARCHS {
        let whole = load(&b, name, None);
        let n = whole.arch.n_layers;
        let mut cache = whole.new_cache(&b, 16).unwrap();
        let want: Vec<Vec<f32>> = [&[1u32, 5, 9, 2, 7][..], &[3], &[11], &[4]]
            .iter()
            .map(|ids| whole.forward_cached(&b, ids, &mut cache).unwrap())
            .collect();
        let vocab = whole.arch.vocab_size;
        // Blocks, and the head's rows on the first stage (0: all on the last).
        let mut splits = vec![(vec![0..1, 1..n], 0), (vec![0..1, 1..n], 64)];
        if n >= 3 {
            splits.push((vec![0..n - 2, n - 2..n - 1, n - 1..n], 0));
            splits.push((vec![0..n - 2, n - 2..n - 1, n - 1..n], (vocab - 1) / 64 * 64));
        }
        for (split, lead) in splits {
            let stages = load_split(&b, name, &split, lead);
            // Each stage holds its blocks' tensors only (the others are empty), and of a
            // split head its rows only (a tied first stage: its whole embedding table).
            let all: usize = whole.params.tensors.iter().map(Tensor::elem_count).sum();
            for (s, m) in split.iter().zip(&stages) {
                let held: usize = m.params.tensors.iter().map(Tensor::elem_count).sum();
                assert!(held < all, "{name} {s:?}: holds {held} of {all} values");
                assert_eq!(m.stage().layers, *s);
            }
            let last = stages.last().unwrap();
            let rows = last.stage().head_share(vocab).len();
            assert_eq!(rows, vocab - lead, "{name} {split:?}");
            let head = last.head_weight().dims().first().copied();
            assert_eq!(head, Some(if rows == 0 { 0 } else { rows }), "{name} {split:?}: the last stage's head rows");
            let got = chained(&b, &stages, Wire::F32);
            let what = format!("{name} split {split:?}, {lead} head rows first");
            assert_logits(&got, &want, lead == 0, &what);
            // A 16-bit wire rounds the hidden state: close, not equal.
            let rounded = chained(&b, &stages, Wire::BF16);
            for (g, w) in rounded.iter().zip(&want) {
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
                let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                assert!(err < 0.05, "{name} {split:?} bf16 wire: relative error {err}");
            }
        }
    }
}

/// `got` is `want` bit for bit when `exact`; else within f32 rounding: a dense head
/// split by rows is multiplied in products of other row counts, which the GEMM blocks
/// (and so rounds) by their shape.
fn assert_logits(got: &[Vec<f32>], want: &[Vec<f32>], exact: bool, what: &str) {
    if exact {
        assert_eq!(got, want, "{what}");
        return;
    }
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{what}");
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let err = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(err < 1e-5, "{what}: relative error {err}");
    }
}

/// A head in a block format split by rows between the first and the last of two
/// stages gives one process's logits bit for bit, on both decode paths (8-bit and f32
/// activations): SmolLM2 (tied Q8_0 head) and Gemma 3 (tied Q8_0 head of 262,144 rows).
/// Skips, saying why, without the model files (`scripts/fetch-smollm2.sh`,
/// `scripts/fetch-gemma3.sh`).
#[test]
fn a_head_in_blocks_split_by_rows_gives_one_processs_logits_bit_for_bit() {
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    for file in ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"] {
        let path = models.join(file);
        if !path.exists() {
            eprintln!("skipping {file}: not found (scripts/fetch-smollm2.sh, scripts/fetch-gemma3.sh)");
            continue;
        }
        let gguf = fusebox_models::gguf::GgufFile::open(&path).unwrap();
        for exact in [false, true] {
            let b = CpuBackend::builder().threads(2).exact_decode(exact).build().unwrap();
            let pick = |stage: &dyn Fn(&weights::StageSizes) -> Result<Stage>| {
                weights::load_gguf_stage(&b, &gguf, stage).unwrap()
            };
            let whole = pick(&|s| Ok(Stage::whole(s.layers.len())));
            let mut cache = whole.new_cache(&b, 16).unwrap();
            let want: Vec<Vec<f32>> = [&[1u32, 5, 9, 2, 7][..], &[3], &[11], &[4]]
                .iter()
                .map(|ids| whole.forward_cached(&b, ids, &mut cache).unwrap())
                .collect();
            let (n, vocab) = (whole.arch.n_layers, whole.arch.vocab_size);
            drop(whole);
            let split = pipeline::Split { layers: vec![0..n / 2, n / 2..n], lead_head_rows: 64 * 97, vocab };
            let stages: Vec<Transformer> = (0..2).map(|r| pick(&|_| split.stage(r))).collect();
            assert_eq!(stages[1].head_weight().dims()[0], vocab - 64 * 97);
            let got = chained(&b, &stages, Wire::F32);
            assert_logits(&got, &want, true, &format!("{file}, exact decode {exact}"));
        }
    }
}

#[test]
fn a_stage_refuses_what_it_cannot_run() {
    let b = CpuBackend::with_threads(1).unwrap();
    let n = load(&b, "llama", None).arch.n_layers;
    let second = load(&b, "llama", Some(1..n));
    let mut cache = second.new_cache(&b, 8).unwrap();
    let e = second.forward_stage(&b, StageInput::Tokens(&[1]), &mut cache).unwrap_err().to_string();
    assert!(e.contains("no embeddings"), "{e}");
    let e = second.forward_cached(&b, &[1], &mut cache).unwrap_err().to_string();
    assert!(e.contains("pipeline stage"), "{e}");
    let d = second.arch.d_model;
    let x = Tensor::from_vec(vec![0f32; 2 * d], [1, 2, d]).unwrap();
    let h = Tensor::from_vec(vec![0f32; d], [1, 1, d]).unwrap();
    let e = second.forward_stage(&b, StageInput::Hidden { x, h }, &mut cache).unwrap_err().to_string();
    assert!(e.contains("h"), "{e}");
    let first = load(&b, "llama", Some(0..1));
    let e = first.stage_logits(&b, &Tensor::from_vec(vec![0f32; d], [1, 1, d]).unwrap(), false).unwrap_err();
    assert!(e.to_string().contains("no final norm"), "{e}");
    assert!(Stage::new(0..0, n).is_err() && Stage::new(0..n + 1, n).is_err());
    // A split head's rows lead on the first stage and end the vocabulary on the last.
    let vocab = second.arch.vocab_size;
    assert!(Stage::new(0..1, n).unwrap().with_head_rows(0..10, vocab).is_ok());
    let e = Stage::new(0..1, n).unwrap().with_head_rows(5..10, vocab).unwrap_err().to_string();
    assert!(e.contains("5..10") && e.contains("first stage"), "{e}");
    assert!(Stage::new(1..n, n).unwrap().with_head_rows(0..10, vocab).is_err());
    assert!(Stage::new(1..n, n).unwrap().with_head_rows(10..vocab + 1, vocab).is_err());
    let e = second.head_logits(&b, &Tensor::from_vec(vec![0f32; d], [1, 1, d]).unwrap()).unwrap_err().to_string();
    assert!(e.contains("[N, "), "{e}");
    let e = first.forward(&b, &Tensor::from_vec(vec![1u32], [1, 1]).unwrap()).unwrap_err().to_string();
    assert!(e.contains("inference") || e.contains("pipeline stage"), "{e}");
}

/// Ranks as threads: one channel per ordered pair of ranks.
#[derive(Debug)]
struct Channels {
    rank: usize,
    world: usize,
    to: Vec<Mutex<Sender<Vec<u8>>>>,
    from: Vec<Mutex<Receiver<Vec<u8>>>>,
}

fn channels(world: usize) -> Vec<Channels> {
    let mut senders: Vec<Vec<Option<Sender<Vec<u8>>>>> =
        (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    let mut receivers: Vec<Vec<Option<Receiver<Vec<u8>>>>> =
        (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    for a in 0..world {
        for b in 0..world {
            let (s, r) = channel();
            senders[a][b] = Some(s);
            receivers[b][a] = Some(r);
        }
    }
    (0..world)
        .map(|rank| Channels {
            rank,
            world,
            to: senders[rank].iter_mut().map(|s| Mutex::new(s.take().unwrap())).collect(),
            from: receivers[rank].iter_mut().map(|r| Mutex::new(r.take().unwrap())).collect(),
        })
        .collect()
}

fn no_collectives() -> Error {
    Error::unsupported("Channels", "the pipeline test uses point-to-point messages only")
}

impl Communicator for Channels {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce(&self, _buf: &mut [f32], _op: ReduceOp) -> Result<()> {
        Err(no_collectives())
    }
    fn start_all_reduce(&self, _buf: Vec<f32>, _op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        Err(no_collectives())
    }
    fn broadcast(&self, _buf: &mut [f32], _root: usize) -> Result<()> {
        Err(no_collectives())
    }
    fn barrier(&self) -> Result<()> {
        Err(no_collectives())
    }
    fn send(&self, dest: usize, bytes: &[u8]) -> Result<()> {
        self.to[dest].lock().unwrap().send(bytes.to_vec()).map_err(|_| Error::Io(format!("rank {dest} is gone")))
    }
    fn recv(&self, src: usize) -> Result<Vec<u8>> {
        self.from[src].lock().unwrap().recv().map_err(|_| Error::Io(format!("rank {src} is gone")))
    }
}

/// The fixture `name` (of `n` blocks) split evenly into `world` stages, the head's
/// first `lead` rows on rank 0: rank 0's communicator and stage, and every other rank
/// following on its own thread with `slots` caches of 32 positions.
fn start_ranks(
    name: &'static str,
    n: usize,
    world: usize,
    slots: usize,
    lead: usize,
) -> (Arc<Channels>, Transformer, Vec<std::thread::JoinHandle<Result<()>>>) {
    let b = CpuBackend::with_threads(1).unwrap();
    let vocab = load(&b, name, None).arch.vocab_size;
    let sizes = weights::StageSizes {
        embed: 0,
        head: 0,
        layers: vec![1; n],
        kv_per_position: vec![0; n],
        vocab,
        head_in_blocks: false,
    };
    let options = pipeline::SplitOptions { lead_head_rows: Some(lead), ..Default::default() };
    let split = pipeline::split_layers(&sizes, world, &options).unwrap();
    let mut comms = channels(world).into_iter();
    let rank0 = Arc::new(comms.next().unwrap());
    let first = load_split(&b, name, &split.layers, lead).remove(0);
    let followers = comms
        .map(|c| {
            let split = split.clone();
            std::thread::spawn(move || -> Result<()> {
                let b = CpuBackend::with_threads(1).unwrap();
                let m = load_split(&b, name, &split.layers, split.lead_head_rows).remove(c.rank);
                let mut caches = (0..slots).map(|_| m.new_cache(&b, 32)).collect::<Result<Vec<_>>>()?;
                pipeline::follow(&m, &b, &c, Wire::F32, &mut caches)
            })
        })
        .collect();
    (rank0, first, followers)
}

#[test]
fn the_protocol_over_three_ranks_generates_one_processs_tokens() {
    let name = "qwen3_5";
    let b = CpuBackend::with_threads(1).unwrap();
    let whole = load(&b, name, None);
    let n = whole.arch.n_layers;
    let prompt = [1u32, 5, 9, 2, 7];
    let greedy = || Sampler::new(SamplerConfig::default()).unwrap();
    let mut session = Session::new(&whole, &b, 32).unwrap();
    let want = generate(&mut session, &b, &prompt, 8, &mut greedy(), &[], |_| Ok(())).unwrap().tokens;

    // The head split between rank 0 and rank 2.
    let (rank0, first, followers) = start_ranks(name, n, 3, 1, whole.arch.vocab_size / 2);
    let p = Arc::new(Pipeline::new(rank0, Wire::F32).unwrap());
    let mut session = Session::new(&first, &b, 32).unwrap().with_pipeline(Some(p.clone()));
    let got = generate(&mut session, &b, &prompt, 8, &mut greedy(), &[], |_| Ok(())).unwrap().tokens;
    assert_eq!(got, want);
    // A second sequence on the same pipeline starts the followers' caches afresh.
    let mut session = Session::new(&first, &b, 32).unwrap().with_pipeline(Some(p.clone()));
    let again = generate(&mut session, &b, &prompt, 8, &mut greedy(), &[], |_| Ok(())).unwrap().tokens;
    assert_eq!(again, want);
    let all = session.step_all(&b, &[3, 4]).unwrap();
    assert_eq!(all.dims(), [2, whole.arch.vocab_size]);
    let stats = p.finish().unwrap();
    assert_eq!(stats.iter().map(|s| s.rank).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(stats.iter().all(|s| s.steps == 2 * 8 + 1), "{stats:?}");
    for f in followers {
        f.join().unwrap().unwrap();
    }
}

/// A server's use of a pipeline: prompts of four slots submitted in chunks (the next
/// chunk before the last one's logits), then decode micro-batches of two slots each,
/// both in flight at once over three ranks (two where the model has two blocks). Every
/// collected row has the bits of the whole model's `forward_cached` and `forward_batch`
/// over the same chunks and micro-batches.
#[test]
fn batches_in_flight_over_three_ranks_give_the_whole_models_logits() {
    // The head whole on the last rank, or split with rank 0.
    for (name, split_head) in [("llama", false), ("mixtral", true), ("qwen3_5", false), ("qwen3_next", true)] {
        let b = CpuBackend::with_threads(1).unwrap();
        let whole = load(&b, name, None);
        let n = whole.arch.n_layers;
        let world = n.min(3);
        let slots = 4;
        let lead = if split_head { whole.arch.vocab_size / 3 } else { 0 };
        let (rank0, first, followers) = start_ranks(name, n, world, slots, lead);
        let p = Pipeline::new(rank0, Wire::F32).unwrap();
        let mut mine: Vec<_> = (0..slots).map(|_| first.new_cache(&b, 32).unwrap()).collect();
        let mut theirs: Vec<_> = (0..slots).map(|_| whole.new_cache(&b, 32).unwrap()).collect();

        // Prompts of 2..=5 tokens, each in chunks of two; only the last chunk's logits count.
        for slot in 0..slots {
            let prompt: Vec<u32> = (0..slot as u32 + 2).map(|t| (7 * t + slot as u32) % 50 + 1).collect();
            let chunks: Vec<&[u32]> = prompt.chunks(2).collect();
            // Chunked the same way: a chunk's row count shapes dense products' rounding.
            let want = chunks.iter().map(|c| whole.forward_cached(&b, c, &mut theirs[slot]).unwrap()).last().unwrap();
            for c in &chunks {
                let seq = pipeline::Sequence { slot, ids: c };
                p.submit(&first, &b, &[seq], &mut [&mut mine[slot]]).unwrap();
            }
            assert_eq!(p.in_flight(), chunks.len());
            let mut got = Vec::new();
            for _ in &chunks {
                got = p.collect(&first, &b).unwrap();
            }
            assert_logits(&got, &[want], !split_head, &format!("{name}: slot {slot}'s prompt"));
        }
        // Three decode steps, each as two micro-batches in flight together.
        for step in 0..3u32 {
            let ids: Vec<u32> = (0..slots as u32).map(|s| (11 * s + 3 * step) % 50 + 1).collect();
            // Batched the same way (dense products round by their row count).
            let mut want = Vec::new();
            let (low, high) = theirs.split_at_mut(2);
            for (range, caches) in [(0..2usize, low), (2..4, high)] {
                let mut refs: Vec<&mut _> = caches.iter_mut().collect();
                want.extend(whole.forward_batch(&b, &ids[range], &mut refs).unwrap());
            }
            let (low, high) = mine.split_at_mut(2);
            for (slots_of, caches) in [(0..2usize, low), (2..4, high)] {
                let seqs: Vec<_> =
                    slots_of.map(|s| pipeline::Sequence { slot: s, ids: std::slice::from_ref(&ids[s]) }).collect();
                let mut refs: Vec<&mut _> = caches.iter_mut().collect();
                p.submit(&first, &b, &seqs, &mut refs).unwrap();
            }
            let mut got = p.collect(&first, &b).unwrap();
            got.extend(p.collect(&first, &b).unwrap());
            assert_logits(&got, &want, !split_head, &format!("{name}: decode step {step}"));
        }
        // Not a batch: two sequences of two tokens, or slots out of order.
        let two = [1u32, 2];
        let (a, rest) = mine.split_at_mut(1);
        let bad = [pipeline::Sequence { slot: 0, ids: &two }, pipeline::Sequence { slot: 1, ids: &two }];
        let e = p.submit(&first, &b, &bad, &mut [&mut a[0], &mut rest[0]]).unwrap_err().to_string();
        assert!(e.contains("one sequence, or several of one token each"), "{e}");
        let finished = p.finish().unwrap();
        assert_eq!(finished.len(), world);
        for f in followers {
            f.join().unwrap().unwrap();
        }
    }
}
