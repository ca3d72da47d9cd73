//! Cases of the conv family: conv1d, conv2d and conv_transpose1d with groups, stride,
//! padding and dilation (and the 1×1 fast path), and the causal depthwise forms (the
//! SiLU form's carried-context variant and backward against transformers' too). Lengths
//! and spatial sizes that stretch (L, W, K) are valid for the op on their own, so those
//! inputs are shape-free; wrong channel counts and parameters are explicit error cases.

use fusebox::{ComputeBackend, Conv1dConfig, Conv2dConfig, DType, Op, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::cases::gdn_fixture;
use crate::reference::conv as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Dims of a test tensor, and the dtypes a configuration runs with (for config tables).
type Dims = &'static [usize];
type DTypes = &'static [DType];

/// A reproducible uniform [-1, 1) f32 tensor (seeded by its shape and a salt).
fn rand(dims: &[usize], salt: u64) -> Tensor {
    let seed = dims.iter().fold(salt.wrapping_mul(0x9E37_79B9), |h, &d| h.wrapping_mul(31).wrapping_add(d as u64));
    Rng::new(seed).normal_ish(dims.to_vec())
}

fn conv1d_config(stride: usize, padding: usize, dilation: usize, groups: usize) -> Conv1dConfig {
    Conv1dConfig { stride, padding, dilation, groups, output_padding: 0 }
}

fn conv1d_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool, Conv1dConfig, DTypes); 6] = [
        (&[2, 6, 23], &[8, 3, 5], true, conv1d_config(2, 2, 2, 2), ALL),
        (&[3, 5, 17], &[7, 5, 3], false, Conv1dConfig::default(), ALL),
        // 1×1 kernel, stride 1, no padding: the input is its own column matrix.
        (&[2, 8, 19], &[12, 8, 1], true, Conv1dConfig::default(), &[DType::F32, DType::F16]),
        // Depthwise through groups = channels, padding larger than the kernel reach.
        (&[2, 6, 20], &[6, 1, 4], true, conv1d_config(1, 3, 1, 6), &[DType::F32]),
        // Kernel span equal to the padded input: one output.
        (&[1, 2, 5], &[3, 2, 4], true, conv1d_config(3, 1, 2, 1), &[DType::F32]),
        // Large enough for gemm's threads.
        (&[2, 32, 150], &[48, 32, 3], true, conv1d_config(1, 1, 1, 1), &[DType::F32, DType::BF16]),
    ];
    for (xd, wd, with_bias, cfg, dtypes) in configs {
        let mut case = OpCase::new(Op::Conv1d, format!("conv1d x{xd:?} w{wd:?} bias={with_bias} {cfg:?}"))
            // Any L and K that fit are valid on their own.
            .input(Input::new(rand(xd, 1)).shape_free())
            .input(Input::new(rand(wd, 2)).shape_free());
        if with_bias {
            case = case
                .input(rand(&wd[..1], 3))
                .call(move |be: &B, t| Ok(vec![be.conv1d(&t[0], &t[1], Some(&t[2]), &cfg)?]))
                .twin(move |x| vec![twin::conv1d(&x[0], &x[1], Some(&x[2]), &cfg)]);
        } else {
            case = case
                .call(move |be: &B, t| Ok(vec![be.conv1d(&t[0], &t[1], None, &cfg)?]))
                .twin(move |x| vec![twin::conv1d(&x[0], &x[1], None, &cfg)]);
        }
        cases.extend(case.tolerance(Tolerance::F32_LOOSE).dtypes(dtypes).build());
    }
    let t = |d: &[usize]| rand(d, 4);
    let bad: [(&str, Dims, Dims, Conv1dConfig); 8] = [
        ("input channels 5 not divisible by groups 2", &[1, 5, 10], &[4, 2, 3], conv1d_config(1, 0, 1, 2)),
        ("output channels 5 not divisible by groups 2", &[1, 4, 10], &[5, 2, 3], conv1d_config(1, 0, 1, 2)),
        ("w dim 1 != Cin/groups", &[1, 4, 10], &[4, 3, 3], conv1d_config(1, 0, 1, 2)),
        ("kernel span 9 > padded input 8", &[1, 2, 6], &[3, 2, 5], conv1d_config(1, 1, 2, 1)),
        ("stride 0", &[1, 2, 6], &[3, 2, 3], conv1d_config(0, 0, 1, 1)),
        ("dilation 0", &[1, 2, 6], &[3, 2, 3], conv1d_config(1, 0, 0, 1)),
        ("groups 0", &[1, 2, 6], &[3, 2, 3], conv1d_config(1, 0, 1, 0)),
        ("kernel size 0", &[1, 2, 6], &[3, 2, 0], Conv1dConfig::default()),
    ];
    for (what, xd, wd, cfg) in bad {
        cases.push(Case::expect_error(Op::Conv1d, format!("conv1d {what}: x{xd:?} w{wd:?} {cfg:?}"), move |b: &B| {
            b.conv1d(&t(xd), &t(wd), None, &cfg).map(drop)
        }));
    }
    cases.push(Case::expect_error(Op::Conv1d, "conv1d output_padding 1 (conv_transpose1d only)", move |b: &B| {
        let cfg = Conv1dConfig { output_padding: 1, stride: 2, ..Conv1dConfig::default() };
        b.conv1d(&t(&[1, 2, 6]), &t(&[3, 2, 3]), None, &cfg).map(drop)
    }));
    cases.push(Case::expect_error(Op::Conv1d, "conv1d x rank 2", move |b: &B| {
        b.conv1d(&t(&[2, 6]), &t(&[3, 2, 3]), None, &Conv1dConfig::default()).map(drop)
    }));
    cases.push(Case::expect_error(Op::Conv1d, "conv1d bias f16 with f32 x", move |b: &B| {
        let bias = Tensor::from_f32_as(&[0.5; 3], [3], DType::F16).expect("f16");
        b.conv1d(&t(&[1, 2, 6]), &t(&[3, 2, 3]), Some(&bias), &Conv1dConfig::default()).map(drop)
    }));
    cases
}

