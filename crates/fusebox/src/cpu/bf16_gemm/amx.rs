//! The AMX form of the BF16 GEMM: `tdpbf16ps` multiplies a 16×32 BF16 tile of A by a
//! 32×16 tile of B (16 rows of pairs) into a 16×16 f32 tile, 8,192 multiply-adds per
//! instruction against `vdpbf16ps`'s 32.
//!
//! Blocking: the Goto loops of [`serial`](super::serial) with B packed as before (strips
//! of [`NR`] columns, one row of pair words per pair of k: a B tile is 16 consecutive
//! pair rows of 16 columns, loaded at a stride of `NR` words) and A packed here row by
//! row (`kp` pair words per row, rows padded with zeros to a multiple of 32: an A tile is
//! 16 rows of 16 consecutive pairs). A block of 32×32 of C lives in tiles 0–3 while the k
//! loop streams A tiles (4, 5) and B tiles (6, 7) through them, over up to [`GROUP`] k
//! blocks before it is stored (C read and written once per 4,096 k, not per block: on
//! GPT-2 124M's 8 × 256 bf16 step, 3.12–3.24 s against 3.64–3.73). Pairs past the last
//! whole 16 (`kp mod 16`) are added by `vdpbf16ps` after the tiles are stored. The tile
//! loads wait on L2 otherwise, so each step prefetches the operands of the step two
//! ahead into L1 (GPT-2's linear products, forward and backward: about 10% faster).
//!
//! Rounding: operands as the other kernels (BF16, round to nearest even, zero padding);
//! each tile instruction adds its 32 products in order into f32 with round to nearest
//! even and denormals flushed, as `vdpbf16ps` does, so the kernels agree within f32
//! rounding of the accumulation order.
//!
//! Hazard: the tile registers hold state across `asm!` blocks (configuration, then
//! accumulators across the k loop). Nothing else on the thread uses AMX, and the
//! compiler never allocates tile registers, so the state survives between the blocks of
//! one [`serial_amx`] call, which configures the tiles first and releases them last.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::kernel_x86::{pair_words, transpose_words};
use super::pack::{bf16_bits, pack_b, pack_run_pairs};
use super::{Operand, View, KC, NC, NR};

/// Rows (and columns) of C per AMX block: two tiles of 16 each way.
const BLOCK: usize = super::AMX_ROWS;
/// Rows per packed block of A (`MC_AMX · KC` BF16: 64 KiB, in L2).
const MC_AMX: usize = 128;
/// Pairs of k per tile instruction (a tile row of 64 bytes).
const TILE_PAIRS: usize = 16;
/// Words of one packed panel of A (`MC_AMX` rows, `KC/2` pairs) and of B (`NC` columns).
const PANEL_A: usize = MC_AMX * KC / 2;
const PANEL_B: usize = NC.next_multiple_of(NR) * KC / 2;
/// k blocks a block of C stays in the tiles for (loaded or zeroed once, stored once):
/// k up to 4,096 per pass, and at most `GROUP` panels of B (8 MiB) packed per thread.
const GROUP: usize = 16;
/// Tile steps ahead that [`block`] prefetches into L1 (1 and 3 ran slower than 2).
const PREFETCH: usize = 2;

/// Whether this CPU and OS run AMX BF16 for this process, probed once: CPUID's
/// AMX-BF16 and AMX-TILE bits, the OS enabling the tile state (XCR0 bits 17 and 18),
/// and Linux granting the process its use (`arch_prctl(ARCH_REQ_XCOMP_PERM)`).
/// `FUSEBOX_AMX=0` turns it off (to compare with the `vdpbf16ps` kernel).
pub fn has_amx_bf16() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if std::env::var("FUSEBOX_AMX").is_ok_and(|v| v == "0") {
            return false;
        }
        if !super::has_avx512_bf16() || !std::arch::is_x86_feature_detected!("xsave") {
            return false;
        }
        // SAFETY: CPUID leaf 7 exists on every CPU with AVX-512; XGETBV is available
        // with XSAVE (checked) and the OS having enabled it (OSXSAVE, implied by
        // AVX-512 being usable).
        let (leaf7, xcr0) = unsafe { (__cpuid_count(7, 0), _xgetbv(0)) };
        let cpu = leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0;
        let os = xcr0 & (0b11 << 17) == 0b11 << 17;
        cpu && os && request_tile_data()
    })
}

