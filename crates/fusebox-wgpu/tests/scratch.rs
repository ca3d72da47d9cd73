use fusebox::{ComputeBackend, CpuBackend, Tensor};
use fusebox_wgpu::WgpuBackend;

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5 }).collect()
}

fn first_bad(a: &Tensor, b: &Tensor, d: usize) -> Option<(usize, f32, f32)> {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    (0..a.len()).find(|&i| (a[i]-b[i]).abs() > 1e-4).map(|i| (i / d, a[i], b[i]))
}

#[test]
fn scratch() {
    let g = WgpuBackend::new().unwrap();
    let c = CpuBackend::new();
    for &(t, d, causal) in &[(1024usize, 64usize, false), (1024, 64, true), (1024, 8, false), (2048, 8, true), (2048, 1, true)] {
        let q = Tensor::from_vec(rnd(t*d, 1), [1, 1, t, d]).unwrap();
        let k = Tensor::from_vec(rnd(t*d, 2), [1, 1, t, d]).unwrap();
        let v = Tensor::from_vec(rnd(t*d, 3), [1, 1, t, d]).unwrap();
        let rc = c.attention(&q, &k, &v, 0.125, causal).unwrap();
        let up = |x: &Tensor| g.upload(x).unwrap();
        let rg = g.attention(&up(&q), &up(&k), &up(&v), 0.125, causal).unwrap();
        println!("cfg t{t} d{d} causal {causal}: first bad row {:?}", first_bad(&g.to_host(&rg).unwrap(), &rc, d));
    }
}