fn conv2d_config(
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
) -> Conv2dConfig {
    Conv2dConfig { stride, padding, dilation, groups }
}

fn conv2d_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool, Conv2dConfig, DTypes); 5] = [
        (&[2, 4, 9, 11], &[6, 2, 3, 2], true, conv2d_config((2, 1), (1, 2), (1, 2), 2), ALL),
        (&[1, 3, 7, 8], &[5, 3, 3, 3], false, Conv2dConfig::default(), ALL),
        (&[2, 8, 5, 7], &[4, 8, 1, 1], true, Conv2dConfig::default(), &[DType::F32]),
        (&[1, 2, 6, 5], &[2, 1, 2, 3], true, conv2d_config((3, 2), (2, 0), (2, 1), 2), &[DType::F32]),
        // Large enough for gemm's threads and a threaded unfold.
        (&[1, 16, 20, 24], &[24, 16, 3, 3], true, conv2d_config((1, 1), (1, 1), (1, 1), 1), &[DType::F32, DType::BF16]),
    ];
    for (xd, wd, with_bias, cfg, dtypes) in configs {
        let mut case = OpCase::new(Op::Conv2d, format!("conv2d x{xd:?} w{wd:?} bias={with_bias} {cfg:?}"))
            .input(Input::new(rand(xd, 11)).shape_free())
            .input(Input::new(rand(wd, 12)).shape_free());
        if with_bias {
            case = case
                .input(rand(&wd[..1], 13))
                .call(move |be: &B, t| Ok(vec![be.conv2d(&t[0], &t[1], Some(&t[2]), &cfg)?]))
                .twin(move |x| vec![twin::conv2d(&x[0], &x[1], Some(&x[2]), &cfg)]);
        } else {
            case = case
                .call(move |be: &B, t| Ok(vec![be.conv2d(&t[0], &t[1], None, &cfg)?]))
                .twin(move |x| vec![twin::conv2d(&x[0], &x[1], None, &cfg)]);
        }
        cases.extend(case.tolerance(Tolerance::F32_LOOSE).dtypes(dtypes).build());
    }
    let t = |d: &[usize]| rand(d, 14);
    let bad: [(&str, Dims, Dims, Conv2dConfig); 6] = [
        (
            "input channels 3 not divisible by groups 2",
            &[1, 3, 6, 6],
            &[4, 1, 3, 3],
            conv2d_config((1, 1), (0, 0), (1, 1), 2),
        ),
        ("w dim 1 != Cin/groups", &[1, 4, 6, 6], &[4, 4, 3, 3], conv2d_config((1, 1), (0, 0), (1, 1), 2)),
        ("kernel height 7 > padded input 6", &[1, 2, 4, 6], &[3, 2, 7, 1], conv2d_config((1, 1), (1, 0), (1, 1), 1)),
        ("kernel width span > padded input", &[1, 2, 6, 4], &[3, 2, 1, 3], conv2d_config((1, 1), (0, 0), (1, 2), 1)),
        ("stride 0 along w", &[1, 2, 6, 6], &[3, 2, 3, 3], conv2d_config((1, 0), (0, 0), (1, 1), 1)),
        ("dilation 0 along h", &[1, 2, 6, 6], &[3, 2, 3, 3], conv2d_config((1, 1), (0, 0), (0, 1), 1)),
    ];
    for (what, xd, wd, cfg) in bad {
        cases.push(Case::expect_error(Op::Conv2d, format!("conv2d {what}: x{xd:?} w{wd:?} {cfg:?}"), move |b: &B| {
            b.conv2d(&t(xd), &t(wd), None, &cfg).map(drop)
        }));
    }
    cases.push(Case::expect_error(Op::Conv2d, "conv2d w rank 3", move |b: &B| {
        b.conv2d(&t(&[1, 2, 6, 6]), &t(&[3, 2, 3]), None, &Conv2dConfig::default()).map(drop)
    }));
    cases
}