/// Asks Linux for the tile data state (`ARCH_REQ_XCOMP_PERM`, `XFEATURE_XTILEDATA`),
/// process-wide; other systems are not asked and get no AMX.
fn request_tile_data() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn full() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64; // bytes per row (little-endian u16)
            c[48 + t] = 16; // rows
        }
        TileConfig(c)
    }
}

/// Packs rows `i0..i0+mc` and k `k0..k0+kc` of A row by row: `out[r·kp + p] =
/// pair(a(i0+r, k0+2p), a(i0+r, k0+2p+1))`, kp = ⌈kc/2⌉, rows past `mc` up to a multiple
/// of [`BLOCK`] zero. Rows contiguous along k convert 32 values per instruction; columns
/// contiguous (A transposed) convert 16 rows at a pair and transpose 16 × 16 words.
fn pack_a_rows(a: View<'_>, i0: usize, mc: usize, k0: usize, kc: usize, out: &mut [u32]) {
    let kp = kc.div_ceil(2);
    let rows = mc.next_multiple_of(BLOCK);
    out[mc * kp..rows * kp].fill(0);
    if a.cs == 1 {
        for r in 0..mc {
            pack_run_pairs(&a.data[(i0 + r) * a.rs + k0..][..kc], &mut out[r * kp..][..kp], 1);
        }
        return;
    }
    // Rows and pairs done by the transposing path (A transposed: 16 rows of a k run
    // contiguous); the rest one value at a time.
    let (mut rows_done, mut pairs_done) = (0, 0);
    if a.rs == 1 {
        (rows_done, pairs_done) = (mc / 16 * 16, kc / 32 * 16);
        for r0 in (0..rows_done).step_by(16) {
            for p0 in (0..pairs_done).step_by(16) {
                let col = |kk: usize| &a.data[kk * a.cs + i0 + r0..][..16];
                let first = &mut out[r0 * kp + p0..];
                assert!(first.len() > 15 * kp + 15, "bgemm (AMX): a packed panel is short");
                // SAFETY: `has_amx_bf16` (the only way here) implies AVX-512 F, BW and BF16; each
                // column slice holds 16 values; the 16 rows of 16 words at stride kp lie
                // in `first` (asserted).
                unsafe {
                    let words = std::array::from_fn(|q| {
                        let kk = k0 + 2 * (p0 + q);
                        pair_words(col(kk).as_ptr(), col(kk + 1).as_ptr())
                    });
                    transpose_words(words, first.as_mut_ptr(), kp);
                }
            }
        }
    }
    for r in 0..mc {
        let at = |kk: usize| if kk < k0 + kc { a.data[(i0 + r) * a.rs + kk * a.cs] } else { 0.0 };
        let first_pair = if r < rows_done { pairs_done } else { 0 };
        for p in first_pair..kp {
            let kk = k0 + 2 * p;
            out[r * kp + p] = bf16_bits(at(kk)) | (bf16_bits(at(kk + 1)) << 16);
        }
    }
}

