//! BPE merging inside one pre-tokenized piece.
//!
//! The piece starts as one symbol per byte; the adjacent pair whose merge has the
//! lowest rank (the earliest line of the merges list) is merged first, the
//! leftmost such pair on ties, until no adjacent pair has a merge. A heap of
//! candidate pairs keeps this O(n log n), so a piece of a million spaces is no
//! slower per byte than a word. The order and the stale-entry rule follow
//! Hugging Face `tokenizers` (`Word::merge_all`), which is the reference here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge table: `(left id, right id) → (rank, merged id)`.
pub(crate) type Merges = HashMap<(u32, u32), (u32, u32)>;

/// One symbol of the piece being merged, in a doubly linked list over a vector.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    /// False once merged into its left neighbour.
    alive: bool,
}

/// Merges the symbols `ids` in place by `merges` and appends the result to `out`.
pub(crate) fn merge_into(ids: &[u32], merges: &Merges, out: &mut Vec<u32>) {
    if ids.len() <= 1 {
        out.extend_from_slice(ids);
        return;
    }
    let n = ids.len();
    let mut syms: Vec<Symbol> = (0..n)
        .map(|i| Symbol {
            id: ids[i],
            prev: i.checked_sub(1),
            next: if i + 1 < n { Some(i + 1) } else { None },
            alive: true,
        })
        .collect();

    // (rank, position of the left symbol, merged id), smallest rank then position first.
    let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::new();
    for i in 0..n - 1 {
        if let Some(&(rank, new_id)) = merges.get(&(ids[i], ids[i + 1])) {
            heap.push(Reverse((rank, i, new_id)));
        }
    }

    while let Some(Reverse((_, pos, new_id))) = heap.pop() {
        let left = syms[pos];
        if !left.alive {
            continue;
        }
        let Some(right_pos) = left.next else { continue };
        let right = syms[right_pos];
        // The entry is stale when the pair at `pos` no longer merges into `new_id`.
        match merges.get(&(left.id, right.id)) {
            Some(&(_, id)) if id == new_id => {}
            _ => continue,
        }
        syms[pos].id = new_id;
        syms[pos].next = right.next;
        syms[right_pos].alive = false;
        if let Some(after) = right.next {
            syms[after].prev = Some(pos);
        }
        if let Some(before) = left.prev {
            if let Some(&(rank, id)) = merges.get(&(syms[before].id, new_id)) {
                heap.push(Reverse((rank, before, id)));
            }
        }
        if let Some(after) = right.next {
            if let Some(&(rank, id)) = merges.get(&(new_id, syms[after].id)) {
                heap.push(Reverse((rank, pos, id)));
            }
        }
    }

    let mut cur = Some(0);
    while let Some(i) = cur {
        out.push(syms[i].id);
        cur = syms[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_lowest_rank_first_then_leftmost() {
        // ids: a=0 b=1 c=2 ab=3 bc=4 abc=5
        let mut m = Merges::new();
        m.insert((1, 2), (0, 4)); // "b c" rank 0
        m.insert((0, 1), (1, 3)); // "a b" rank 1
        m.insert((0, 4), (2, 5)); // "a bc" rank 2
        let mut out = Vec::new();
        merge_into(&[0, 1, 2], &m, &mut out);
        assert_eq!(out, [5]);
        out.clear();
        merge_into(&[0, 1, 0, 1], &m, &mut out);
        assert_eq!(out, [3, 3]);
        out.clear();
        merge_into(&[1, 1, 1], &Merges::new(), &mut out);
        assert_eq!(out, [1, 1, 1]);
    }
}