fn conv_transpose1d_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let cfg = |stride, padding, dilation, groups, output_padding| Conv1dConfig {
        stride,
        padding,
        dilation,
        groups,
        output_padding,
    };
    let configs: [(Dims, Dims, bool, Conv1dConfig, DTypes); 5] = [
        (&[2, 4, 9], &[4, 3, 4], true, cfg(3, 2, 2, 2, 1), ALL),
        (&[1, 3, 10], &[3, 5, 3], false, Conv1dConfig::default(), ALL),
        // Stride larger than the kernel reach: gaps of bias only.
        (&[2, 3, 7], &[3, 2, 2], true, cfg(4, 0, 1, 1, 3), &[DType::F32]),
        // Many small (batch, group) items over threads.
        (&[4, 16, 40], &[16, 8, 3], true, cfg(2, 1, 1, 2, 0), &[DType::F32]),
        // Large enough for gemm's threads and a threaded scatter.
        (&[1, 64, 128], &[64, 80, 4], true, cfg(2, 1, 1, 1, 0), &[DType::F32, DType::BF16]),
    ];
    for (xd, wd, with_bias, cfg, dtypes) in configs {
        let cout = wd[1] * cfg.groups;
        let mut case =
            OpCase::new(Op::ConvTranspose1d, format!("conv_transpose1d x{xd:?} w{wd:?} bias={with_bias} {cfg:?}"))
                // Any L and K are valid on their own.
                .input(Input::new(rand(xd, 21)).shape_free())
                .input(Input::new(rand(wd, 22)).shape_free());
        if with_bias {
            case = case
                .input(rand(&[cout], 23))
                .call(move |be: &B, t| Ok(vec![be.conv_transpose1d(&t[0], &t[1], Some(&t[2]), &cfg)?]))
                .twin(move |x| vec![twin::conv_transpose1d(&x[0], &x[1], Some(&x[2]), &cfg)]);
        } else {
            case = case
                .call(move |be: &B, t| Ok(vec![be.conv_transpose1d(&t[0], &t[1], None, &cfg)?]))
                .twin(move |x| vec![twin::conv_transpose1d(&x[0], &x[1], None, &cfg)]);
        }
        cases.extend(case.tolerance(Tolerance::F32_LOOSE).dtypes(dtypes).build());
    }
    let t = |d: &[usize]| rand(d, 24);
    let bad: [(&str, Dims, Dims, Conv1dConfig); 6] = [
        ("output_padding 2 >= max(stride 2, dilation 1)", &[1, 2, 5], &[2, 3, 3], cfg(2, 0, 1, 1, 2)),
        ("w dim 0 != Cin", &[1, 2, 5], &[3, 3, 3], Conv1dConfig::default()),
        ("input channels 3 not divisible by groups 2", &[1, 3, 5], &[3, 2, 3], cfg(1, 0, 1, 2, 0)),
        ("stride 0", &[1, 2, 5], &[2, 3, 3], cfg(0, 0, 1, 1, 0)),
        ("padding 5 leaves no output", &[1, 2, 2], &[2, 2, 2], cfg(1, 5, 1, 1, 0)),
        ("empty input length", &[1, 2, 0], &[2, 2, 2], Conv1dConfig::default()),
    ];
    for (what, xd, wd, c) in bad {
        cases.push(Case::expect_error(
            Op::ConvTranspose1d,
            format!("conv_transpose1d {what}: x{xd:?} w{wd:?} {c:?}"),
            move |b: &B| b.conv_transpose1d(&t(xd), &t(wd), None, &c).map(drop),
        ));
    }
    cases
}

