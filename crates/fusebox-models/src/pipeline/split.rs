//! How a model is divided over the pipeline stages: which consecutive blocks each holds,
//! and which vocabulary rows of the head the first and the last multiply by. Balanced by
//! the bytes each stage reads per token (its blocks' weights and KV cache, its rows of
//! the head; the first stage's embedding lookup reads one row per token and is served
//! from the file's map), or as the user says (`--layer-split 10,14`, `--head-split N`).

use std::ops::Range;

use fusebox::{Error, Result};

use crate::transformer::Stage;
use crate::weights::StageSizes;

/// A split head's share on the first stage is a multiple of this many rows (the kernels'
/// row tiles stay whole), or the whole vocabulary.
const HEAD_ROW_STEP: usize = 64;

/// A model divided over `layers.len()` stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Each stage's blocks, consecutive, in rank order.
    pub layers: Vec<Range<usize>>,
    /// The head's rows `0..lead_head_rows` are the first stage's to multiply by, the rest
    /// the last stage's (0: the whole head on the last stage, as in one process).
    pub lead_head_rows: usize,
    /// Rows of the head (the vocabulary).
    pub vocab: usize,
}

impl Split {
    /// Rank `rank`'s stage.
    pub fn stage(&self, rank: usize) -> Result<Stage> {
        let world = self.layers.len();
        let range = self
            .layers
            .get(rank)
            .cloned()
            .ok_or_else(|| Error::value("Split::stage", "rank", format!("0..{world}"), rank))?;
        let n = self.layers.last().map_or(0, |r| r.end);
        let stage = Stage::new(range, n)?;
        if self.lead_head_rows == 0 || world < 2 {
            return Ok(stage);
        }
        match rank {
            0 => stage.with_head_rows(0..self.lead_head_rows, self.vocab),
            r if r + 1 == world => stage.with_head_rows(self.lead_head_rows..self.vocab, self.vocab),
            _ => Ok(stage),
        }
    }

    /// One line for the log: `blocks 0..22 | 22..30, head rows 0..9984 on rank 0 and
    /// 9984..49152 on rank 1`.
    pub fn describe(&self) -> String {
        let blocks: Vec<String> = self.layers.iter().map(|r| format!("{}..{}", r.start, r.end)).collect();
        let last = self.layers.len().saturating_sub(1);
        let head = if self.lead_head_rows == 0 {
            format!("head on rank {last}")
        } else {
            format!(
                "head rows 0..{} on rank 0 and {}..{} on rank {last}",
                self.lead_head_rows, self.lead_head_rows, self.vocab
            )
        };
        format!("blocks {}, {head}", blocks.join(" | "))
    }
}

/// What a split balances besides the weights, and what the user fixed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SplitOptions<'a> {
    /// Bytes of KV cache of each block (empty: none).
    pub cache_per_layer: &'a [u64],
    /// Bytes each rank holds besides its weights and caches — its process, rank 0's
    /// tokenizer — counted in its share (empty: none).
    pub resident: &'a [u64],
    /// `--layer-split`: blocks per stage.
    pub counts: Option<&'a [usize]>,
    /// `--head-split`: the head's rows on the first stage.
    pub lead_head_rows: Option<usize>,
}

