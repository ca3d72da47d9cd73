//! Cases of the layout family: reshape, permute, transpose, slice (+ backward), select,
//! concat, expand. Layout ops move elements without arithmetic, so results must be exact
//! and every plain dtype is valid (inputs are `dtype_free`); bad axes, ranges, perms and
//! shapes are checked with `expect_error`.

use fusebox::{ComputeBackend, DType, Op, Shape, Tensor};

use crate::case::{Case, GradCase, Input, OpCase};
use crate::reference::layout as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// A slice-like configuration: (dims, axis, start, len, dtypes).
type RangeConfig = (&'static [usize], usize, usize, usize, &'static [DType]);
/// A bad slice_backward call: (what, d_out dims, input dims, axis, start).
type BadSliceBackward = (&'static str, &'static [usize], &'static [usize], usize, usize);
/// A concat configuration: (input shapes, axis, dtypes).
type ConcatConfig = (&'static [&'static [usize]], usize, &'static [DType]);

/// A float tensor of `dims`, uniform in [-1, 1), seeded by `seed`.
fn data(seed: u64, dims: &[usize]) -> Tensor {
    Rng::new(seed).normal_ish(dims.to_vec())
}

/// A U32 tensor of `dims` with values in 0..1000.
fn ids_data(seed: u64, dims: &[usize]) -> Tensor {
    Rng::new(seed).ids(dims.to_vec(), 1000)
}

/// An input any dtype and shape is valid for.
fn free(t: Tensor) -> Input {
    Input::new(t).dtype_free().shape_free()
}

fn reshape_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (x, to, dtypes) in
        [(data(1, &[2, 3, 4]), vec![6, 4], FLOATS), (ids_data(2, &[5, 6]), vec![3, 10], &[DType::F32])]
    {
        let label = if x.dtype() == DType::U32 { "u32 " } else { "" };
        let (to_call, to_twin) = (to.clone(), to.clone());
        cases.extend(
            OpCase::new(Op::Reshape, format!("{label}x{:?} -> {to:?}", x.dims()))
                .input(Input::new(x).dtype_free())
                .call(move |b: &B, t| Ok(vec![b.reshape(&t[0], &Shape::new(to_call.clone()))?]))
                .twin(move |a| vec![twin::reshape(&a[0], &to_twin)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::Reshape, "reshape [2,3,4] -> [5,5] (element count differs)", |b: &B| {
        b.reshape(&data(3, &[2, 3, 4]), &Shape::new([5, 5]))?;
        Ok(())
    }));
    cases
}

fn permute_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], &[usize], &[DType]); 6] = [
        (&[2, 3, 5, 7], &[2, 0, 3, 1], FLOATS),
        (&[4, 6, 33], &[0, 2, 1], FLOATS),
        (&[3, 5, 7], &[0, 1, 2], FLOATS),
        (&[2, 1, 9, 17], &[3, 1, 0, 2], FLOATS),
        (&[64, 96, 17], &[2, 0, 1], &[DType::F32]),
        (&[8, 40, 12, 16], &[0, 2, 1, 3], &[DType::F32]),
    ];
    for (i, (dims, perm, dtypes)) in configs.into_iter().enumerate() {
        let (p_call, p_twin) = (perm.to_vec(), perm.to_vec());
        cases.extend(
            OpCase::new(Op::Permute, format!("x{dims:?} perm={perm:?}"))
                .input(free(data(10 + i as u64, dims)))
                .call(move |b: &B, t| Ok(vec![b.permute(&t[0], &p_call)?]))
                .twin(move |a| vec![twin::permute(&a[0], &p_twin)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Permute, "u32 x[3,4,5] perm=[1,2,0]")
            .input(free(ids_data(20, &[3, 4, 5])))
            .call(|b: &B, t| Ok(vec![b.permute(&t[0], &[1, 2, 0])?]))
            .twin(|a| vec![twin::permute(&a[0], &[1, 2, 0])])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    let bad_perms: [(&str, &[usize]); 4] = [
        ("too short", &[1, 0]),
        ("repeated axis", &[0, 1, 1]),
        ("axis out of range", &[0, 1, 3]),
        ("too long", &[0, 1, 2, 3]),
    ];
    for (what, perm) in bad_perms {
        cases.push(Case::expect_error(Op::Permute, format!("x[2,3,4] perm={perm:?} ({what})"), move |b: &B| {
            b.permute(&data(21, &[2, 3, 4]), perm)?;
            Ok(())
        }));
    }
    cases.push(Case::expect_error(Op::Permute, "q8_0 x[2,32] (block format)", |b: &B| {
        b.permute(&Tensor::zeros([2, 32], DType::Q8_0)?, &[1, 0])?;
        Ok(())
    }));
    cases
}

fn transpose_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, usize, &[DType]); 5] = [
        (&[5, 7], 0, 1, FLOATS),
        (&[3, 4, 33], 1, 2, FLOATS),
        (&[2, 3, 4, 5], 0, 3, FLOATS),
        (&[6, 5], 1, 1, FLOATS),
        (&[130, 257], 1, 0, &[DType::F32]),
    ];
    for (i, (dims, d0, d1, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::Transpose, format!("x{dims:?} dims=({d0},{d1})"))
                .input(free(data(30 + i as u64, dims)))
                .call(move |b: &B, t| Ok(vec![b.transpose(&t[0], d0, d1)?]))
                .twin(move |a| vec![twin::transpose(&a[0], d0, d1)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Transpose, "u32 x[40,37] dims=(0,1)")
            .input(free(ids_data(36, &[40, 37])))
            .call(|b: &B, t| Ok(vec![b.transpose(&t[0], 0, 1)?]))
            .twin(|a| vec![twin::transpose(&a[0], 0, 1)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    cases.push(Case::expect_error(Op::Transpose, "x[3,4] dims=(0,2) (axis ≥ rank)", |b: &B| {
        b.transpose(&data(37, &[3, 4]), 0, 2)?;
        Ok(())
    }));
    cases
}

fn slice_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [RangeConfig; 6] = [
        (&[6, 10], 1, 3, 5, FLOATS),
        (&[4, 9, 5], 1, 2, 7, FLOATS),
        (&[7, 3, 17], 0, 4, 3, FLOATS),
        (&[5, 6], 1, 6, 0, FLOATS),
        (&[21], 0, 0, 21, FLOATS),
        (&[300, 129], 1, 1, 127, &[DType::F32]),
    ];
    for (i, (dims, axis, start, len, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::Slice, format!("x{dims:?} axis={axis} start={start} len={len}"))
                .input(free(data(40 + i as u64, dims)))
                .call(move |b: &B, t| Ok(vec![b.slice(&t[0], axis, start, len)?]))
                .twin(move |a| vec![twin::slice(&a[0], axis, start, len)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Slice, "u32 x[9,11] axis=0 start=2 len=6")
            .input(free(ids_data(47, &[9, 11])))
            .call(|b: &B, t| Ok(vec![b.slice(&t[0], 0, 2, 6)?]))
            .twin(|a| vec![twin::slice(&a[0], 0, 2, 6)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    let bad: [(&str, usize, usize, usize); 3] =
        [("axis ≥ rank", 2, 0, 1), ("start + len > N", 1, 3, 3), ("start + len overflows", 1, usize::MAX, 2)];
    for (what, axis, start, len) in bad {
        cases.push(Case::expect_error(
            Op::Slice,
            format!("x[4,5] axis={axis} start={start} len={len} ({what})"),
            move |b: &B| {
                b.slice(&data(48, &[4, 5]), axis, start, len)?;
                Ok(())
            },
        ));
    }
    cases
}

fn slice_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Gradient checks: the axis is not the last one, so a grown d_out or input shape is
    // always inconsistent (the generated bad inputs must fail).
    let grads: [(&[usize], usize, usize, usize); 2] = [(&[3, 5, 4], 1, 1, 3), (&[6, 3], 0, 2, 4)];
    for (i, (dims, axis, start, len)) in grads.into_iter().enumerate() {
        cases.extend(
            GradCase::new(Op::SliceBackward, format!("x{dims:?} axis={axis} start={start} len={len}"))
                .input(Input::new(data(50 + i as u64, dims)).dtype_free())
                .forward(move |a| twin::slice(&a[0], axis, start, len))
                .backward_twin(move |a, dy| vec![twin::slice_backward(dy, &a[0].shape, axis, start)])
                .backward_call(move |b: &B, t, dy| Ok(vec![b.slice_backward(dy, t[0].shape(), axis, start)?]))
                .tolerance(Tolerance::EXACT)
                .build(),
        );
    }
    // Forward checks per dtype, including the last axis and a threaded size.
    let configs: [RangeConfig; 4] = [
        (&[4, 9, 5], 1, 2, 7, FLOATS),
        (&[5, 17], 1, 16, 1, FLOATS),
        (&[7, 3, 6], 0, 0, 7, FLOATS),
        (&[300, 129], 1, 5, 120, &[DType::F32]),
    ];
    for (i, (dims, axis, start, len, dtypes)) in configs.into_iter().enumerate() {
        let mut out_dims = dims.to_vec();
        out_dims[axis] = len;
        let input_shape = Shape::new(dims.to_vec());
        let twin_shape = dims.to_vec();
        cases.extend(
            OpCase::new(Op::SliceBackward, format!("d_out{out_dims:?} into {dims:?} axis={axis} start={start}"))
                .input(data(55 + i as u64, &out_dims))
                .call(move |b: &B, t| Ok(vec![b.slice_backward(&t[0], &input_shape, axis, start)?]))
                .twin(move |a| vec![twin::slice_backward(&a[0], &twin_shape, axis, start)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .no_bad_inputs()
                .build(),
        );
    }
    let bad: [BadSliceBackward; 4] = [
        ("axis ≥ rank", &[4, 3], &[4, 5], 2, 0),
        ("start + len > N", &[4, 3], &[4, 5], 1, 3),
        ("other dim differs", &[3, 3], &[4, 5], 1, 0),
        ("rank differs", &[4, 3, 1], &[4, 5], 1, 0),
    ];
    for (what, d_out, input, axis, start) in bad {
        cases.push(Case::expect_error(
            Op::SliceBackward,
            format!("d_out{d_out:?} into {input:?} axis={axis} start={start} ({what})"),
            move |b: &B| {
                b.slice_backward(&data(59, d_out), &Shape::new(input.to_vec()), axis, start)?;
                Ok(())
            },
        ));
    }
    cases
}

fn select_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, usize, &[DType]); 5] = [
        (&[4, 6, 5], 1, 2, FLOATS),
        (&[4, 6, 5], 0, 3, FLOATS),
        (&[4, 6, 5], 2, 4, FLOATS),
        (&[19], 0, 7, FLOATS),
        (&[120, 3, 300], 1, 1, &[DType::F32]),
    ];
    for (i, (dims, axis, index, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::Select, format!("x{dims:?} axis={axis} index={index}"))
                .input(free(data(60 + i as u64, dims)))
                .call(move |b: &B, t| Ok(vec![b.select(&t[0], axis, index)?]))
                .twin(move |a| vec![twin::select(&a[0], axis, index)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Select, "u32 x[5,7] axis=1 index=6")
            .input(free(ids_data(66, &[5, 7])))
            .call(|b: &B, t| Ok(vec![b.select(&t[0], 1, 6)?]))
            .twin(|a| vec![twin::select(&a[0], 1, 6)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    for (what, axis, index) in [("axis ≥ rank", 2, 0), ("index ≥ N", 1, 5)] {
        cases.push(Case::expect_error(
            Op::Select,
            format!("x[4,5] axis={axis} index={index} ({what})"),
            move |b: &B| {
                b.select(&data(67, &[4, 5]), axis, index)?;
                Ok(())
            },
        ));
    }
    cases
}

fn concat_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [ConcatConfig; 5] = [
        (&[&[3, 5], &[2, 5], &[4, 5]], 0, FLOATS),
        (&[&[2, 3, 5], &[2, 1, 5], &[2, 4, 5]], 1, FLOATS),
        (&[&[3, 4, 2], &[3, 4, 7]], 2, FLOATS),
        (&[&[3, 0, 2], &[3, 2, 2]], 1, FLOATS),
        (&[&[200, 100], &[200, 77]], 1, &[DType::F32]),
    ];
    for (i, (shapes, axis, dtypes)) in configs.into_iter().enumerate() {
        // Along the last axis a grown last dim is still a valid input.
        let last = axis + 1 == shapes[0].len();
        let mut case = OpCase::new(Op::Concat, format!("xs{shapes:?} axis={axis}"));
        for (k, dims) in shapes.iter().enumerate() {
            let input = Input::new(data(70 + 10 * i as u64 + k as u64, dims));
            case = case.input(if last { input.shape_free() } else { input });
        }
        cases.extend(
            case.call(move |b: &B, t| Ok(vec![b.concat(t, axis)?]))
                .twin(move |a| vec![twin::concat(a, axis)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Concat, "u32 xs[[4,3],[4,6]] axis=1")
            .input(free(ids_data(130, &[4, 3])))
            .input(free(ids_data(131, &[4, 6])))
            .call(|b: &B, t| Ok(vec![b.concat(t, 1)?]))
            .twin(|a| vec![twin::concat(a, 1)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    cases.push(Case::expect_error(Op::Concat, "xs=[] (empty list)", |b: &B| {
        b.concat(&[], 0)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Concat, "xs[[2,3],[2,3]] axis=2 (axis ≥ rank)", |b: &B| {
        b.concat(&[data(132, &[2, 3]), data(133, &[2, 3])], 2)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Concat, "xs[[2,3],[2,3,1]] axis=0 (ranks differ)", |b: &B| {
        b.concat(&[data(134, &[2, 3]), data(135, &[2, 3, 1])], 0)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Concat, "xs[[2,3],[2,4]] axis=0 (other dim differs)", |b: &B| {
        b.concat(&[data(136, &[2, 3]), data(137, &[2, 4])], 0)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Concat, "xs[[2,3] f32,[2,3] f16] axis=0 (dtypes differ)", |b: &B| {
        let half = Tensor::from_f32_as(&data(139, &[2, 3]).to_vec_f32()?, [2, 3], DType::F16)?;
        b.concat(&[data(138, &[2, 3]), half], 0)?;
        Ok(())
    }));
    cases
}

fn expand_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], &[usize], &[DType]); 8] = [
        (&[5], &[3, 5], FLOATS),
        (&[3, 1], &[3, 4], FLOATS),
        (&[2, 1, 4], &[3, 2, 5, 4], FLOATS),
        (&[1], &[7], FLOATS),
        (&[], &[2, 3], FLOATS),
        (&[4, 5], &[4, 5], FLOATS),
        (&[1, 257], &[130, 257], &[DType::F32]),
        (&[130, 1], &[130, 257], &[DType::F32]),
    ];
    for (i, (from, to, dtypes)) in configs.into_iter().enumerate() {
        let target = Shape::new(to.to_vec());
        cases.extend(
            OpCase::new(Op::Expand, format!("x{from:?} -> {to:?}"))
                .input(Input::new(data(140 + i as u64, from)).dtype_free())
                .call(move |b: &B, t| Ok(vec![b.expand(&t[0], &target)?]))
                .twin(move |a| vec![twin::expand(&a[0], to)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::Expand, "u32 x[1,6] -> [5,6]")
            .input(free(ids_data(150, &[1, 6])))
            .call(|b: &B, t| Ok(vec![b.expand(&t[0], &Shape::new([5, 6]))?]))
            .twin(|a| vec![twin::expand(&a[0], &[5, 6])])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    let bad: [(&[usize], &[usize]); 4] = [(&[3], &[4]), (&[2, 3], &[3]), (&[2, 3], &[2, 4]), (&[2, 3], &[4, 3])];
    for (from, to) in bad {
        cases.push(Case::expect_error(Op::Expand, format!("x{from:?} -> {to:?} (not broadcastable)"), move |b: &B| {
            b.expand(&data(151, from), &Shape::new(to.to_vec()))?;
            Ok(())
        }));
    }
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    cases.extend(reshape_cases());
    cases.extend(permute_cases());
    cases.extend(transpose_cases());
    cases.extend(slice_cases());
    cases.extend(slice_backward_cases());
    cases.extend(select_cases());
    cases.extend(concat_cases());
    cases.extend(expand_cases());
    cases
}
