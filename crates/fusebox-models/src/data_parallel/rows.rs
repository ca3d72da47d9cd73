//! The embedding lookups' gradients, reduced as rows. A lookup `y_i = E[id_i]` adds
//! `dE[id_i] += dy_i`: only the rows of the tokens in the micro-batch (`n = B·T` of them,
//! against the table's `V`), so averaging the whole `[V, D]` table over the ranks would
//! move mostly zeros. Instead every rank all-gathers each rank's `(ids, rows)` and adds
//! every rank's rows, in rank order and times `1/N`, into the table's averaged dense part:
//! `dE = avg_r(dense_r) + Σ_r (1/N)·rows_r`, the same sum on every rank, so every rank ends
//! with the same gradient bit for bit. When the ranks hold more rows together than the
//! table has (`Σ n_r ≥ V`), the rows are summed into a dense table and all-reduced
//! instead, which then moves no more.

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

use crate::comm::{Communicator, ReduceOp};

/// Largest token id the exchange carries exactly: ids travel as f32 values, which hold
/// every integer up to 2²⁴.
const MAX_ID: u32 = 1 << 24;

/// This rank's gradient rows of one table: `table[ids[i]] += values[i·width ..]`.
#[derive(Debug, Clone)]
pub(super) struct LocalRows {
    /// The table's parameter index.
    pub tensor: usize,
    /// Rows of the table (`V`).
    table_rows: usize,
    /// Elements per row (`D`).
    width: usize,
    ids: Vec<u32>,
    values: Vec<f32>,
}

impl LocalRows {
    /// The rows `rows` `[n, D]` at `ids` `[n]` (U32) of table `tensor`, `table` `[V, D]`,
    /// copied to the host.
    pub fn new(
        b: &dyn ComputeBackend,
        tensor: usize,
        table: &Tensor,
        ids: &Tensor,
        rows: &Tensor,
    ) -> Result<LocalRows> {
        const OP: &str = "GradSync::rows";
        let (table_rows, width) = match table.dims() {
            [v, d] => (*v, *d),
            other => return Err(Error::shape(OP, format!("table {tensor}"), "[V, D]", format!("{other:?}"))),
        };
        let n = ids.elem_count();
        if ids.dtype() != DType::U32 || ids.dims().len() != 1 {
            return Err(Error::shape(OP, "ids", "[n] U32", format!("{:?} {:?}", ids.dims(), ids.dtype())));
        }
        if rows.dtype() != DType::F32 || rows.dims() != [n, width] {
            return Err(Error::shape(
                OP,
                "rows",
                format!("[{n}, {width}] F32"),
                format!("{:?} {:?}", rows.dims(), rows.dtype()),
            ));
        }
        let ids = b.to_host(ids)?.to_vec::<u32>()?;
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table_rows || id >= MAX_ID) {
            return Err(Error::value(
                OP,
                "id",
                format!("< {} (the table's rows, and < 2^24)", table_rows.min(MAX_ID as usize)),
                bad,
            ));
        }
        let values = b.to_host(rows)?.to_vec::<f32>()?;
        Ok(LocalRows { tensor, table_rows, width, ids, values })
    }
}

/// Every rank's rows of one table, in rank order, the same on every rank.
#[derive(Debug)]
pub(super) struct AllRows {
    /// The table's parameter index.
    pub tensor: usize,
    width: usize,
    /// Each rank's `(ids, values)`; or, gathered dense, one entry of every row's sum.
    parts: Vec<(Vec<u32>, Vec<f32>)>,
}