/// Which causal depthwise form a case exercises.
#[derive(Debug, Clone, Copy)]
enum Depthwise {
    Silu,
    Bias,
}

fn depthwise_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, usize, DTypes); 6] = [
        (&[2, 5, 37], 4, ALL),
        (&[1, 3, 19], 1, &[DType::F32]),
        // Kernel longer than the sequence.
        (&[1, 3, 2], 5, &[DType::F32]),
        (&[2, 7, 0], 3, &[DType::F32]),
        // One position (the one-step path, zeros before it).
        (&[2, 5, 1], 4, &[DType::F32, DType::BF16]),
        // Large enough for threads.
        (&[4, 64, 300], 4, &[DType::F32, DType::F16]),
    ];
    for form in [Depthwise::Silu, Depthwise::Bias] {
        let op = match form {
            Depthwise::Silu => Op::DepthwiseConv1dSilu,
            Depthwise::Bias => Op::DepthwiseConv1dBias,
        };
        for (xd, k, dtypes) in configs {
            let c = xd[1];
            cases.extend(
                OpCase::new(op, format!("{} x{xd:?} w[{c}, {k}]", op.name()))
                    // Any L and K are valid on their own.
                    .input(Input::new(rand(xd, 31)).shape_free())
                    .input(Input::new(rand(&[c, k], 32)).shape_free())
                    .input(rand(&[c], 33))
                    .call(move |be: &B, t| {
                        Ok(vec![match form {
                            Depthwise::Silu => be.depthwise_conv1d_silu(&t[0], &t[1], &t[2])?,
                            Depthwise::Bias => be.depthwise_conv1d_bias(&t[0], &t[1], &t[2])?,
                        }])
                    })
                    .twin(move |x| {
                        vec![match form {
                            Depthwise::Silu => twin::depthwise_conv1d_silu(&x[0], &x[1], &x[2]),
                            Depthwise::Bias => twin::depthwise_conv1d_bias(&x[0], &x[1], &x[2]),
                        }]
                    })
                    .dtypes(dtypes)
                    .build(),
            );
        }
        let t = |d: &[usize]| rand(d, 34);
        let call = move |b: &B, x: &Tensor, w: &Tensor, bias: &Tensor| match form {
            Depthwise::Silu => b.depthwise_conv1d_silu(x, w, bias).map(drop),
            Depthwise::Bias => b.depthwise_conv1d_bias(x, w, bias).map(drop),
        };
        cases.push(Case::expect_error(op, format!("{} w rows 4 != channels 3", op.name()), move |b: &B| {
            call(b, &t(&[1, 3, 8]), &t(&[4, 2]), &t(&[3]))
        }));
        cases.push(Case::expect_error(op, format!("{} kernel size 0", op.name()), move |b: &B| {
            call(b, &t(&[1, 3, 8]), &t(&[3, 0]), &t(&[3]))
        }));
        cases.push(Case::expect_error(op, format!("{} x rank 2", op.name()), move |b: &B| {
            call(b, &t(&[3, 8]), &t(&[3, 2]), &t(&[3]))
        }));
    }

    let ctx_configs: [(Dims, usize, DTypes); 4] = [
        (&[2, 5, 37], 4, ALL),
        (&[1, 3, 9], 1, &[DType::F32]),
        // The sequence shorter than the context.
        (&[2, 3, 2], 5, &[DType::F32]),
        (&[2, 64, 500], 4, &[DType::F32, DType::BF16]),
    ];
    for (xd, k, dtypes) in ctx_configs {
        let (b, c) = (xd[0], xd[1]);
        cases.extend(
            OpCase::new(
                Op::DepthwiseConv1dBiasCtx,
                format!("depthwise_conv1d_bias_ctx ctx[{b}, {c}, {}] x{xd:?} w[{c}, {k}]", k - 1),
            )
            .input(rand(&[b, c, k - 1], 41))
            // Any L is valid on its own.
            .input(Input::new(rand(xd, 42)).shape_free())
            .input(rand(&[c, k], 43))
            .input(rand(&[c], 44))
            .call(|be: &B, t| Ok(vec![be.depthwise_conv1d_bias_ctx(&t[0], &t[1], &t[2], &t[3])?]))
            .twin(|x| vec![twin::depthwise_conv1d_bias_ctx(&x[0], &x[1], &x[2], &x[3])])
            .dtypes(dtypes)
            .build(),
        );
    }
    let t = |d: &[usize]| rand(d, 45);
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dBiasCtx,
        "depthwise_conv1d_bias_ctx ctx batch 2 vs x batch 1",
        move |b: &B| b.depthwise_conv1d_bias_ctx(&t(&[2, 3, 2]), &t(&[1, 3, 8]), &t(&[3, 3]), &t(&[3])).map(drop),
    ));
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dBiasCtx,
        "depthwise_conv1d_bias_ctx kernel size 0",
        move |b: &B| b.depthwise_conv1d_bias_ctx(&t(&[1, 3, 0]), &t(&[1, 3, 8]), &t(&[3, 0]), &t(&[3])).map(drop),
    ));
    cases
}

