//! fusebox's gated delta rule against transformers' own (`torch_chunk_gated_delta_rule`
//! of Qwen3.5, run in float64): outputs, final state and the gradients of q, k, v, g, β
//! and the initial state, for B 1, T 70 (two chunks), Hk 1 < Hv 2, Dk 8 ≠ Dv 6, with an
//! initial state. The decode step applied token by token must give the same outputs.
//!
//! Regenerate the fixture from the repository root with
//! `/tmp/tvenv/bin/python scripts/record_delta_rule_fixture.py` (any Python with torch and
//! transformers ≥ 5 that has `models.qwen3_5`).

use std::collections::HashMap;

use fusebox::{ComputeBackend, CpuBackend, Tensor};

const FIXTURE: &str = include_str!("../fixtures/delta_rule/qwen3_5.txt");

/// The fixture's tensors by name (f32 host tensors).
fn fixture() -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for line in FIXTURE.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let mut parts = line.split(' ');
        let (name, dims, hex) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let dims: Vec<usize> = dims.split('x').map(|d| d.parse().unwrap()).collect();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        out.insert(name.to_string(), Tensor::from_vec(values, dims).unwrap());
    }
    out
}

/// `max |got − want| / max |want|`.
fn relative_error(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims());
    let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    let diff = g.iter().zip(&w).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    let scale = w.iter().map(|b| b.abs() as f64).fold(0.0, f64::max);
    diff / scale
}

fn check(what: &str, got: &Tensor, want: &Tensor, bound: f64) {
    let e = relative_error(got, want);
    println!("{what}: relative error {e:.2e}");
    assert!(e <= bound, "{what}: relative error {e:.2e} above {bound:.0e} against transformers");
}

#[test]
fn gated_delta_rule_matches_transformers() {
    let f = fixture();
    let t = |n: &str| &f[n];
    let dk = t("q").dims()[3];
    let scale = 1.0 / (dk as f32).sqrt();
    let cpu = CpuBackend::with_threads(2).unwrap();
    let r = cpu.gated_delta_rule(t("q"), t("k"), t("v"), t("g"), t("beta"), Some(t("initial_state")), scale).unwrap();
    check("out", &r.out, t("out"), 1e-5);
    check("state", &r.state, t("state"), 1e-5);
    let g = cpu
        .gated_delta_rule_backward(
            t("q"),
            t("k"),
            t("v"),
            t("g"),
            t("beta"),
            Some(t("initial_state")),
            t("r_out"),
            Some(t("r_state")),
            scale,
        )
        .unwrap();
    for (name, got) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv), ("dg", &g.dg), ("dbeta", &g.dbeta)] {
        check(name, got, t(name), 1e-5);
    }
    check("d_initial_state", g.d_initial_state.as_ref().unwrap(), t("d_initial_state"), 1e-5);
}

#[test]
fn the_decode_step_token_by_token_matches_transformers() {
    let f = fixture();
    let (q, k, v, g, beta) = (&f["q"], &f["k"], &f["v"], &f["g"], &f["beta"]);
    let [b, steps, hk, dk] = q.dims().try_into().unwrap();
    let [_, _, hv, dv] = v.dims().try_into().unwrap();
    let cpu = CpuBackend::with_threads(2).unwrap();
    let mut state = Tensor::from_vec(f["initial_state"].to_vec_f32().unwrap(), [b, hv, dk, dv]).unwrap();
    let mut outs = Vec::new();
    // b = 1: token t of [1, T, H, D] is rows t·H·D.. of the flat data.
    let token = |x: &Tensor, t: usize, h: usize, d: usize| {
        let all = x.to_vec_f32().unwrap();
        Tensor::from_vec(all[t * h * d..(t + 1) * h * d].to_vec(), [1, h, d]).unwrap()
    };
    for t in 0..steps {
        let gate =
            |x: &Tensor| Tensor::from_vec(x.to_vec_f32().unwrap()[t * hv..(t + 1) * hv].to_vec(), [1, hv]).unwrap();
        let o = cpu
            .gated_delta_rule_step(
                &token(q, t, hk, dk),
                &token(k, t, hk, dk),
                &token(v, t, hv, dv),
                &gate(g),
                &gate(beta),
                &mut state,
                1.0 / (dk as f32).sqrt(),
            )
            .unwrap();
        outs.extend(o.to_vec_f32().unwrap());
    }
    check("out by steps", &Tensor::from_vec(outs, [b, steps, hv, dv]).unwrap(), &f["out"], 1e-5);
    check("state by steps", &state, &f["state"], 1e-5);
}
