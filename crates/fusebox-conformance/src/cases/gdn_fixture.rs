//! The Gated DeltaNet's small ops against transformers itself: fixtures recorded in
//! float64 by `scripts/record_gdn_ops_fixture.py` from `transformers.models.qwen3_5`
//! (`causal_conv1d_fn`, `causal_conv1d_update`, `l2norm`, `Qwen3_5RMSNormGated` and the
//! gate lines of `Qwen3_5GatedDeltaNet.forward`, with autograd gradients for a recorded
//! random upstream gradient). The backend runs on the inputs rounded to f32 and must
//! agree within f32 rounding. Regenerate with
//! `/tmp/tvenv/bin/python scripts/record_gdn_ops_fixture.py`.

use std::collections::HashMap;
use std::sync::Arc;

use fusebox::{ComputeBackend, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind};
use crate::tolerance::Tolerance;

/// The op outputs agree with transformers' within this (the inputs are rounded to f32).
const TOLERANCE: Tolerance = Tolerance::F32;

/// Recorded tensors by name.
type Fixture = HashMap<String, Array>;

/// Parses lines `NAME DIMS VALUES` (DIMS comma-separated, VALUES space-separated), `#` comments.
fn parse(text: &str) -> Fixture {
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut fields = line.split(' ');
        let name = fields.next().expect("fixture line: a name");
        let dims = fields.next().expect("fixture line: dims");
        let shape: Vec<usize> =
            if dims.is_empty() { vec![] } else { dims.split(',').map(|d| d.parse().expect("fixture dim")).collect() };
        let data: Vec<f64> = fields.map(|v| v.parse().expect("fixture value")).collect();
        out.insert(name.to_string(), Array::new(shape, data));
    }
    out
}

/// Owned tensor names.
fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// What one fixture case runs: the backend's outputs for the uploaded inputs.
type Run<B> = Arc<dyn Fn(&B, &[Tensor]) -> FbResult<Vec<Tensor>> + Send + Sync>;

/// A case: `run` on the named fixture inputs must give the named fixture outputs.
fn case<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    kind: CaseKind,
    name: &str,
    fixture: &Arc<Fixture>,
    (inputs, outputs): (Vec<String>, Vec<String>),
    run: Run<B>,
) -> Case<B> {
    let f = fixture.clone();
    Case::custom(op, kind, format!("{name} against transformers (fixtures/gdn_ops)"), move |b: &B| {
        let up: Vec<Tensor> = inputs
            .iter()
            .map(|n| b.upload(&f[n.as_str()].to_tensor()).map_err(|e| format!("upload {n}: {e}")))
            .collect::<Result<_, _>>()?;
        let got = run(b, &up).map_err(|e| format!("returned an error: {e}"))?;
        if got.len() != outputs.len() {
            return Err(format!("{} outputs for {} recorded", got.len(), outputs.len()));
        }
        for (t, n) in got.iter().zip(&outputs) {
            let host = b.to_host(t).map_err(|e| format!("to_host: {e}"))?;
            TOLERANCE.check(n, &Array::from_tensor(&host), &f[n.as_str()])?;
        }
        Ok(())
    })
}

/// `depthwise_conv1d_silu` (`causal_conv1d_fn`) and `depthwise_conv1d_silu_ctx`
/// (`causal_conv1d_update`, a prompt continuation and a decode step) with their backwards.
pub fn conv_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let f = Arc::new(parse(include_str!("../../fixtures/gdn_ops/conv.txt")));
    let mut cases = vec![
        case::<B>(
            Op::DepthwiseConv1dSilu,
            CaseKind::Forward,
            "depthwise_conv1d_silu = causal_conv1d_fn(activation=silu)",
            &f,
            (names(&["x", "w", "bias"]), names(&["y"])),
            Arc::new(|b, t| Ok(vec![b.depthwise_conv1d_silu(&t[0], &t[1], &t[2])?])),
        ),
        case::<B>(
            Op::DepthwiseConv1dSiluBackward,
            CaseKind::Backward,
            "depthwise_conv1d_silu_backward = autograd of causal_conv1d_fn",
            &f,
            (names(&["x", "w", "bias", "dy"]), names(&["dx", "dw", "dbias"])),
            Arc::new(|b, t| {
                let g = b.depthwise_conv1d_silu_backward(None, &t[0], &t[1], &t[2], &t[3])?;
                Ok(vec![g.dx, g.dw, g.dbias])
            }),
        ),
    ];
    for tag in ["prompt", "step"] {
        let n = move |s: &str| format!("{tag}.{s}");
        cases.push(case::<B>(
            Op::DepthwiseConv1dSiluCtx,
            CaseKind::Forward,
            &format!("depthwise_conv1d_silu_ctx ({tag}) = causal_conv1d_update(activation=silu)"),
            &f,
            (vec![n("ctx"), n("x"), "w".into(), "bias".into()], vec![n("y")]),
            Arc::new(|b, t| Ok(vec![b.depthwise_conv1d_silu_ctx(&t[0], &t[1], &t[2], &t[3])?])),
        ));
        cases.push(case::<B>(
            Op::DepthwiseConv1dSiluBackward,
            CaseKind::Backward,
            &format!("depthwise_conv1d_silu_backward with ctx ({tag}) = autograd of causal_conv1d_update"),
            &f,
            (
                vec![n("ctx"), n("x"), "w".into(), "bias".into(), n("dy")],
                vec![n("d_ctx"), n("dx"), n("dw"), n("dbias")],
            ),
            Arc::new(|b, t| {
                let g = b.depthwise_conv1d_silu_backward(Some(&t[0]), &t[1], &t[2], &t[3], &t[4])?;
                let d_ctx = g.d_ctx.ok_or_else(|| fusebox::Error::value("fixture", "d_ctx", "Some", "None"))?;
                Ok(vec![d_ctx, g.dx, g.dw, g.dbias])
            }),
        ));
        // The conv state causal_conv1d_update leaves is the last K−1 inputs of [ctx, x]
        // (what a caller keeps between decode steps).
        let f2 = f.clone();
        cases.push(Case::custom(
            Op::DepthwiseConv1dSiluCtx,
            CaseKind::Property,
            format!(
                "causal_conv1d_update ({tag}) leaves the last K−1 inputs of [ctx, x] as its state (fixtures/gdn_ops)"
            ),
            move |_b: &B| {
                let (ctx, x, state) = (&f2[&n("ctx")], &f2[&n("x")], &f2[&n("state")]);
                let (km1, l) = (ctx.shape[2], x.shape[2]);
                let rows = ctx.shape[0] * ctx.shape[1];
                let mut want = Vec::new();
                for r in 0..rows {
                    let joined: Vec<f64> =
                        ctx.data[r * km1..(r + 1) * km1].iter().chain(&x.data[r * l..(r + 1) * l]).copied().collect();
                    want.extend_from_slice(&joined[joined.len() - km1..]);
                }
                Tolerance::EXACT.check("state", state, &Array::new(state.shape.clone(), want))
            },
        ));
    }
    cases
}