/// Gives every rank every rank's rows of each table in `mine` (the same tables, in the same
/// order, on every rank: a collective per table).
pub(super) fn exchange(comm: &dyn Communicator, mine: Vec<LocalRows>) -> Result<Vec<AllRows>> {
    let world = comm.world_size();
    mine.into_iter()
        .map(|rows| {
            let LocalRows { tensor, table_rows, width, ids, values } = rows;
            if world == 1 {
                return Ok(AllRows { tensor, width, parts: vec![(ids, values)] });
            }
            // Row counts (exact: each is at most 2²⁴ and every rank's is checked below).
            if ids.len() > MAX_ID as usize {
                return Err(Error::value("GradSync::rows", "rows of one rank", format!("at most {MAX_ID}"), ids.len()));
            }
            let counts: Vec<usize> =
                comm.all_gather(&[ids.len() as f32], &vec![1; world])?.iter().map(|&c| c as usize).collect();
            let total: usize = counts.iter().sum();
            let gathered_floats = total.saturating_mul(width + 1);
            if total >= table_rows || gathered_floats > i32::MAX as usize {
                // Dense: this rank's rows summed into a zero table, then all-reduced.
                let mut dense = vec![0.0f32; table_rows * width];
                for (&id, row) in ids.iter().zip(values.chunks_exact(width.max(1))) {
                    let at = id as usize * width;
                    dense[at..at + width].iter_mut().zip(row).for_each(|(d, &v)| *d += v);
                }
                comm.all_reduce(&mut dense, ReduceOp::Sum)?;
                return Ok(AllRows { tensor, width, parts: vec![((0..table_rows as u32).collect(), dense)] });
            }
            // Each rank's ids (as f32, exact below 2²⁴), then its rows.
            let mut payload = Vec::with_capacity(ids.len() * (width + 1));
            payload.extend(ids.iter().map(|&id| id as f32));
            payload.extend_from_slice(&values);
            let sizes: Vec<usize> = counts.iter().map(|&c| c * (width + 1)).collect();
            let all = comm.all_gather(&payload, &sizes)?;
            let mut parts = Vec::with_capacity(world);
            let mut at = 0;
            for &n in &counts {
                let ids = all[at..at + n].iter().map(|&x| x as u32).collect();
                parts.push((ids, all[at + n..at + n * (width + 1)].to_vec()));
                at += n * (width + 1);
            }
            Ok(AllRows { tensor, width, parts })
        })
        .collect()
}

impl AllRows {
    /// `table[ids[i]] += scale · values[i]`, every rank's rows in rank order (duplicate
    /// ids adding up in order).
    ///
    /// # Shapes
    /// `table`: `[V, D]`, the table the rows were taken for.
    pub fn add_into(&self, b: &dyn ComputeBackend, table: &mut Tensor, scale: f32) -> Result<()> {
        for (ids, values) in &self.parts {
            if ids.is_empty() {
                continue;
            }
            let n = ids.len();
            let scaled: Vec<f32> = values.iter().map(|&v| v * scale).collect();
            let ids = b.upload(&Tensor::from_vec(ids.clone(), [n])?)?;
            let rows = b.upload(&Tensor::from_vec(scaled, [n, self.width])?)?;
            b.scatter_add_rows(table, &ids, &rows)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;
    use fusebox::CpuBackend;

    #[test]
    fn rows_are_checked_and_added_in_order() {
        let b = CpuBackend::with_threads(1).unwrap();
        let table = Tensor::from_vec(vec![0.0f32; 6], [3, 2]).unwrap();
        let ids = Tensor::from_vec(vec![2u32, 0, 2], [3]).unwrap();
        let rows = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]).unwrap();
        let mine = LocalRows::new(&b, 7, &table, &ids, &rows).unwrap();
        let all = exchange(&SingleProcess, vec![mine]).unwrap();
        assert_eq!(all[0].tensor, 7);
        let mut out = Tensor::from_vec(vec![0.0f32; 6], [3, 2]).unwrap();
        all[0].add_into(&b, &mut out, 0.5).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), [1.5, 2.0, 0.0, 0.0, 3.0, 4.0]);

        let bad = Tensor::from_vec(vec![3u32, 0, 1], [3]).unwrap();
        let e = LocalRows::new(&b, 7, &table, &bad, &rows).unwrap_err().to_string();
        assert!(e.contains("< 3"), "{e}");
        let short = Tensor::from_vec(vec![1.0f32; 4], [2, 2]).unwrap();
        let e = LocalRows::new(&b, 7, &table, &ids, &short).unwrap_err().to_string();
        assert!(e.contains("[3, 2] F32"), "{e}");
    }
}
