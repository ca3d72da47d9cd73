// Batched, strided, tiled matmul: for batch z,
// C[z, i, j] = Σ_k A[z, i, k]·B[z, k, j] (+ bias[j]), each operand addressed by its own
// strides (so transposes, shared operands and column blocks need no copies).
// 16×16 output tile a workgroup, 2×2 outputs a thread over a 32×32 tile, k in steps of 16.

@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> C: array<f32>;

var<workgroup> ta: array<array<f32, 17>, 32>;
var<workgroup> tb: array<array<f32, 33>, 16>;

// params: 0 m, 1 n, 2 k, 3 a_batch, 4 a_row, 5 a_col, 6 b_batch, 7 b_row, 8 b_col,
//         9 c_batch, 10 c_row, 11 has_bias, 12 tiles_n, 13 accumulate (C += instead of C =)
@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = pu(0u);
    let n = pu(1u);
    let k = pu(2u);
    let tile = flat_group(wid);
    let tiles_n = pu(12u);
    let row0 = (tile / tiles_n) * 32u;
    let col0 = (tile % tiles_n) * 32u;
    let z = wid.z;
    let a_base = off(0u) + z * pu(3u);
    let b_base = off(1u) + z * pu(6u);
    let a_row = pu(4u);
    let a_col = pu(5u);
    let b_row = pu(7u);
    let b_col = pu(8u);
    var acc00 = 0.0;
    var acc01 = 0.0;
    var acc10 = 0.0;
    var acc11 = 0.0;
    let tx = lid.x;
    let ty = lid.y;
    var k0 = 0u;
    loop {
        if (k0 >= k) { break; }
        // A tile: 32 rows × 16 k; each thread loads 2.
        for (var r = 0u; r < 2u; r++) {
            let ii = row0 + ty + r * 16u;
            let kk = k0 + tx;
            var v = 0.0;
            if (ii < m && kk < k) { v = A[a_base + ii * a_row + kk * a_col]; }
            ta[ty + r * 16u][tx] = v;
        }
        // B tile: 16 k × 32 cols; each thread loads 2.
        for (var c = 0u; c < 2u; c++) {
            let kk = k0 + ty;
            let jj = col0 + tx + c * 16u;
            var v = 0.0;
            if (kk < k && jj < n) { v = B[b_base + kk * b_row + jj * b_col]; }
            tb[ty][tx + c * 16u] = v;
        }
        workgroupBarrier();
        for (var q = 0u; q < 16u; q++) {
            let a0 = ta[ty][q];
            let a1 = ta[ty + 16u][q];
            let b0 = tb[q][tx];
            let b1 = tb[q][tx + 16u];
            acc00 = fma(a0, b0, acc00);
            acc01 = fma(a0, b1, acc01);
            acc10 = fma(a1, b0, acc10);
            acc11 = fma(a1, b1, acc11);
        }
        workgroupBarrier();
        k0 += 16u;
    }
    let c_base = off(3u) + z * pu(9u);
    let c_row = pu(10u);
    let has_bias = pu(11u) != 0u;
    for (var r = 0u; r < 2u; r++) {
        for (var c = 0u; c < 2u; c++) {
            let ii = row0 + ty + r * 16u;
            let jj = col0 + tx + c * 16u;
            if (ii < m && jj < n) {
                var v = acc00;
                if (r == 0u && c == 1u) { v = acc01; }
                if (r == 1u && c == 0u) { v = acc10; }
                if (r == 1u && c == 1u) { v = acc11; }
                if (has_bias) { v += bias[off(2u) + jj]; }
                let at = c_base + ii * c_row + jj;
                if (pu(13u) != 0u) { v += C[at]; }
                C[at] = v;
            }
        }
    }
}
