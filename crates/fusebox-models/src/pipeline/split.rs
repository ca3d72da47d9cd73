//! Which consecutive blocks each pipeline stage holds: balanced by the bytes each stage
//! reads per token (its blocks' weights and KV cache, the head on the last stage; the
//! first stage's embedding lookup reads one row per token and is served from the file's
//! map), or as the user says (`--layer-split 10,14`).

use std::ops::Range;

use fusebox::{Error, Result};

use crate::weights::StageSizes;

/// The blocks of each of `world` stages: `counts` (`--layer-split`, one count per
/// stage) when given, else the split whose largest stage — by `sizes` plus
/// `cache_per_layer[l]` bytes of cache for block `l` — is smallest (ties: the earliest
/// boundaries). Refused before anything is loaded: more stages than blocks, counts that
/// are not one per stage, a stage with no block, counts that do not add up to the model.
///
/// # Shapes
/// `cache_per_layer`: empty, or one value per block of `sizes`.
pub fn split_layers(
    sizes: &StageSizes,
    cache_per_layer: &[u64],
    world: usize,
    counts: Option<&[usize]>,
) -> Result<Vec<Range<usize>>> {
    const OP: &str = "layer split";
    let n = sizes.layers.len();
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
    if let Some(counts) = counts {
        return user_split(counts, n, world);
    }
    let cost = |l: usize| sizes.layers[l] + cache_per_layer.get(l).copied().unwrap_or(0);
    // prefix[j]: the cost of blocks 0..j.
    let mut prefix = vec![0u64; n + 1];
    for l in 0..n {
        prefix[l + 1] = prefix[l] + cost(l);
    }
    let stage_cost = |i: usize, j: usize| prefix[j] - prefix[i] + if j == n { sizes.head } else { 0 };
    // best[k][j]: the smallest largest-stage cost of blocks 0..j over k stages;
    // cut[k][j]: where the last of those stages starts.
    let mut best = vec![vec![u64::MAX; n + 1]; world + 1];
    let mut cut = vec![vec![0usize; n + 1]; world + 1];
    best[0][0] = 0;
    for k in 1..=world {
        for j in k..=n {
            for i in (k - 1)..j {
                if best[k - 1][i] == u64::MAX {
                    continue;
                }
                let c = best[k - 1][i].max(stage_cost(i, j));
                if c < best[k][j] {
                    best[k][j] = c;
                    cut[k][j] = i;
                }
            }
        }
    }
    let mut ranges = vec![0..0; world];
    let mut end = n;
    for k in (1..=world).rev() {
        let start = cut[k][end];
        ranges[k - 1] = start..end;
        end = start;
    }
    Ok(ranges)
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
        StageSizes { embed: 1000, head, layers: layers.to_vec(), kv_per_position: vec![0; layers.len()] }
    }

    #[test]
    fn equal_blocks_split_evenly_and_the_head_weighs_on_the_last_stage() {
        let s = sizes(&[10; 8], 0);
        assert_eq!(split_layers(&s, &[], 2, None).unwrap(), [0..4, 4..8]);
        assert_eq!(split_layers(&s, &[], 1, None).unwrap(), vec![0..8]);
        assert_eq!(split_layers(&s, &[], 8, None).unwrap().len(), 8);
        // A head worth 3.5 blocks moves blocks to the first stage.
        let s = sizes(&[10; 8], 35);
        assert_eq!(split_layers(&s, &[], 2, None).unwrap(), [0..6, 6..8]);
        // Caches count like weights.
        let s = sizes(&[10; 4], 0);
        assert_eq!(split_layers(&s, &[0, 0, 30, 30], 2, None).unwrap(), [0..3, 3..4]);
    }

    #[test]
    fn bad_splits_are_refused_with_what_was_expected() {
        let s = sizes(&[10; 4], 0);
        let e = split_layers(&s, &[], 5, None).unwrap_err().to_string();
        assert!(e.contains("1..=4") && e.contains('5'), "{e}");
        assert!(split_layers(&s, &[], 0, None).is_err());
        assert_eq!(split_layers(&s, &[], 2, Some(&[1, 3])).unwrap(), [0..1, 1..4]);
        let e = split_layers(&s, &[], 2, Some(&[2, 1])).unwrap_err().to_string();
        assert!(e.contains("adding up to the model's 4"), "{e}");
        let e = split_layers(&s, &[], 2, Some(&[4, 0])).unwrap_err().to_string();
        assert!(e.contains("stage 1") && e.contains("at least one block"), "{e}");
        let e = split_layers(&s, &[], 2, Some(&[4])).unwrap_err().to_string();
        assert!(e.contains("one per process (2)"), "{e}");
        assert!(split_layers(&s, &[1, 2], 2, None).is_err());
        assert_eq!(parse_layer_split("10, 14").unwrap(), [10, 14]);
        assert!(parse_layer_split("10,x").unwrap_err().to_string().contains("10,x"));
        assert!(parse_layer_split("").is_err());
    }
}
