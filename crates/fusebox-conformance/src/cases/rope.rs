//! Cases of the rope family: both pair conventions against the f64 twin in F32, F16
//! and BF16 (head dims with odd pair counts, decode steps T = 1 at an offset, a
//! threaded size), the backward by finite differences and against the twin, the
//! round trip `rope_backward(rope(x)) = x`, and bad inputs.

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, RopeStyle, Tensor};

use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::rope as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
const STYLES: [RopeStyle; 2] = [RopeStyle::HalfSplit, RopeStyle::Interleaved];

/// `(x shape [B, H, T, D], table positions P, offset, rotated pairs R/2)` of the
/// forward cases; `R < D` is partial rotary (the last dims pass through).
const FORWARD_CONFIGS: &[([usize; 4], usize, usize, usize)] = &[
    ([2, 3, 5, 16], 5, 0, 8),
    ([1, 2, 7, 134], 12, 3, 67),
    ([1, 4, 1, 128], 10, 9, 64),
    ([2, 3, 1, 6], 40, 37, 3),
    ([2, 8, 32, 128], 64, 16, 64),
    ([1, 2, 6, 64], 8, 2, 8),
    ([2, 2, 1, 24], 9, 8, 5),
];

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for style in STYLES {
        cases.extend(forward_cases(style));
        cases.extend(backward_cases(style));
        cases.push(round_trip_case(style));
    }
    cases.extend(bad_value_cases());
    cases
}

