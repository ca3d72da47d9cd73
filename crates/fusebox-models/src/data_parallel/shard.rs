//! ZeRO's cut of the trained tensors over the ranks: the tensors, flattened one after
//! another in spec order into one vector of `P` values, are cut into one consecutive piece
//! per rank ([`ShardLayout`]); rank `r` owns the AdamW moments (and, after the
//! reduce-scatter, the averaged gradient) of its piece only. After each rank has updated
//! its piece of the parameters, [`all_gather_params`] gives every rank all of them again.
//!
//! A piece of the flat vector may start and end inside a tensor; [`ShardLayout::pieces`]
//! names the parts of tensors a flat range covers.

use std::ops::Range;

use fusebox::{ComputeBackend, Error, Result, Tensor};

use crate::comm::Communicator;
use crate::params::ParamSet;

/// Longest window of a tensor one buffer of the parameters' all-gather holds (a C `int`
/// of MPI counts bounds it).
pub const GATHER_ELEMS: usize = 1 << 28;

/// Where each rank's piece of the flattened trained tensors lies (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// Where each tensor starts in the flat vector, and (last) the total `P`.
    starts: Vec<usize>,
    /// Each rank's range of the flat vector: consecutive, covering `0..P`.
    ranges: Vec<Range<usize>>,
}

/// The part `offset .. offset + len` of tensor `tensor`, which is `flat .. flat + len` of
/// the flat vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's index (in spec order).
    pub tensor: usize,
    /// First element within the tensor.
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// First element within the flat vector.
    pub flat: usize,
}

impl ShardLayout {
    /// Tensors of `sizes` elements cut evenly over `world` ranks: rank `r` gets
    /// `⌊r·P/world⌋ .. ⌊(r+1)·P/world⌋` (pieces differ by at most one element).
    pub fn even(sizes: &[usize], world: usize) -> Result<ShardLayout> {
        if world == 0 {
            return Err(Error::value("ShardLayout", "world size", "at least 1", 0));
        }
        let starts = starts_of(sizes);
        let total = starts[sizes.len()] as u128;
        let cut = |r: usize| (total * r as u128 / world as u128) as usize;
        let ranges = (0..world).map(|r| cut(r)..cut(r + 1)).collect();
        Ok(ShardLayout { starts, ranges })
    }

    /// Tensors of `sizes` elements cut at given `ranges` (read from a checkpoint's
    /// manifest): an error unless they are consecutive and cover every element.
    pub fn from_ranges(sizes: &[usize], ranges: Vec<Range<usize>>) -> Result<ShardLayout> {
        let starts = starts_of(sizes);
        let total = starts[sizes.len()];
        let mut at = 0;
        for (r, range) in ranges.iter().enumerate() {
            if range.start != at || range.end < range.start {
                return Err(Error::value(
                    "ShardLayout",
                    format!("range of rank {r}"),
                    format!("{at}..N, following the previous rank's"),
                    format!("{}..{}", range.start, range.end),
                ));
            }
            at = range.end;
        }
        if at != total || ranges.is_empty() {
            return Err(Error::value(
                "ShardLayout",
                "ranges",
                format!("covering 0..{total}"),
                format!("ending at {at}"),
            ));
        }
        Ok(ShardLayout { starts, ranges })
    }

    /// The ranks.
    pub fn world(&self) -> usize {
        self.ranges.len()
    }

    /// Elements of all tensors together, `P`.
    pub fn total(&self) -> usize {
        *self.starts.last().unwrap_or(&0)
    }

    /// Rank `rank`'s range of the flat vector.
    pub fn range(&self, rank: usize) -> Range<usize> {
        self.ranges.get(rank).cloned().unwrap_or(0..0)
    }

