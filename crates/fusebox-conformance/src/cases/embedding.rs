//! Cases of the embedding family: embedding (float and quantized tables) and its
//! backward, index_select (whose gradient is index_add), scatter_add_rows, slice_rows.
//! Ids repeat on purpose so scatter-adds accumulate; ids ≥ the row count must be errors.

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::embedding as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// A float tensor of `dims`, uniform in [-1, 1), seeded by `seed`.
fn data(seed: u64, dims: &[usize]) -> Tensor {
    Rng::new(seed).normal_ish(dims.to_vec())
}

/// U32 ids of `dims` in `0..bound`.
fn ids(seed: u64, dims: &[usize], bound: usize) -> Tensor {
    Rng::new(seed).ids(dims.to_vec(), bound)
}

/// A float input whose first dim is free when it is its only dim (a grown rank-1
/// destination of a row scatter is still valid).
fn rows_input(t: Tensor) -> Input {
    if t.rank() == 1 {
        Input::new(t).shape_free()
    } else {
        Input::new(t)
    }
}

/// U32 ids with exactly these values.
fn id_list(values: &[u32]) -> Tensor {
    Tensor::from_slice(values, [values.len()]).expect("shape")
}

/// A fresh, uniquely owned copy of `t` on the backend (writable in place).
fn fresh<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> FbResult<Tensor> {
    let host = b.to_host(t)?;
    let copy = Tensor::from_bytes(host.host_bytes()?, host.shape().clone(), host.dtype())?;
    drop(host);
    b.upload(&copy)
}

/// The first dim of `t` (its row count).
fn rows_of(t: &Tensor) -> usize {
    t.dims().first().copied().unwrap_or(0)
}