/// `depthwise_conv1d_silu_ctx`: against its twin (decode steps L = 1 among them, with
/// enough channels for the threaded step path), against the plain op on the
/// concatenation `[ctx, x]`, and token-by-token decode against the prompt form.
fn depthwise_silu_ctx_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, usize, DTypes); 6] = [
        (&[2, 5, 37], 4, ALL),
        (&[1, 3, 9], 1, &[DType::F32]),
        // The sequence shorter than the context.
        (&[2, 3, 2], 5, &[DType::F32]),
        // Decode steps: one token, small and with channels enough for threads.
        (&[2, 5, 1], 4, ALL),
        (&[2, 3000, 1], 4, &[DType::F32, DType::BF16]),
        (&[2, 64, 500], 4, &[DType::F32, DType::BF16]),
    ];
    for (i, (xd, k, dtypes)) in configs.into_iter().enumerate() {
        let (b, c) = (xd[0], xd[1]);
        let mut case = OpCase::new(
            Op::DepthwiseConv1dSiluCtx,
            format!("depthwise_conv1d_silu_ctx ctx[{b}, {c}, {}] x{xd:?} w[{c}, {k}]", k - 1),
        )
        .input(rand(&[b, c, k - 1], 51))
        // Any L is valid on its own.
        .input(Input::new(rand(xd, 52)).shape_free())
        .input(rand(&[c, k], 53))
        .input(rand(&[c], 54))
        .call(|be: &B, t| Ok(vec![be.depthwise_conv1d_silu_ctx(&t[0], &t[1], &t[2], &t[3])?]))
        .twin(|x| vec![twin::depthwise_conv1d_silu_ctx(&x[0], &x[1], &x[2], &x[3])])
        .dtypes(dtypes);
        if i > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    for (xd, k) in [([2usize, 5, 9], 4usize), ([1, 3, 2], 4), ([3, 200, 40], 4)] {
        let (b, c, l) = (xd[0], xd[1], xd[2]);
        let (ctx, x, w, bias) = (rand(&[b, c, k - 1], 55), rand(&xd, 56), rand(&[c, k], 57), rand(&[c], 58));
        cases.push(Case::custom(
            Op::DepthwiseConv1dSiluCtx,
            CaseKind::Property,
            format!(
                "depthwise_conv1d_silu_ctx ctx[{b}, {c}, {}] x{xd:?} equals depthwise_conv1d_silu of [ctx, x] past ctx",
                k - 1
            ),
            move |be: &B| {
                let got = host(
                    be,
                    be.depthwise_conv1d_silu_ctx(&up(be, &ctx)?, &up(be, &x)?, &up(be, &w)?, &up(be, &bias)?),
                )?;
                let joined = concat_len(&ctx, &x);
                let full = host(be, be.depthwise_conv1d_silu(&up(be, &joined)?, &up(be, &w)?, &up(be, &bias)?))?;
                let want = slice_len(&full, k - 1, l);
                Tolerance::F32.check("output", &Array::from_tensor(&got), &Array::from_tensor(&want))
            },
        ));
        let (x, w, bias) = (rand(&xd, 59), rand(&[c, k], 60), rand(&[c], 61));
        for with_ctx in [false, true] {
            let (x, w, bias) = (x.clone(), w.clone(), bias.clone());
            let ctx0 = if with_ctx {
                rand(&[b, c, k - 1], 62)
            } else {
                Tensor::zeros([b, c, k - 1], DType::F32).expect("zeros")
            };
            cases.push(Case::custom(
                Op::DepthwiseConv1dSiluCtx,
                CaseKind::Property,
                format!(
                    "depthwise_conv1d_silu_ctx x{xd:?} K={k}: one token at a time (L = 1, the state carried) equals the \
                     prompt form, {} initial state",
                    if with_ctx { "random" } else { "zero" }
                ),
                move |be: &B| {
                    let (w_up, bias_up) = (up(be, &w)?, up(be, &bias)?);
                    let prompt = if with_ctx {
                        be.depthwise_conv1d_silu_ctx(&up(be, &ctx0)?, &up(be, &x)?, &w_up, &bias_up)
                    } else {
                        be.depthwise_conv1d_silu(&up(be, &x)?, &w_up, &bias_up)
                    };
                    let prompt = host(be, prompt)?;
                    let mut state = ctx0.clone();
                    for t in 0..l {
                        let token = slice_len(&x, t, 1);
                        let y = host(be, be.depthwise_conv1d_silu_ctx(&up(be, &state)?, &up(be, &token)?, &w_up, &bias_up))?;
                        let want = slice_len(&prompt, t, 1);
                        Tolerance::F32.check(&format!("token {t}"), &Array::from_tensor(&y), &Array::from_tensor(&want))?;
                        // The state after the token: the last K−1 inputs of [state, token].
                        state = slice_len(&concat_len(&state, &token), 1, k - 1);
                    }
                    Ok(())
                },
            ));
        }
    }
    let t = |d: &[usize]| rand(d, 63);
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dSiluCtx,
        "depthwise_conv1d_silu_ctx ctx length 2 for K = 4 (needs 3)",
        move |b: &B| b.depthwise_conv1d_silu_ctx(&t(&[1, 3, 2]), &t(&[1, 3, 1]), &t(&[3, 4]), &t(&[3])).map(drop),
    ));
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dSiluCtx,
        "depthwise_conv1d_silu_ctx ctx f16 with f32 x",
        move |b: &B| {
            let ctx = Tensor::from_f32_as(&[0.5; 9], [1, 3, 3], DType::F16)?;
            b.depthwise_conv1d_silu_ctx(&ctx, &t(&[1, 3, 1]), &t(&[3, 4]), &t(&[3])).map(drop)
        },
    ));
    cases
}

