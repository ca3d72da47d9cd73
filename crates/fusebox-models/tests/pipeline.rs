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
    let config = weights::read_config(&dir(name)).unwrap();
    let shards = Shards::open(&dir(name)).unwrap();
    let plan = weights::hf_plan(&config, &shards).unwrap();
    weights::load_hf_stage(b, &shards, plan, Purpose::Inference, &|sizes| match &layers {
        Some(r) => Stage::new(r.clone(), sizes.layers.len()),
        None => Ok(Stage::whole(sizes.layers.len())),
    })
    .unwrap()
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
                out.push(m.stage_logits(b, &o.h, false).unwrap().to_vec::<f32>().unwrap());
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
        let mut splits = vec![vec![0..1, 1..n]];
        if n >= 3 {
            splits.push(vec![0..n - 2, n - 2..n - 1, n - 1..n]);
        }
        for split in splits {
            let stages: Vec<Transformer> = split.iter().map(|r| load(&b, name, Some(r.clone()))).collect();
            // Each stage holds its blocks' tensors only (the others are empty).
            for (s, m) in split.iter().zip(&stages) {
                let held: usize = m.params.tensors.iter().map(Tensor::elem_count).sum();
                let all: usize = whole.params.tensors.iter().map(Tensor::elem_count).sum();
                assert!(held < all, "{name} {s:?}: holds {held} of {all} values");
                assert_eq!(m.stage().layers, *s);
            }
            let got = chained(&b, &stages, Wire::F32);
            assert_eq!(got, want, "{name} split {split:?}");
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
    assert!(e.to_string().contains("no head"), "{e}");
    assert!(Stage::new(0..0, n).is_err() && Stage::new(0..n + 1, n).is_err());
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

/// The fixture `name` (of `n` blocks) split evenly into `world` stages: rank 0's
/// communicator and blocks, and every other rank following on its own thread with
/// `slots` caches of 32 positions.
fn start_ranks(
    name: &'static str,
    n: usize,
    world: usize,
    slots: usize,
) -> (Arc<Channels>, std::ops::Range<usize>, Vec<std::thread::JoinHandle<Result<()>>>) {
    let sizes = weights::StageSizes { embed: 0, head: 0, layers: vec![1; n], kv_per_position: vec![0; n] };
    let split = pipeline::split_layers(&sizes, &[], world, None).unwrap();
    let mut comms = channels(world).into_iter();
    let rank0 = Arc::new(comms.next().unwrap());
    let followers = comms
        .map(|c| {
            let r = split[c.rank].clone();
            std::thread::spawn(move || -> Result<()> {
                let b = CpuBackend::with_threads(1).unwrap();
                let m = load(&b, name, Some(r));
                let mut caches = (0..slots).map(|_| m.new_cache(&b, 32)).collect::<Result<Vec<_>>>()?;
                pipeline::follow(&m, &b, &c, Wire::F32, &mut caches)
            })
        })
        .collect();
    (rank0, split[0].clone(), followers)
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

    let (rank0, first_blocks, followers) = start_ranks(name, n, 3, 1);
    let first = load(&b, name, Some(first_blocks));
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
    for name in ["llama", "mixtral", "qwen3_5", "qwen3_next"] {
        let b = CpuBackend::with_threads(1).unwrap();
        let whole = load(&b, name, None);
        let n = whole.arch.n_layers;
        let world = n.min(3);
        let slots = 4;
        let (rank0, first_blocks, followers) = start_ranks(name, n, world, slots);
        let first = load(&b, name, Some(first_blocks));
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
                got = p.collect(&first).unwrap();
            }
            assert_eq!(got, [want], "{name}: slot {slot}'s prompt");
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
            let mut got = p.collect(&first).unwrap();
            got.extend(p.collect(&first).unwrap());
            assert_eq!(got, want, "{name}: decode step {step}");
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