/// The split of a model of `sizes` over `world` stages.
///
/// Blocks: `options.counts` (`--layer-split`, one count per stage) when given, else the
/// split whose largest stage is smallest, each stage weighing its blocks' bytes, their
/// cache (`cache_per_layer[l]` for block `l`) and its `resident` bytes, the first and the
/// last sharing the head's bytes when it is stored in blocks (ties: the smaller share on
/// the first stage, then the earliest boundaries). Head: `options.lead_head_rows`
/// (`--head-split`) rows on the first stage when given, else for a head in blocks the
/// rows that even out the first and the last stage (rounded to whole tiles of rows), and
/// none of a dense head's (its product's rounding depends on its row count; see
/// [`StageSizes::head_in_blocks`]).
/// Refused before anything is loaded: more stages than blocks, counts that are not one
/// per stage, a stage with no block, counts that do not add up to the model, head rows
/// beyond the vocabulary.
///
/// # Shapes
/// `cache_per_layer`: empty, or one value per block of `sizes`; `resident`: empty, or one
/// value per stage.
pub fn split_layers(sizes: &StageSizes, world: usize, options: &SplitOptions<'_>) -> Result<Split> {
    const OP: &str = "layer split";
    let n = sizes.layers.len();
    let (cache_per_layer, resident) = (options.cache_per_layer, options.resident);
    if world == 0 || world > n {
        return Err(Error::value(
            OP,
            "processes",
            format!("1..={n} (one block at least per pipeline stage; the model has {n})"),
            world,
        ));
    }
    if !cache_per_layer.is_empty() && cache_per_layer.len() != n {
        return Err(Error::shape(OP, "cache sizes", n, cache_per_layer.len()));
    }
    if !resident.is_empty() && resident.len() != world {
        return Err(Error::shape(OP, "resident sizes", world, resident.len()));
    }
    if let Some(rows) = options.lead_head_rows.filter(|&r| r > sizes.vocab) {
        return Err(Error::value("--head-split", "rows", format!("0..={} (the vocabulary)", sizes.vocab), rows));
    }
    let cost = |l: usize| sizes.layers[l] + cache_per_layer.get(l).copied().unwrap_or(0);
    // prefix[j]: the cost of blocks 0..j.
    let mut prefix = vec![0u64; n + 1];
    for l in 0..n {
        prefix[l + 1] = prefix[l] + cost(l);
    }
    let own = |stage: usize| resident.get(stage).copied().unwrap_or(0);
    let layers = match options.counts {
        Some(counts) => user_split(counts, n, world)?,
        None if world == 1 => std::iter::once(0..n).collect(),
        None => balanced_blocks(&prefix, sizes.head, sizes.head_in_blocks, &own, world),
    };
    let lead_head_rows = match options.lead_head_rows {
        _ if world == 1 => 0,
        Some(rows) => rows,
        None if !sizes.head_in_blocks => 0,
        None => {
            let first = prefix[layers[0].end] + own(0);
            let last = prefix[n] - prefix[layers[world - 1].start] + own(world - 1);
            rows_of(lead_share(first, last, sizes.head), sizes.head, sizes.vocab)
        }
    };
    Ok(Split { layers, lead_head_rows, vocab: sizes.vocab })
}

/// The bytes of a head of `head` bytes the first stage takes to even out a first stage
/// of `first` and a last of `last` bytes: `(last + head − first) / 2`, within `0..=head`.
fn lead_share(first: u64, last: u64, head: u64) -> u64 {
    ((last + head).saturating_sub(first) / 2).min(head)
}

/// The largest of a first stage of `first` bytes and a last of `last` when they share a
/// head of `head` bytes as evenly as they can.
fn shared_head_cost(first: u64, last: u64, head: u64) -> u64 {
    let lead = lead_share(first, last, head);
    (first + lead).max(last + head - lead)
}

/// `bytes` of a head of `head` bytes over `vocab` rows as rows, rounded to whole tiles
/// ([`HEAD_ROW_STEP`]) and within the vocabulary.
fn rows_of(bytes: u64, head: u64, vocab: usize) -> usize {
    if head == 0 || vocab == 0 {
        return 0;
    }
    let rows = (bytes as f64 / head as f64 * vocab as f64).round() as usize;
    let step = HEAD_ROW_STEP;
    ((rows + step / 2) / step * step).min(vocab)
}

/// The blocks of `world ≥ 2` stages (block costs as `prefix` sums, stage `k` holding
/// `own(k)` bytes besides) whose largest stage is smallest, the last holding the head's
/// `head` bytes, shared with the first when `shared` (ties: the smaller share of the head
/// on the first, then the earliest boundaries).
fn balanced_blocks(
    prefix: &[u64],
    head: u64,
    shared: bool,
    own: &dyn Fn(usize) -> u64,
    world: usize,
) -> Vec<Range<usize>> {
    let n = prefix.len() - 1;
    let middle = world - 2;
    let span = |i: usize, j: usize| prefix[j] - prefix[i];
    // ((largest stage, head share on the first), first stage's end, last stage's start).
    let mut best: Option<((u64, u64), usize, usize)> = None;
    for a in 1..n {
        let (mid, _) = middle_stages(prefix, own, a, middle);
        // The last stage starts at z: a + middle ≤ z < n.
        for (z, m) in mid.iter().enumerate().take(n).skip(a + middle) {
            let Some(m) = *m else { continue };
            let (first, last) = (span(0, a) + own(0), span(z, n) + own(world - 1));
            let c = match shared {
                true => (m.max(shared_head_cost(first, last, head)), lead_share(first, last, head)),
                false => (m.max(first).max(last + head), 0),
            };
            if best.is_none_or(|b| c < b.0) {
                best = Some((c, a, z));
            }
        }
    }
    // `world ≤ n` blocks always leave a split; one stage of everything otherwise.
    let Some((_, a, z)) = best else { return std::iter::once(0..n).collect() };
    let (_, cut) = middle_stages(prefix, own, a, middle);
    let mut ranges = vec![0..a; world];
    ranges[world - 1] = z..n;
    let mut end = z;
    for k in (1..=middle).rev() {
        let start = cut[k][end];
        ranges[k] = start..end;
        end = start;
    }
    ranges
}