/// [`super::serial`] with the AMX kernel: `c(i, j) (+)= a·b` for an `m×n` block,
/// `c(i, j) = c[i·ldc + j]`. A is a strided view (packed here); B a view or packed whole.
///
/// # Safety
/// [`has_amx_bf16`] must hold; `c` must be valid for reads (when `accumulate`) and writes
/// of the block, which no other thread touches; the views must hold their matrices.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn serial_amx(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: Operand<'_>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    thread_local! {
        /// Each thread's packed blocks of A (rows) and B (strips), kept between calls.
        static PACKED: std::cell::RefCell<(Vec<u32>, Vec<u32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let config = TileConfig::full();
        asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
        PACKED.with_borrow_mut(|(pa, pb)| {
            // Each block of A meets every block of columns: with more than one, every
            // panel of A is packed once, panel (pc, ic) at ((pc/KC)·blocks + ic/MC_AMX)
            // panels of PANEL_A words; else one group's panels at a time.
            let (a_blocks, a_whole) = (m.div_ceil(MC_AMX), n > NC);
            let k_blocks = k.div_ceil(KC);
            if a_whole {
                super::grow(pa, k_blocks * a_blocks * PANEL_A);
                for (kb, pc) in (0..k).step_by(KC).enumerate() {
                    for (ib, ic) in (0..m).step_by(MC_AMX).enumerate() {
                        let out = &mut pa[(kb * a_blocks + ib) * PANEL_A..][..PANEL_A];
                        pack_a_rows(a, ic, MC_AMX.min(m - ic), pc, KC.min(k - pc), out);
                    }
                }
            } else {
                super::grow(pa, GROUP.min(k_blocks) * PANEL_A);
            }
            if let Operand::View(_) = b {
                super::grow(pb, GROUP.min(k_blocks) * PANEL_B);
            }
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for g0 in (0..k_blocks).step_by(GROUP) {
                    let group = g0..GROUP.min(k_blocks - g0) + g0;
                    let kc_of = |kb: usize| KC.min(k - kb * KC);
                    let mut b_panels = [std::ptr::null(); GROUP];
                    for (slot, kb) in group.clone().enumerate() {
                        let kp = kc_of(kb).div_ceil(2);
                        let panel: &[u32] = match b {
                            Operand::View(v) => {
                                let out = &mut pb[slot * PANEL_B..][..PANEL_B];
                                pack_b(v, kb * KC, kc_of(kb), jc, nc, out);
                                out
                            }
                            Operand::Whole(w) => w.panel(jc, kb * KC),
                        };
                        assert!(panel.len() >= nc.next_multiple_of(NR) * kp, "bgemm (AMX): a packed panel is short");
                        b_panels[slot] = panel.as_ptr();
                    }
                    let add = accumulate || g0 > 0;
                    for ic in (0..m).step_by(MC_AMX) {
                        let mc = MC_AMX.min(m - ic);
                        let mut a_panels = [std::ptr::null(); GROUP];
                        for (slot, kb) in group.clone().enumerate() {
                            let panel: &[u32] = if a_whole {
                                &pa[(kb * a_blocks + ic / MC_AMX) * PANEL_A..][..PANEL_A]
                            } else {
                                let out = &mut pa[slot * PANEL_A..][..PANEL_A];
                                pack_a_rows(a, ic, mc, kb * KC, kc_of(kb), out);
                                out
                            };
                            a_panels[slot] = panel.as_ptr();
                        }
                        for jr in (0..nc).step_by(NR) {
                            for ir in (0..mc).step_by(BLOCK) {
                                let rows = BLOCK.min(mc - ir);
                                let panels: [Panel; GROUP] = std::array::from_fn(|slot| {
                                    let kp = group.clone().nth(slot).map_or(0, |kb| kc_of(kb).div_ceil(2));
                                    Panel {
                                        kp,
                                        a: a_panels[slot].wrapping_add(ir * kp),
                                        b: b_panels[slot].wrapping_add(jr / NR * kp * NR),
                                    }
                                });
                                let panels = &panels[..group.len()];
                                for jh in (0..NR.min(nc - jr)).step_by(BLOCK) {
                                    let cols = BLOCK.min(nc - jr - jh);
                                    let dst = c.add((ic + ir) * ldc + jc + jr + jh);
                                    if rows == BLOCK && cols == BLOCK {
                                        block(panels, jh, dst, ldc, add);
                                    } else {
                                        // A partial block runs whole in `edge`, from C's
                                        // values when adding, as a whole block does: an
                                        // element's bits do not depend on its block.
                                        let mut edge = [0f32; BLOCK * BLOCK];
                                        if add {
                                            for i in 0..rows {
                                                let row = std::slice::from_raw_parts(dst.add(i * ldc), cols);
                                                edge[i * BLOCK..][..cols].copy_from_slice(row);
                                            }
                                        }
                                        block(panels, jh, edge.as_mut_ptr(), BLOCK, add);
                                        for i in 0..rows {
                                            let row = std::slice::from_raw_parts_mut(dst.add(i * ldc), cols);
                                            row.copy_from_slice(&edge[i * BLOCK..][..cols]);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        });
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// One k block's operands for [`block`]: `kp` pairs, A's 32 rows of `kp` words from `a`,
/// B's `kp` pair rows at stride [`NR`] words from `b` (the strip's first column).
#[derive(Clone, Copy)]
struct Panel {
    kp: usize,
    a: *const u32,
    b: *const u32,
}

/// One 32×32 block of C over the k blocks of `panels` in turn: columns `jh .. jh + 32` of
/// each B strip, C at `c` with row stride `ldc`, stored (`!add`) or added to. C stays in
/// tiles 0–3 across the panels; only the last panel may end in a part of 16 pairs (the
/// others hold `KC/2`), added with `vdpbf16ps` after the store.
///
/// # Safety
/// The tiles are configured ([`TileConfig::full`]); each panel's `a` holds 32·kp words
/// and its `b` kp rows of `jh + 32` words at stride NR; `c` 32 rows of 32 values at
/// stride `ldc`; AVX-512 BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn block(panels: &[Panel], jh: usize, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let (ldb, ldc_b) = (NR * 4, ldc * 4);
        let c1 = c.add(16);
        let c2 = c.add(16 * ldc);
        let c3 = c2.add(16);
        if add {
            asm!(
                "tileloadd tmm0, [{c0} + {s}*1]",
                "tileloadd tmm1, [{c1} + {s}*1]",
                "tileloadd tmm2, [{c2} + {s}*1]",
                "tileloadd tmm3, [{c3} + {s}*1]",
                c0 = in(reg) c, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3, s = in(reg) ldc_b,
                options(nostack, readonly),
            );
        } else {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        }
        for p in panels {
            let (kp, a, b) = (p.kp, p.a, p.b.add(jh));
            let a_hi = a.add(16 * kp);
            let lda = kp * 4;
            for p0 in (0..kp / TILE_PAIRS * TILE_PAIRS).step_by(TILE_PAIRS) {
                // The step PREFETCH ahead, from L2 into L1 while this one computes: the
                // 32 rows of A's two tiles and B's 16 rows of 32 columns (64 lines).
                let ahead = p0 + PREFETCH * TILE_PAIRS;
                if ahead < kp {
                    for r in 0..BLOCK {
                        _mm_prefetch::<_MM_HINT_T0>(a.add(r * kp + ahead).cast());
                    }
                    // B's pair rows that exist (the last step may be a partial one).
                    for r in 0..TILE_PAIRS.min(kp - ahead) {
                        let row = b.add((ahead + r) * NR);
                        _mm_prefetch::<_MM_HINT_T0>(row.cast());
                        _mm_prefetch::<_MM_HINT_T0>(row.add(16).cast());
                    }
                }
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a.add(p0), a1 = in(reg) a_hi.add(p0),
                    b0 = in(reg) b.add(p0 * NR), b1 = in(reg) b.add(p0 * NR + 16),
                    sa = in(reg) lda, sb = in(reg) ldb,
                    options(nostack, readonly),
                );
            }
        }
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) c, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3, s = in(reg) ldc_b,
            options(nostack),
        );
        let Some(&Panel { kp, a, b }) = panels.last() else { return };
        let (b, whole) = (b.add(jh), kp / TILE_PAIRS * TILE_PAIRS);
        if whole == kp {
            return;
        }
        // The last kp mod 16 pairs, 32 rows × two vectors of 16 columns.
        for i in 0..BLOCK {
            let row = c.add(i * ldc);
            let mut acc = [_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))];
            for p in whole..kp {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i * kp + p) as i32));
                for (h, lane) in acc.iter_mut().enumerate() {
                    let bv: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16 * h).cast()));
                    *lane = _mm512_dpbf16_ps(*lane, av, bv);
                }
            }
            _mm512_storeu_ps(row, acc[0]);
            _mm512_storeu_ps(row.add(16), acc[1]);
        }
    }
}