/// `depthwise_conv1d_silu_backward`: the twin by finite differences and the backend against
/// it (with and without a context, L shorter than the context, K = 1), threaded sizes
/// against the twin in F32 and BF16 with an explicit d_out, and bad inputs.
fn depthwise_silu_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (xd, k) in [([2usize, 3, 7], 4usize), ([1, 2, 2], 4), ([2, 2, 5], 1)] {
        let (b, c) = (xd[0], xd[1]);
        cases.extend(
            GradCase::<B>::new(Op::DepthwiseConv1dSiluBackward, format!("depthwise_conv1d_silu x{xd:?} w[{c}, {k}]"))
                .input(Input::new(rand(&xd, 71)).shape_free())
                // Any K is valid on its own without a context.
                .input(Input::new(rand(&[c, k], 72)).shape_free())
                .input(rand(&[c], 73))
                .forward(|x| twin::depthwise_conv1d_silu(&x[0], &x[1], &x[2]))
                .backward_twin(|x, dy| {
                    let (dx, dw, dbias, _) = twin::depthwise_conv1d_silu_backward(None, &x[0], &x[1], &x[2], dy);
                    vec![dx, dw, dbias]
                })
                .backward_call(|be: &B, t, dy| {
                    let g = be.depthwise_conv1d_silu_backward(None, &t[0], &t[1], &t[2], dy)?;
                    Ok(vec![g.dx, g.dw, g.dbias])
                })
                .build(),
        );
        cases.extend(
            GradCase::<B>::new(
                Op::DepthwiseConv1dSiluBackward,
                format!("depthwise_conv1d_silu_ctx ctx[{b}, {c}, {}] x{xd:?} w[{c}, {k}]", k - 1),
            )
            .input(rand(&[b, c, k - 1], 74))
            .input(Input::new(rand(&xd, 75)).shape_free())
            .input(rand(&[c, k], 76))
            .input(rand(&[c], 77))
            .forward(|x| twin::depthwise_conv1d_silu_ctx(&x[0], &x[1], &x[2], &x[3]))
            .backward_twin(|x, dy| {
                let (dx, dw, dbias, d_ctx) = twin::depthwise_conv1d_silu_backward(Some(&x[0]), &x[1], &x[2], &x[3], dy);
                vec![d_ctx.expect("a context gives its gradient"), dx, dw, dbias]
            })
            .backward_call(|be: &B, t, dy| {
                let g = be.depthwise_conv1d_silu_backward(Some(&t[0]), &t[1], &t[2], &t[3], dy)?;
                let d_ctx = g.d_ctx.ok_or_else(|| fusebox::Error::value("test", "d_ctx", "Some", "None"))?;
                Ok(vec![d_ctx, g.dx, g.dw, g.dbias])
            })
            .build(),
        );
    }
    // Threaded sizes (blocks of channels) and a decode-sized step, against the twin.
    let configs: [(Dims, usize, bool, DTypes); 4] = [
        (&[3, 64, 300], 4, false, &[DType::F32, DType::BF16]),
        (&[2, 64, 300], 4, true, &[DType::F32, DType::F16]),
        (&[2, 3000, 1], 4, true, &[DType::F32]),
        (&[2, 5, 0], 4, true, &[DType::F32]),
    ];
    for (xd, k, with_ctx, dtypes) in configs {
        let (b, c) = (xd[0], xd[1]);
        let mut case = OpCase::new(
            Op::DepthwiseConv1dSiluBackward,
            format!("depthwise_conv1d_silu_backward x{xd:?} w[{c}, {k}] ctx={with_ctx} explicit d_out"),
        )
        .input(rand(xd, 81))
        .input(rand(&[c, k], 82))
        .input(rand(&[c], 83))
        .input(rand(xd, 84))
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes)
        .no_bad_inputs();
        if with_ctx {
            case = case
                .input(rand(&[b, c, k - 1], 85))
                .call(|be: &B, t| {
                    let g = be.depthwise_conv1d_silu_backward(Some(&t[4]), &t[0], &t[1], &t[2], &t[3])?;
                    Ok([g.dx, g.dw, g.dbias].into_iter().chain(g.d_ctx).collect())
                })
                .twin(|x| {
                    let (dx, dw, dbias, d_ctx) =
                        twin::depthwise_conv1d_silu_backward(Some(&x[4]), &x[0], &x[1], &x[2], &x[3]);
                    [dx, dw, dbias].into_iter().chain(d_ctx).collect()
                });
        } else {
            case = case
                .call(|be: &B, t| {
                    let g = be.depthwise_conv1d_silu_backward(None, &t[0], &t[1], &t[2], &t[3])?;
                    Ok([g.dx, g.dw, g.dbias].into_iter().chain(g.d_ctx).collect())
                })
                .twin(|x| {
                    let (dx, dw, dbias, _) = twin::depthwise_conv1d_silu_backward(None, &x[0], &x[1], &x[2], &x[3]);
                    vec![dx, dw, dbias]
                });
        }
        cases.extend(case.build());
    }
    let t = |d: &[usize]| rand(d, 86);
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dSiluBackward,
        "depthwise_conv1d_silu_backward d_out [1, 3, 7] for x [1, 3, 8]",
        move |b: &B| {
            b.depthwise_conv1d_silu_backward(None, &t(&[1, 3, 8]), &t(&[3, 4]), &t(&[3]), &t(&[1, 3, 7])).map(drop)
        },
    ));
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dSiluBackward,
        "depthwise_conv1d_silu_backward ctx [1, 3, 4] for K = 4",
        move |b: &B| {
            let ctx = t(&[1, 3, 4]);
            b.depthwise_conv1d_silu_backward(Some(&ctx), &t(&[1, 3, 8]), &t(&[3, 4]), &t(&[3]), &t(&[1, 3, 8]))
                .map(drop)
        },
    ));
    cases.push(Case::expect_error(
        Op::DepthwiseConv1dSiluBackward,
        "depthwise_conv1d_silu_backward d_out bf16 with f32 x",
        move |b: &B| {
            let dy = Tensor::from_f32_as(&[0.5; 24], [1, 3, 8], DType::BF16)?;
            b.depthwise_conv1d_silu_backward(None, &t(&[1, 3, 8]), &t(&[3, 4]), &t(&[3]), &dy).map(drop)
        },
    ));
    cases
}