/// The middle stages `1..=k` over the blocks from `a` on: for each end `j`, the smallest
/// largest-stage cost of blocks `a..j` as `k` stages (`None`: impossible), and
/// `cut[i][j]`, where the `i`-th of them starts when `i` stages end at `j`.
fn middle_stages(
    prefix: &[u64],
    own: &dyn Fn(usize) -> u64,
    a: usize,
    k: usize,
) -> (Vec<Option<u64>>, Vec<Vec<usize>>) {
    let n = prefix.len() - 1;
    let mut cost = vec![vec![None; n + 1]; k + 1];
    let mut cut = vec![vec![0usize; n + 1]; k + 1];
    cost[0][a] = Some(0);
    for s in 1..=k {
        for j in a + s..=n {
            for i in (a + s - 1)..j {
                let Some(before) = cost[s - 1][i] else { continue };
                let c: u64 = before.max(prefix[j] - prefix[i] + own(s));
                if cost[s][j].is_none_or(|best| c < best) {
                    cost[s][j] = Some(c);
                    cut[s][j] = i;
                }
            }
        }
    }
    (cost.swap_remove(k), cut)
}

/// The ranges of `--layer-split` counts, checked.
fn user_split(counts: &[usize], n: usize, world: usize) -> Result<Vec<Range<usize>>> {
    const OP: &str = "--layer-split";
    if counts.len() != world {
        return Err(Error::value(OP, "counts", format!("one per process ({world})"), counts.len()));
    }
    if let Some(i) = counts.iter().position(|&c| c == 0) {
        return Err(Error::value(OP, format!("stage {i}"), "at least one block", 0));
    }
    let total: usize = counts.iter().sum();
    if total != n {
        return Err(Error::value(OP, "counts", format!("blocks adding up to the model's {n}"), total));
    }
    let mut start = 0;
    Ok(counts
        .iter()
        .map(|&c| {
            let r = start..start + c;
            start += c;
            r
        })
        .collect())
}