/// `l2_norm` (`l2norm`, eps 1e-6) and `rms_norm_gated` (`Qwen3_5RMSNormGated`, eps 1e-6)
/// with their backwards.
pub fn norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let l2 = Arc::new(parse(include_str!("../../fixtures/gdn_ops/l2norm.txt")));
    let gated = Arc::new(parse(include_str!("../../fixtures/gdn_ops/rms_norm_gated.txt")));
    vec![
        case::<B>(
            Op::L2Norm,
            CaseKind::Forward,
            "l2_norm = l2norm(eps=1e-6)",
            &l2,
            (names(&["x"]), names(&["y"])),
            Arc::new(|b, t| Ok(vec![b.l2_norm(&t[0], 1e-6)?.output])),
        ),
        case::<B>(
            Op::L2NormBackward,
            CaseKind::Backward,
            "l2_norm_backward = autograd of l2norm(eps=1e-6)",
            &l2,
            (names(&["x", "dy"]), names(&["dx"])),
            Arc::new(|b, t| {
                let rnorm = b.l2_norm(&t[0], 1e-6)?.rstd;
                Ok(vec![b.l2_norm_backward(&t[0], &rnorm, &t[1])?])
            }),
        ),
        case::<B>(
            Op::RmsNormGated,
            CaseKind::Forward,
            "rms_norm_gated = Qwen3_5RMSNormGated(eps=1e-6)",
            &gated,
            (names(&["x", "z", "weight"]), names(&["y"])),
            Arc::new(|b, t| Ok(vec![b.rms_norm_gated(&t[0], &t[1], &t[2], 1e-6)?])),
        ),
        case::<B>(
            Op::RmsNormGatedBackward,
            CaseKind::Backward,
            "rms_norm_gated_backward = autograd of Qwen3_5RMSNormGated(eps=1e-6)",
            &gated,
            (names(&["x", "z", "weight", "dy"]), names(&["dx", "dz", "dweight"])),
            Arc::new(|b, t| {
                let g = b.rms_norm_gated_backward(&t[0], &t[1], &t[2], &t[3], 1e-6)?;
                Ok(vec![g.dx, g.dz, g.dweight])
            }),
        ),
    ]
}

/// `gdn_gates` (the gate lines of `Qwen3_5GatedDeltaNet.forward`) and its backward.
pub fn gates_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let f = Arc::new(parse(include_str!("../../fixtures/gdn_ops/gates.txt")));
    vec![
        case::<B>(
            Op::GdnGates,
            CaseKind::Forward,
            "gdn_gates = Qwen3_5GatedDeltaNet's beta = b.sigmoid(), g = -A_log.exp()·softplus(a + dt_bias)",
            &f,
            (names(&["a", "b", "a_log", "dt_bias"]), names(&["g", "beta"])),
            Arc::new(|b, t| {
                let o = b.gdn_gates(&t[0], &t[1], &t[2], &t[3])?;
                Ok(vec![o.g, o.beta])
            }),
        ),
        case::<B>(
            Op::GdnGatesBackward,
            CaseKind::Backward,
            "gdn_gates_backward = autograd of Qwen3_5GatedDeltaNet's gates",
            &f,
            (names(&["a", "b", "a_log", "dt_bias", "dg", "dbeta"]), names(&["da", "db", "da_log", "ddt_bias"])),
            Arc::new(|b, t| {
                let g = b.gdn_gates_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5])?;
                Ok(vec![g.da, g.db, g.da_log, g.ddt_bias])
            }),
        ),
    ]
}