/// `x` on the backend.
fn up<B: ComputeBackend + ?Sized>(be: &B, x: &Tensor) -> Result<Tensor, String> {
    be.upload(x).map_err(|e| format!("upload: {e}"))
}

/// An op's result brought to the host (or its error as the case's message).
fn host<B: ComputeBackend + ?Sized>(be: &B, r: fusebox::Result<Tensor>) -> Result<Tensor, String> {
    be.to_host(&r.map_err(|e| format!("returned an error: {e}"))?).map_err(|e| format!("to_host: {e}"))
}

/// `[a, b]` along the length of two host `[B, C, ·]` tensors (f32).
fn concat_len(a: &Tensor, b: &Tensor) -> Tensor {
    let (av, bv) = (a.to_vec_f32().expect("f32"), b.to_vec_f32().expect("f32"));
    let (la, lb) = (a.dims()[2], b.dims()[2]);
    let rows = a.dims()[0] * a.dims()[1];
    let mut v = Vec::with_capacity(rows * (la + lb));
    for r in 0..rows {
        v.extend_from_slice(&av[r * la..(r + 1) * la]);
        v.extend_from_slice(&bv[r * lb..(r + 1) * lb]);
    }
    Tensor::from_vec(v, [a.dims()[0], a.dims()[1], la + lb]).expect("shape")
}

/// Positions `start..start + len` along the length of a host `[B, C, L]` tensor (f32).
fn slice_len(x: &Tensor, start: usize, len: usize) -> Tensor {
    let v = x.to_vec_f32().expect("f32");
    let l = x.dims()[2];
    let rows = x.dims()[0] * x.dims()[1];
    let out: Vec<f32> = (0..rows).flat_map(|r| v[r * l + start..r * l + start + len].to_vec()).collect();
    Tensor::from_vec(out, [x.dims()[0], x.dims()[1], len]).expect("shape")
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = conv1d_cases();
    cases.extend(conv2d_cases());
    cases.extend(conv_transpose1d_cases());
    cases.extend(depthwise_cases());
    cases.extend(depthwise_silu_ctx_cases());
    cases.extend(depthwise_silu_backward_cases());
    cases.extend(gdn_fixture::conv_cases());
    cases
}