    /// Every rank's range, in rank order.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Elements of each rank's range, in rank order (the counts of a reduce-scatter).
    pub fn counts(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// Tensors laid out.
    pub fn tensors(&self) -> usize {
        self.starts.len() - 1
    }

    /// Tensor `i`'s range of the flat vector.
    pub fn tensor_range(&self, i: usize) -> Range<usize> {
        self.starts[i]..self.starts[i + 1]
    }

    /// The parts of tensors the flat range `flat` covers, in order, each at most
    /// `max_len` elements long (a tensor's part longer than that is split).
    pub fn pieces(&self, flat: Range<usize>, max_len: usize) -> Vec<Piece> {
        let max_len = max_len.max(1);
        let mut out = Vec::new();
        // The first tensor that ends after `flat.start`.
        let first = self.starts.partition_point(|&s| s <= flat.start).saturating_sub(1);
        for tensor in first..self.starts.len() - 1 {
            let t = self.tensor_range(tensor);
            if t.start >= flat.end {
                break;
            }
            let (lo, hi) = (t.start.max(flat.start), t.end.min(flat.end));
            let mut at = lo;
            while at < hi {
                let len = (hi - at).min(max_len);
                out.push(Piece { tensor, offset: at - t.start, len, flat: at });
                at += len;
            }
        }
        out
    }
}

/// Where each of tensors of `sizes` starts in their concatenation, and the total last.
fn starts_of(sizes: &[usize]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(sizes.len() + 1);
    let mut at = 0;
    starts.push(0);
    for &n in sizes {
        at += n;
        starts.push(at);
    }
    starts
}

/// Elements `range` of tensor `t` (f32, any backend), on the host.
pub fn read_range(b: &dyn ComputeBackend, t: &Tensor, range: Range<usize>) -> Result<Vec<f32>> {
    if t.is_host() {
        Ok(t.as_slice::<f32>()?[range].to_vec())
    } else {
        Ok(b.to_host(t)?.as_slice::<f32>()?[range].to_vec())
    }
}

/// Writes `values` into tensor `t` (f32, any backend) from element `offset` on.
pub fn write_range(b: &dyn ComputeBackend, t: &mut Tensor, offset: usize, values: &[f32]) -> Result<()> {
    let end = offset + values.len();
    if end > t.elem_count() {
        return Err(Error::shape("write_range", "range", format!("within {} elements", t.elem_count()), end));
    }
    if t.is_host() {
        t.as_mut_slice::<f32>()?[offset..end].copy_from_slice(values);
    } else {
        let mut host = b.to_host(t)?;
        host.as_mut_slice::<f32>()?[offset..end].copy_from_slice(values);
        let src = b.upload(&host)?;
        b.copy_into(t, &src)?;
    }
    Ok(())
}

/// Gives every rank every rank's piece of `params` (laid out as `layout`), gathered in
/// place: each tensor (in windows of at most [`GATHER_ELEMS`]) is one buffer of
/// [`Communicator::all_gather_in_place`], this rank's part already where it belongs, the
/// others' parts received straight into the tensor's storage. Tensors off the host are
/// gathered through a host copy of each. Nothing moves in a world of one.
pub fn all_gather_params(
    b: &dyn ComputeBackend,
    comm: &dyn Communicator,
    layout: &ShardLayout,
    params: &mut ParamSet,
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let mut staged: Vec<Option<Vec<f32>>> = params
        .tensors
        .iter()
        .map(|t| if t.is_host() { Ok(None) } else { Ok(Some(b.to_host(t)?.to_vec::<f32>()?)) })
        .collect::<Result<_>>()?;
    let mut bufs: Vec<&mut [f32]> = Vec::new();
    let mut counts: Vec<Vec<usize>> = Vec::new();
    for (i, (t, host)) in params.tensors.iter_mut().zip(&mut staged).enumerate() {
        let values = match host {
            Some(v) => v.as_mut_slice(),
            None => t.as_mut_slice::<f32>()?,
        };
        let mut start = layout.tensor_range(i).start;
        for window in values.chunks_mut(GATHER_ELEMS) {
            let flat = start..start + window.len();
            counts.push(
                layout.ranges().iter().map(|r| flat.end.min(r.end).saturating_sub(flat.start.max(r.start))).collect(),
            );
            bufs.push(window);
            start = flat.end;
        }
    }
    comm.all_gather_in_place(&mut bufs, &counts)?;
    drop(bufs);
    for (t, host) in params.tensors.iter_mut().zip(&staged) {
        if let Some(v) = host {
            write_range(b, t, 0, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_even_cut_covers_every_element_once_and_pieces_follow_the_tensors() {
        let sizes = [5, 3, 0, 4];
        let l = ShardLayout::even(&sizes, 3).unwrap();
        assert_eq!(l.ranges(), &[0..4, 4..8, 8..12]);
        assert_eq!(l.counts(), [4, 4, 4]);
        assert_eq!(
            l.pieces(4..8, usize::MAX),
            [Piece { tensor: 0, offset: 4, len: 1, flat: 4 }, Piece { tensor: 1, offset: 0, len: 3, flat: 5 }]
        );
        assert_eq!(
            l.pieces(8..12, 3),
            [Piece { tensor: 3, offset: 0, len: 3, flat: 8 }, Piece { tensor: 3, offset: 3, len: 1, flat: 11 }]
        );
        assert!(l.pieces(3..3, 8).is_empty());
        // More ranks than elements: some own nothing.
        let l = ShardLayout::even(&[2], 3).unwrap();
        assert_eq!(l.ranges(), &[0..0, 0..1, 1..2]);
        assert!(ShardLayout::even(&[2], 0).is_err());
    }

    #[test]
    fn ranges_from_a_manifest_must_be_consecutive_and_cover_everything() {
        assert!(ShardLayout::from_ranges(&[4, 4], vec![0..3, 3..8]).is_ok());
        let e = ShardLayout::from_ranges(&[4, 4], vec![0..3, 4..8]).unwrap_err().to_string();
        assert!(e.contains("rank 1"), "{e}");
        let e = ShardLayout::from_ranges(&[4, 4], vec![0..3, 3..7]).unwrap_err().to_string();
        assert!(e.contains("covering 0..8"), "{e}");
    }
}
