//! Cases of the conv family: conv1d, conv2d and conv_transpose1d with groups, stride,
//! padding and dilation (and the 1×1 fast path), and the causal depthwise forms. Lengths
//! and spatial sizes that stretch (L, W, K) are valid for the op on their own, so those
//! inputs are shape-free; wrong channel counts and parameters are explicit error cases.

use fusebox::{ComputeBackend, Conv1dConfig, Conv2dConfig, DType, Op, Tensor};

use crate::case::{Case, Input, OpCase};
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
    let configs: [(Dims, usize, DTypes); 5] = [
        (&[2, 5, 37], 4, ALL),
        (&[1, 3, 19], 1, &[DType::F32]),
        // Kernel longer than the sequence.
        (&[1, 3, 2], 5, &[DType::F32]),
        (&[2, 7, 0], 3, &[DType::F32]),
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

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = conv1d_cases();
    cases.extend(conv2d_cases());
    cases.extend(conv_transpose1d_cases());
    cases.extend(depthwise_cases());
    cases
}