/// Parses `--layer-split`: block counts separated by commas (`10,14`).
pub fn parse_layer_split(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .map_err(|_| Error::value("--layer-split", "counts", "block counts separated by commas (10,14)", text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(layers: &[u64], head: u64) -> StageSizes {
        StageSizes {
            embed: 1000,
            head,
            layers: layers.to_vec(),
            kv_per_position: vec![0; layers.len()],
            vocab: 6400,
            head_in_blocks: true,
        }
    }

    fn blocks(s: &StageSizes, cache: &[u64], world: usize) -> Vec<Range<usize>> {
        auto(s, cache, world).unwrap().layers
    }

    fn auto(s: &StageSizes, cache: &[u64], world: usize) -> Result<Split> {
        split_layers(s, world, &SplitOptions { cache_per_layer: cache, ..SplitOptions::default() })
    }

    fn fixed(s: &StageSizes, world: usize, counts: Option<&[usize]>, head: Option<usize>) -> Result<Split> {
        split_layers(s, world, &SplitOptions { counts, lead_head_rows: head, ..SplitOptions::default() })
    }

    #[test]
    fn equal_blocks_split_evenly_and_the_first_and_last_stages_share_the_head() {
        let s = sizes(&[10; 8], 0);
        assert_eq!(blocks(&s, &[], 2), [0..4, 4..8]);
        assert_eq!(blocks(&s, &[], 1), vec![0..8]);
        assert_eq!(blocks(&s, &[], 8).len(), 8);
        assert_eq!(auto(&s, &[], 2).unwrap().lead_head_rows, 0);
        // A head worth 4 blocks: the blocks alone even it out (60 | 20 + 40), so the head
        // stays whole on the last stage.
        let s = sizes(&[10; 8], 40);
        let split = auto(&s, &[], 2).unwrap();
        assert_eq!((split.layers.clone(), split.lead_head_rows), (vec![0..6, 6..8], 0));
        // A head larger than the blocks is shared, 95 bytes a side; of the even splits the
        // one with the least of the head on the first stage: 30 + 65 | 10 + 85.
        let s = sizes(&[10; 4], 150);
        let split = auto(&s, &[], 2).unwrap();
        assert_eq!((split.layers.clone(), split.lead_head_rows), (vec![0..3, 3..4], 2752));
        // Three stages of 8 blocks and a head of 10: 30 | 30 | 20 + 10.
        let s = sizes(&[10; 8], 10);
        let split = auto(&s, &[], 3).unwrap();
        assert_eq!((split.layers.clone(), split.lead_head_rows), (vec![0..3, 3..6, 6..8], 0));
        // Rank 0's own resident bytes (its tokenizer) count in its share.
        let s = sizes(&[10; 8], 0);
        let opts = SplitOptions { resident: &[20, 0], ..SplitOptions::default() };
        assert_eq!(split_layers(&s, 2, &opts).unwrap().layers, [0..3, 3..8]);
        let s = sizes(&[10; 2], 100);
        let opts = SplitOptions { resident: &[40, 0], ..SplitOptions::default() };
        // 10 + 40 + x = 10 + 100 − x: x = 30 bytes of 100, 1920 of 6400 rows.
        assert_eq!(split_layers(&s, 2, &opts).unwrap().lead_head_rows, 1920);
        assert!(split_layers(&s, 2, &SplitOptions { resident: &[1], ..SplitOptions::default() }).is_err());
        // A dense head stays whole on the last stage unless the user splits it.
        let s = StageSizes { head_in_blocks: false, ..sizes(&[10; 4], 150) };
        let split = auto(&s, &[], 2).unwrap();
        assert_eq!((split.layers.clone(), split.lead_head_rows), (vec![0..3, 3..4], 0));
        assert_eq!(fixed(&s, 2, None, Some(640)).unwrap().lead_head_rows, 640);
        // A head worth less than the imbalance goes to the lighter end only.
        let s = sizes(&[50, 10, 10], 10);
        let split = auto(&s, &[], 2).unwrap();
        assert_eq!((split.layers.clone(), split.lead_head_rows), (vec![0..1, 1..3], 0));
        // Caches count like weights.
        let s = sizes(&[10; 4], 0);
        assert_eq!(blocks(&s, &[0, 0, 30, 30], 2), [0..3, 3..4]);
    }

    #[test]
    fn each_rank_gets_its_blocks_and_head_rows() {
        let s = sizes(&[10; 6], 30);
        let split = fixed(&s, 3, None, Some(1000)).unwrap();
        let stages: Vec<Stage> = (0..3).map(|r| split.stage(r).unwrap()).collect();
        assert_eq!(stages[0].head_share(6400), 0..1000);
        assert_eq!(stages[1].head_share(6400), 0..0);
        assert_eq!(stages[2].head_share(6400), 1000..6400);
        assert!(split.stage(3).is_err());
        assert!(
            split.describe().contains("head rows 0..1000 on rank 0 and 1000..6400 on rank 2"),
            "{}",
            split.describe()
        );
        let whole = fixed(&s, 2, None, Some(0)).unwrap();
        assert_eq!(whole.stage(1).unwrap().head_share(6400), 0..6400);
        assert!(whole.describe().ends_with("head on rank 1"));
        let e = fixed(&s, 2, None, Some(6401)).unwrap_err().to_string();
        assert!(e.contains("0..=6400") && e.contains("6401"), "{e}");
    }

    #[test]
    fn bad_splits_are_refused_with_what_was_expected() {
        let s = sizes(&[10; 4], 0);
        let e = auto(&s, &[], 5).unwrap_err().to_string();
        assert!(e.contains("1..=4") && e.contains('5'), "{e}");
        assert!(auto(&s, &[], 0).is_err());
        assert_eq!(fixed(&s, 2, Some(&[1, 3]), None).unwrap().layers, [0..1, 1..4]);
        let e = fixed(&s, 2, Some(&[2, 1]), None).unwrap_err().to_string();
        assert!(e.contains("adding up to the model's 4"), "{e}");
        let e = fixed(&s, 2, Some(&[4, 0]), None).unwrap_err().to_string();
        assert!(e.contains("stage 1") && e.contains("at least one block"), "{e}");
        let e = fixed(&s, 2, Some(&[4]), None).unwrap_err().to_string();
        assert!(e.contains("one per process (2)"), "{e}");
        assert!(auto(&s, &[1, 2], 2).is_err());
        assert_eq!(parse_layer_split("10, 14").unwrap(), [10, 14]);
        assert!(parse_layer_split("10,x").unwrap_err().to_string().contains("10,x"));
        assert!(parse_layer_split("").is_err());
    }
}
