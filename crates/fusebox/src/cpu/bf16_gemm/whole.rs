//! Operands packed whole, once per product: every panel `pack_a` / `pack_b` would write
//! for the blocked loops, laid out one after another, so that threads sharing an
//! operand read one packed copy (packed by all of them together) and a thread whose
//! block of A meets several column blocks packs it once instead of once per block.
//!
//! Layout: the operand's `len` rows (A) or columns (B) form outer blocks of [`MC`] rows
//! or [`NC`] columns (multiples of the strip width), each split into k blocks of [`KC`].
//! Panel `(o0, k0)` — outer block from `o0`, k block from `k0` — holds
//! `pad(min(block, len − o0))·⌈kc/2⌉` words at offset `o0·⌈k/2⌉ + pad(..)·k0/2`, with
//! `pad` rounding up to the strip width: the blocks before it are whole, and each k block
//! before it holds `KC/2` pairs per row or column. The panel's words are exactly what
//! `pack_a` / `pack_b` write for that block, so a product reading them is bit-identical
//! to one that packs as it goes.

use super::pack::{pack_a, pack_b};
use super::{View, KC, MC, MR, NC, NR};
use crate::cpu::pool::SharedMut;
use crate::cpu::CpuBackend;

/// Which operand of `c = a·b`: A, packed in strips of [`MR`] rows and blocks of [`MC`],
/// or B, in strips of [`NR`] columns and blocks of [`NC`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    A,
    B,
}

impl Side {
    /// Rows (A) or columns (B) per strip.
    fn unit(self) -> usize {
        match self {
            Side::A => MR,
            Side::B => NR,
        }
    }

    /// Rows (A) or columns (B) per outer block.
    pub(super) fn block(self) -> usize {
        match self {
            Side::A => MC,
            Side::B => NC,
        }
    }

    /// Rows or columns per parallel packing task: a multiple of the strip width that
    /// divides the outer block.
    fn chunk(self) -> usize {
        match self {
            Side::A => MC,
            Side::B => 4 * NR,
        }
    }

    /// Packs rows / columns `o0 .. o0 + len` and k `k0 .. k0 + kc` of `v` into `out`.
    fn pack(self, v: View<'_>, o0: usize, len: usize, k0: usize, kc: usize, out: &mut [u32]) {
        match self {
            Side::A => pack_a(v, o0, len, k0, kc, out),
            Side::B => pack_b(v, k0, kc, o0, len, out),
        }
    }
}

/// Words a whole operand of `len` rows or columns and depth `k` takes.
pub(super) fn words(side: Side, len: usize, k: usize) -> usize {
    len.next_multiple_of(side.unit()) * k.div_ceil(2)
}

/// A whole packed operand (see the module's layout).
#[derive(Clone, Copy)]
pub(super) struct Whole<'a> {
    words: &'a [u32],
    side: Side,
    len: usize,
    /// Pairs along all of k, `⌈k/2⌉` (KC is even, so each k block but the last holds
    /// `KC/2`).
    pairs: usize,
}

impl<'a> Whole<'a> {
    /// The operand packed in `words` (as [`pack`] or [`pack_parallel`] left it).
    pub(super) fn new(words: &'a [u32], side: Side, len: usize, k: usize) -> Self {
        assert!(words.len() >= self::words(side, len, k), "bgemm: a packed operand is short");
        Whole { words, side, len, pairs: k.div_ceil(2) }
    }

    /// Panel `(o0, k0)`: the words `pack_a` / `pack_b` write for the outer block from
    /// `o0` and the k block from `k0` (both block starts).
    pub(super) fn panel(&self, o0: usize, k0: usize) -> &'a [u32] {
        let padded = self.side.block().min(self.len - o0).next_multiple_of(self.side.unit());
        &self.words[o0 * self.pairs + padded * k0 / 2..]
    }
}

/// Offset and length of the words of rows / columns `o0 .. o0 + len` (inside one outer
/// block, starting on a strip) in k block `k0 .. k0 + kc`, for an operand of `total`
/// rows or columns and `pairs` pairs along k.
fn span(side: Side, total: usize, pairs: usize, o0: usize, len: usize, k0: usize, kc: usize) -> (usize, usize) {
    let block0 = o0 / side.block() * side.block();
    let padded = side.block().min(total - block0).next_multiple_of(side.unit());
    let strip = (o0 - block0) / side.unit();
    let kp = kc.div_ceil(2);
    (block0 * pairs + padded * k0 / 2 + strip * kp * side.unit(), len.next_multiple_of(side.unit()) * kp)
}

/// Packs all of `v` (`len` rows or columns, depth `k`) into `out` on the calling thread.
pub(super) fn pack(side: Side, v: View<'_>, len: usize, k: usize, out: &mut [u32]) {
    let pairs = k.div_ceil(2);
    for o0 in (0..len).step_by(side.block()) {
        let olen = side.block().min(len - o0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let (at, n) = span(side, len, pairs, o0, olen, k0, kc);
            side.pack(v, o0, olen, k0, kc, &mut out[at..at + n]);
        }
    }
}

/// [`pack`] split over `cpu`'s threads: one task per chunk of rows or columns and k block.
pub(super) fn pack_parallel(cpu: &CpuBackend, side: Side, v: View<'_>, len: usize, k: usize, out: &mut [u32]) {
    let pairs = k.div_ceil(2);
    assert!(out.len() >= words(side, len, k), "bgemm: packed operand buffer is short");
    let chunks = len.div_ceil(side.chunk());
    let k_blocks = k.div_ceil(KC);
    let base = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(chunks * k_blocks, side.chunk() * KC, |task| {
        let (chunk, kb) = (task / k_blocks, task % k_blocks);
        let (o0, k0) = (chunk * side.chunk(), kb * KC);
        let (olen, kc) = (side.chunk().min(len - o0), KC.min(k - k0));
        let (at, n) = span(side, len, pairs, o0, olen, k0, kc);
        // SAFETY: the chunks are whole strips inside one outer block, so the spans of
        // different (chunk, k block) tasks are disjoint, and each lies inside the
        // operand's `words(side, len, k)` words (asserted above); each task runs once.
        side.pack(v, o0, olen, k0, kc, unsafe { base.slice(at, n) });
    });
}