fn embedding_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // The table's D and the ids' shape are free, so growing them is valid input.
    let configs: [(&[usize], usize, usize, &[DType]); 5] = [
        (&[3, 5], 11, 37, FLOATS),
        (&[7], 4, 64, FLOATS),
        (&[], 9, 16, FLOATS),
        (&[2, 3, 4], 50, 1, FLOATS),
        (&[512], 300, 96, &[DType::F32]),
    ];
    for (i, (id_dims, vocab, dim, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::Embedding, format!("ids{id_dims:?} table[{vocab},{dim}]"))
                .input(Input::new(ids(2000 + i as u64, id_dims, vocab)).shape_free())
                .input(Input::new(data(2010 + i as u64, &[vocab, dim])).shape_free())
                .call(|b: &B, t| Ok(vec![b.embedding(&t[0], &t[1])?]))
                .twin(|a| vec![twin::embedding(&a[0], &a[1])])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    // Quantized tables give f32 rows equal to the dequantized table's rows.
    for (k, q) in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4K, DType::Q6K, DType::F8E4M3].into_iter().enumerate()
    {
        let (id_t, table) = (ids(2020 + k as u64, &[3, 4], 10), data(2030 + k as u64, &[10, 256]));
        cases.push(Case::custom(
            Op::Embedding,
            CaseKind::Forward,
            format!("ids[3,4] table[10,256] {q}"),
            move |b: &B| {
                let run = || -> FbResult<(Array, Array)> {
                    let quantized = b.quantize(&b.upload(&table)?, q)?;
                    let got = b.to_host(&b.embedding(&b.upload(&id_t)?, &quantized)?)?;
                    let dequantized = b.to_host(&b.dequantize(&quantized)?)?;
                    if got.dtype() != DType::F32 {
                        return Err(fusebox::Error::dtype(
                            "embedding",
                            "output of a quantized table",
                            "f32",
                            got.dtype(),
                        ));
                    }
                    let want = twin::embedding(&Array::from_tensor(&id_t), &Array::from_tensor(&dequantized));
                    Ok((Array::from_tensor(&got), want))
                };
                let (got, want) = run().map_err(|e| format!("returned an error: {e}"))?;
                Tolerance::EXACT.check("output", &got, &want)
            },
        ));
    }
    cases.push(Case::custom(
        Op::Embedding,
        CaseKind::BadInput,
        "ids[2,3] table[11,5] with ids[1,0] = 11 (error names it)",
        |b: &B| {
            let bad = Tensor::from_vec(vec![0u32, 3, 10, 11, 2, 1], [2, 3]).map_err(|e| e.to_string())?;
            match b.embedding(&bad, &data(2040, &[11, 5])) {
                Ok(_) => Err("accepted id 11 for a table of 11 rows".into()),
                Err(e) if e.to_string().contains("ids[3]") && e.to_string().contains("11") => Ok(()),
                Err(e) => Err(format!("the error does not name the position (ids[3]) and value (11): {e}")),
            }
        },
    ));
    cases.push(Case::expect_error(Op::Embedding, "ids[4] table[4,32] q8_0 with id 4 ≥ V", |b: &B| {
        b.embedding(&id_list(&[0, 1, 4, 2]), &Tensor::zeros([4, 32], DType::Q8_0)?)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Embedding, "ids[3] table[12] (table not 2-d)", |b: &B| {
        b.embedding(&id_list(&[0, 1, 2]), &data(2041, &[12]))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Embedding, "ids[3] table[2,3,4] (table not 2-d)", |b: &B| {
        b.embedding(&id_list(&[0, 1, 1]), &data(2042, &[2, 3, 4]))?;
        Ok(())
    }));
    cases
}

fn embedding_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Gradient of the table through embedding. Ids repeat; the backend's gradient must
    // come back with the table's shape (a d_out of another width is not its gradient).
    let grads: [(&[u32], &[usize], usize, usize); 2] = [(&[1, 4, 1, 0, 4, 4], &[2, 3], 5, 4), (&[2, 2, 0], &[3], 3, 7)];
    for (i, (values, id_dims, vocab, dim)) in grads.into_iter().enumerate() {
        let id_t = Tensor::from_slice(values, id_dims.to_vec()).expect("shape");
        cases.extend(
            GradCase::new(Op::EmbeddingBackward, format!("ids{values:?} as {id_dims:?} table[{vocab},{dim}]"))
                .input(Input::new(id_t).constant())
                .input(Input::new(data(2100 + i as u64, &[vocab, dim])).shape_free().dtype_free())
                .forward(|a| twin::embedding(&a[0], &a[1]))
                .backward_twin(|a, dy| vec![twin::embedding_backward(&a[0], dy, a[1].shape[0])])
                .backward_call(|b: &B, t, dy| {
                    let dtable = b.embedding_backward(&t[0], dy, rows_of(&t[1]))?;
                    if dtable.shape() != t[1].shape() {
                        return Err(fusebox::Error::shape(
                            "embedding_backward",
                            "dtable",
                            t[1].shape(),
                            dtable.shape(),
                        ));
                    }
                    Ok(vec![dtable])
                })
                .build(),
        );
    }
    // Forward checks per d_out dtype (the result is always f32), a large vocab with few
    // ids, and a threaded size with many repeats.
    let configs: [(&[usize], usize, usize, &[DType]); 4] = [
        (&[4, 6], 7, 33, FLOATS),
        (&[5], 2, 3, FLOATS),
        (&[64], 5000, 17, &[DType::F32]),
        (&[1024], 50, 64, &[DType::F32]),
    ];
    for (i, (id_dims, vocab, dim, dtypes)) in configs.into_iter().enumerate() {
        let mut dy_dims = id_dims.to_vec();
        dy_dims.push(dim);
        cases.extend(
            OpCase::new(Op::EmbeddingBackward, format!("ids{id_dims:?} d_out{dy_dims:?} vocab={vocab}"))
                .input(Input::new(ids(2110 + i as u64, id_dims, vocab)))
                .input(Input::new(data(2120 + i as u64, &dy_dims)).shape_free())
                .call(move |b: &B, t| Ok(vec![b.embedding_backward(&t[0], &t[1], vocab)?]))
                .twin(move |a| vec![twin::embedding_backward(&a[0], &a[1], vocab)])
                .tolerance(Tolerance::F32)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::EmbeddingBackward, "ids[3] with id 6 ≥ vocab=6", |b: &B| {
        b.embedding_backward(&id_list(&[0, 6, 1]), &data(2130, &[3, 4]), 6)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::EmbeddingBackward, "ids[2,3] d_out[3,2,4] (d_out not ids + [D])", |b: &B| {
        b.embedding_backward(&ids(2131, &[2, 3], 4), &data(2132, &[3, 2, 4]), 4)?;
        Ok(())
    }));
    cases
}

fn index_select_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, &[DType]); 4] =
        [(&[9, 4, 5], 6, FLOATS), (&[20], 7, FLOATS), (&[6, 3], 0, FLOATS), (&[300, 130], 400, &[DType::F32])];
    for (i, (dims, m, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::IndexSelect, format!("x{dims:?} ids[{m}]"))
                .input(Input::new(data(2200 + i as u64, dims)).shape_free().dtype_free())
                .input(Input::new(ids(2210 + i as u64, &[m], dims[0])).shape_free())
                .call(|b: &B, t| Ok(vec![b.index_select(&t[0], &t[1])?]))
                .twin(|a| vec![twin::index_select(&a[0], &a[1])])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::IndexSelect, "u32 x[8,3] ids[5]")
            .input(Input::new(ids(2220, &[8, 3], 1000)).shape_free().dtype_free())
            .input(Input::new(id_list(&[7, 0, 7, 3, 1])).shape_free())
            .call(|b: &B, t| Ok(vec![b.index_select(&t[0], &t[1])?]))
            .twin(|a| vec![twin::index_select(&a[0], &a[1])])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    cases.push(Case::custom(
        Op::IndexSelect,
        CaseKind::Property,
        "q8_0 x[6,64] ids[4]: rows of blocks copied as they are",
        |b: &B| {
            let run = || -> FbResult<Result<(), String>> {
                let (rows, row_bytes) = (6, 2 * 34);
                let bytes: Vec<u8> = (0..rows * row_bytes).map(|i| (i * 37 % 251) as u8).collect();
                let x = Tensor::from_bytes(&bytes, [rows, 64], DType::Q8_0)?;
                let picks = [5u32, 0, 5, 2];
                let got = b.to_host(&b.index_select(&b.upload(&x)?, &b.upload(&id_list(&picks))?)?)?;
                let want: Vec<u8> = picks
                    .iter()
                    .flat_map(|&r| bytes[r as usize * row_bytes..(r as usize + 1) * row_bytes].to_vec())
                    .collect();
                Ok(if got.dtype() == DType::Q8_0 && got.dims() == [4, 64] && got.host_bytes()? == want.as_slice() {
                    Ok(())
                } else {
                    Err(format!("got {} {:?} with other bytes than rows {picks:?} of x", got.dtype(), got.dims()))
                })
            };
            run().map_err(|e| format!("returned an error: {e}"))?
        },
    ));
    cases.push(Case::expect_error(Op::IndexSelect, "x[5,3] ids[3] with id 5 ≥ N", |b: &B| {
        b.index_select(&data(2221, &[5, 3]), &id_list(&[0, 5, 1]))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::IndexSelect, "x[5,3] ids[2,2] (ids not 1-d)", |b: &B| {
        b.index_select(&data(2222, &[5, 3]), &ids(2223, &[2, 2], 5))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::IndexSelect, "x[] ids[1] (a scalar has no rows)", |b: &B| {
        b.index_select(&data(2224, &[]), &id_list(&[0]))?;
        Ok(())
    }));
    cases
}

fn scatter_add_rows_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, &[DType]); 4] =
        [(&[8, 5, 3], 6, FLOATS), (&[4, 33], 9, FLOATS), (&[3], 5, FLOATS), (&[200, 160], 300, &[DType::F32])];
    for (i, (dims, m, dtypes)) in configs.into_iter().enumerate() {
        let mut src_dims = dims.to_vec();
        src_dims[0] = m;
        cases.extend(
            OpCase::new(Op::ScatterAddRows, format!("dst{dims:?} ids[{m}] src{src_dims:?}"))
                .input(rows_input(data(2300 + i as u64, dims)))
                .input(Input::new(ids(2310 + i as u64, &[m], dims[0])).constant())
                .input(data(2320 + i as u64, &src_dims))
                .call(|b: &B, t| {
                    let mut dst = fresh(b, &t[0])?;
                    b.scatter_add_rows(&mut dst, &t[1], &t[2])?;
                    Ok(vec![dst])
                })
                .twin(|a| vec![twin::scatter_add_rows(&a[0], &a[1], &a[2])])
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::ScatterAddRows, "dst[4,3] ids[2] with id 4 ≥ N", |b: &B| {
        let mut dst = fresh(b, &data(2330, &[4, 3]))?;
        b.scatter_add_rows(&mut dst, &id_list(&[1, 4]), &data(2331, &[2, 3]))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::ScatterAddRows, "dst[4,3] shared with a live clone (not writable)", |b: &B| {
        let mut dst = fresh(b, &data(2332, &[4, 3]))?;
        let _reader = dst.clone();
        b.scatter_add_rows(&mut dst, &id_list(&[1, 2]), &data(2333, &[2, 3]))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::ScatterAddRows, "dst[4,3] f32, src[2,3] f16 (dtypes differ)", |b: &B| {
        let mut dst = fresh(b, &data(2334, &[4, 3]))?;
        let src = Tensor::from_f32_as(&data(2335, &[2, 3]).to_vec_f32()?, [2, 3], DType::F16)?;
        b.scatter_add_rows(&mut dst, &id_list(&[1, 2]), &src)?;
        Ok(())
    }));
    cases
}

fn slice_rows_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, usize, &[DType]); 5] = [
        (&[10, 3, 4], 2, 5, FLOATS),
        (&[10, 3], 0, 0, FLOATS),
        (&[10, 7], 7, 3, FLOATS),
        (&[13], 1, 11, FLOATS),
        (&[700, 64], 50, 600, &[DType::F32]),
    ];
    for (i, (dims, start, len, dtypes)) in configs.into_iter().enumerate() {
        cases.extend(
            OpCase::new(Op::SliceRows, format!("x{dims:?} start={start} len={len}"))
                .input(Input::new(data(2400 + i as u64, dims)).shape_free().dtype_free())
                .call(move |b: &B, t| Ok(vec![b.slice_rows(&t[0], start, len)?]))
                .twin(move |a| vec![twin::slice_rows(&a[0], start, len)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.extend(
        OpCase::new(Op::SliceRows, "u32 x[6,5] start=1 len=4")
            .input(Input::new(ids(2410, &[6, 5], 1000)).shape_free().dtype_free())
            .call(|b: &B, t| Ok(vec![b.slice_rows(&t[0], 1, 4)?]))
            .twin(|a| vec![twin::slice_rows(&a[0], 1, 4)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    for (what, start, len) in [("start + len > N", 3, 5), ("start + len overflows", usize::MAX, 2)] {
        cases.push(Case::expect_error(
            Op::SliceRows,
            format!("x[7,2] start={start} len={len} ({what})"),
            move |b: &B| {
                b.slice_rows(&data(2411, &[7, 2]), start, len)?;
                Ok(())
            },
        ));
    }
    cases.push(Case::expect_error(Op::SliceRows, "x[] start=0 len=1 (a scalar has no rows)", |b: &B| {
        b.slice_rows(&data(2412, &[]), 0, 1)?;
        Ok(())
    }));
    cases
}

fn index_add_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // index_add is the gradient of index_select: d_x = index_add(zeros like x, ids, d_out).
    let grads: [(&[usize], &[u32]); 2] = [(&[6, 4], &[5, 0, 5, 2, 5]), (&[4, 2, 3], &[3, 3, 1])];
    for (i, (dims, values)) in grads.into_iter().enumerate() {
        cases.extend(
            GradCase::new(Op::IndexAdd, format!("index_select x{dims:?} ids{values:?}"))
                .input(data(2500 + i as u64, dims))
                .input(Input::new(id_list(values)).constant())
                .forward(|a| twin::index_select(&a[0], &a[1]))
                .backward_twin(|a, dy| vec![twin::index_add(&Array::zeros(a[0].shape.clone()), &a[1], dy)])
                .backward_call(|b: &B, t, dy| {
                    let zeros = b.zeros(t[0].shape(), t[0].dtype())?;
                    Ok(vec![b.index_add(&zeros, &t[1], dy)?])
                })
                .build(),
        );
    }
    let configs: [(&[usize], usize, &[DType]); 3] =
        [(&[7, 5, 3], 9, FLOATS), (&[5], 8, FLOATS), (&[180, 200], 250, &[DType::F32])];
    for (i, (dims, m, dtypes)) in configs.into_iter().enumerate() {
        let mut src_dims = dims.to_vec();
        src_dims[0] = m;
        cases.extend(
            OpCase::new(Op::IndexAdd, format!("x{dims:?} ids[{m}] src{src_dims:?}"))
                .input(rows_input(data(2510 + i as u64, dims)))
                .input(Input::new(ids(2520 + i as u64, &[m], dims[0])).constant())
                .input(data(2530 + i as u64, &src_dims))
                .call(|b: &B, t| Ok(vec![b.index_add(&t[0], &t[1], &t[2])?]))
                .twin(|a| vec![twin::index_add(&a[0], &a[1], &a[2])])
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::IndexAdd, "x[4,3] ids[2] with id 9 ≥ N", |b: &B| {
        b.index_add(&data(2540, &[4, 3]), &id_list(&[9, 0]), &data(2541, &[2, 3]))?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::IndexAdd, "x[4,3] ids[2] src[3,3] (src rows ≠ ids)", |b: &B| {
        b.index_add(&data(2542, &[4, 3]), &id_list(&[1, 0]), &data(2543, &[3, 3]))?;
        Ok(())
    }));
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    cases.extend(embedding_cases());
    cases.extend(embedding_backward_cases());
    cases.extend(index_select_cases());
    cases.extend(scatter_add_rows_cases());
    cases.extend(slice_rows_cases());
    cases.extend(index_add_cases());
    cases
}