/// Standard rotary tables: `θ_i = 10000^(−i/half)`, `cos[p, i] = cos(p·θ_i)`, `sin` likewise.
fn tables(positions: usize, half: usize) -> (Tensor, Tensor) {
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for i in 0..half {
            let angle = p as f64 * 10000f64.powf(-(i as f64) / half as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (
        Tensor::from_vec(cos, [positions, half]).expect("table shape"),
        Tensor::from_vec(sin, [positions, half]).expect("table shape"),
    )
}

fn rng_for(tag: &str) -> Rng {
    Rng::new(tag.bytes().fold(0x20e_u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)))
}

/// The rotary tables as inputs: F32 in every dtype variant, never differentiated.
fn table_input(t: Tensor) -> Input {
    Input::new(t).keep_f32().constant()
}

fn forward_cases<B: ComputeBackend + ?Sized + 'static>(style: RopeStyle) -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for &(shape, positions, offset, pairs) in FORWARD_CONFIGS {
        let name = format!("{style:?} x{shape:?} P={positions} offset={offset} R/2={pairs}");
        let x = rng_for(&name).normal_ish(shape);
        let (cos, sin) = tables(positions, pairs);
        cases.extend(
            OpCase::<B>::new(Op::Rope, name)
                .input(x)
                .input(table_input(cos))
                .input(table_input(sin))
                .call(move |b, t| Ok(vec![b.rope(&t[0], &t[1], &t[2], style, offset)?]))
                .twin(move |a| vec![twin::rope(&a[0], &a[1], &a[2], style, offset)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    cases
}

fn backward_cases<B: ComputeBackend + ?Sized + 'static>(style: RopeStyle) -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Finite differences on tiny shapes at an offset, whole and partial rotary. The
    // backward reads only d_out and the tables, so x itself is free of shape and dtype
    // checks there.
    for pairs in [4, 2] {
        let (shape, positions, offset) = ([1usize, 2, 3, 8], 6, 2);
        let name = format!("{style:?} x{shape:?} P={positions} offset={offset} R/2={pairs}");
        let x = rng_for(&name).normal_ish(shape);
        let (cos, sin) = tables(positions, pairs);
        cases.extend(
            GradCase::<B>::new(Op::RopeBackward, name)
                .input(Input::new(x).shape_free().dtype_free())
                .input(table_input(cos))
                .input(table_input(sin))
                .forward(move |a| twin::rope(&a[0], &a[1], &a[2], style, offset))
                .backward_twin(move |a, dy| vec![twin::rope_backward(dy, &a[1], &a[2], style, offset)])
                .backward_call(move |b, t, dy| Ok(vec![b.rope_backward(dy, &t[1], &t[2], style, offset)?]))
                .build(),
        );
    }
    // Against the twin in every dtype, with tails, a decode step and the threaded size.
    for &(shape, positions, offset, pairs) in &FORWARD_CONFIGS[1..] {
        let name = format!("{style:?} d_out{shape:?} P={positions} offset={offset} R/2={pairs}");
        let dy = rng_for(&name).normal_ish(shape);
        let (cos, sin) = tables(positions, pairs);
        cases.extend(
            OpCase::<B>::new(Op::RopeBackward, name)
                .input(dy)
                .input(table_input(cos))
                .input(table_input(sin))
                .call(move |b, t| Ok(vec![b.rope_backward(&t[0], &t[1], &t[2], style, offset)?]))
                .twin(move |a| vec![twin::rope_backward(&a[0], &a[1], &a[2], style, offset)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    cases
}

/// Property: the rotation is orthogonal, so `rope_backward(rope(x)) = x`.
fn round_trip_case<B: ComputeBackend + ?Sized + 'static>(style: RopeStyle) -> Case<B> {
    let (shape, positions, offset) = ([2usize, 2, 9, 70], 20, 7);
    let name = format!("{style:?} x{shape:?} P={positions} offset={offset}: rope_backward(rope(x)) = x");
    let x = rng_for(&name).normal_ish(shape);
    let (cos, sin) = tables(positions, shape[3] / 2);
    Case::custom(Op::Rope, CaseKind::Property, name, move |b: &B| {
        let run = || -> FbResult<Vec<f32>> {
            let (xd, c, s) = (b.upload(&x)?, b.upload(&cos)?, b.upload(&sin)?);
            let y = b.rope(&xd, &c, &s, style, offset)?;
            let back = b.rope_backward(&y, &c, &s, style, offset)?;
            b.to_host(&back)?.to_vec_f32()
        };
        let back = run().map_err(|e| e.to_string())?;
        let want = x.to_vec_f32().map_err(|e| e.to_string())?;
        let tol = Tolerance::F32;
        match back.iter().zip(&want).position(|(&g, &w)| ((g - w).abs() as f64) > tol.abs + tol.rel * w.abs() as f64) {
            None => Ok(()),
            Some(i) => Err(format!("element {i}: got {}, x was {}", back[i], want[i])),
        }
    })
}

/// Bad values the shape/dtype generator cannot make: positions past the table, odd head
/// dims, f16 tables, mismatched tables, wrong ranks.
fn bad_value_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = rng_for("rope bad");
    let x = rng.normal_ish([1, 2, 4, 8]);
    let (cos, sin) = tables(6, 4);
    let f16 =
        |t: &Tensor| Tensor::from_f32_as(&t.to_vec_f32().expect("f32"), t.shape().clone(), DType::F16).expect("f16");
    let (cos5, sin5) = tables(6, 5);
    let bad: Vec<(&str, [Tensor; 3], usize)> = vec![
        ("offset 3 + T 4 > P 6", [x.clone(), cos.clone(), sin.clone()], 3),
        ("offset = usize::MAX", [x.clone(), cos.clone(), sin.clone()], usize::MAX),
        ("odd D = 5", [rng.normal_ish([1, 1, 2, 5]), tables(6, 2).0, tables(6, 2).1], 0),
        ("odd D = 5 with tables [P, 3]", [rng.normal_ish([1, 1, 2, 5]), tables(6, 3).0, tables(6, 3).1], 0),
        ("cos f16 (tables are f32)", [x.clone(), f16(&cos), sin.clone()], 0),
        ("sin f16 with x f16", [f16(&x), cos.clone(), f16(&sin)], 0),
        ("sin [5, 4] with cos [6, 4]", [x.clone(), cos.clone(), tables(5, 4).1], 0),
        ("tables [P, D/2 + 1]", [x.clone(), cos5, sin5], 0),
        ("tables [P, D] instead of [P, D/2]", [x.clone(), tables(6, 8).0, tables(6, 8).1], 0),
        ("tables [P, 0] (no rotated pair)", [x.clone(), tables(6, 0).0, tables(6, 0).1], 0),
        ("x of rank 3", [x.reshape([2, 4, 8]).expect("same size"), cos.clone(), sin.clone()], 0),
        ("cos of rank 1", [x.clone(), cos.reshape([24]).expect("same size"), sin.clone()], 0),
    ];
    let mut cases = Vec::new();
    for (name, ts, offset) in bad {
        for style in STYLES {
            let ts2 = ts.clone();
            cases.push(Case::<B>::expect_error(Op::Rope, format!("rope {style:?} {name}"), move |b| {
                let (x, c, s) = (b.upload(&ts2[0])?, b.upload(&ts2[1])?, b.upload(&ts2[2])?);
                b.rope(&x, &c, &s, style, offset).map(|_| ())
            }));
            let ts2 = ts.clone();
            cases.push(Case::<B>::expect_error(
                Op::RopeBackward,
                format!("rope_backward {style:?} {name}"),
                move |b| {
                    let (dy, c, s) = (b.upload(&ts2[0])?, b.upload(&ts2[1])?, b.upload(&ts2[2])?);
                    b.rope_backward(&dy, &c, &s, style, offset).map(|_| ())
                },
            ));
        }
    }
    cases
}
