//! The WGSL kernels (sources in `shaders/`) and the prelude every one is compiled with.

use crate::context::Kernel;

/// Declarations shared by every kernel: binding 0 is the parameter block: the word
/// offsets of the tensors bound at 1..=12, then the x workgroup count of the dispatch,
/// then the kernel's own parameters (`pu`/`pf`).
pub const PRELUDE: &str = r#"
@group(0) @binding(0) var<storage, read> P: array<u32>;
fn off(k: u32) -> u32 { return P[k]; }
fn pu(i: u32) -> u32 { return P[13u + i]; }
fn pf(i: u32) -> f32 { return bitcast<f32>(P[13u + i]); }
fn flat_group(wid: vec3<u32>) -> u32 { return wid.x + wid.y * P[12u]; }
fn inf_f32() -> f32 { return bitcast<f32>(0x7f800000u); }

var<workgroup> red: array<f32, 256>;
// Sum of `v` over the 256 threads of a workgroup, in a fixed tree order.
fn wg_sum(v: f32, t: u32) -> f32 {
    workgroupBarrier();
    red[t] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] = red[t] + red[t + s]; }
        workgroupBarrier();
    }
    return red[0];
}
// Maximum of `v` over the 256 threads of a workgroup.
fn wg_max(v: f32, t: u32) -> f32 {
    workgroupBarrier();
    red[t] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] = max(red[t], red[t + s]); }
        workgroupBarrier();
    }
    return red[0];
}
"#;

const ELEMENTWISE_FNS: &str = include_str!("shaders/elementwise.wgsl");

macro_rules! kernel {
    ($name:ident, $file:literal, $entry:literal, [$($w:expr),*]) => {
        pub const $name: Kernel = Kernel { name: $file, source: include_str!(concat!("shaders/", $file)), entry: $entry, writes: &[$($w),*] };
    };
}

/// Kernels whose sources need the elementwise function library prepended.
pub const UNARY: Kernel =
    Kernel { name: "elementwise.wgsl", source: ELEMENTWISE_FNS, entry: "unary", writes: &[false, true] };
pub const BINARY: Kernel =
    Kernel { name: "elementwise2.wgsl", source: "", entry: "binary", writes: &[false, false, true] };
pub const ROW: Kernel = Kernel { name: "elementwise2.wgsl", source: "", entry: "row", writes: &[false, false, true] };
pub const COL: Kernel = Kernel { name: "elementwise2.wgsl", source: "", entry: "col", writes: &[false, false, true] };
pub const UNARY_INPLACE: Kernel = Kernel { name: "inplace.wgsl", source: "", entry: "unary_inplace", writes: &[true] };
pub const BINARY_INPLACE: Kernel =
    Kernel { name: "assign.wgsl", source: "", entry: "binary_inplace", writes: &[true, false] };

kernel!(TERNARY, "ternary.wgsl", "ternary", [false, false, false, true]);
kernel!(SILU_MUL_BACKWARD, "ternary.wgsl", "silu_mul_backward", [false, false, false, true, true]);
/// The GeGLU backward (gated.wgsl, with the elementwise function library).
pub const GELU_MUL_BACKWARD: Kernel =
    Kernel { name: "gated.wgsl", source: "", entry: "gelu_mul_backward", writes: &[false, false, false, true, true] };
kernel!(ADAMW, "adamw.wgsl", "adamw", [true, false, true, true]);
kernel!(MATMUL, "matmul.wgsl", "matmul", [false, false, false, true]);
kernel!(SUM_ROWS, "reduce.wgsl", "sum_rows", [false, true]);
kernel!(SUM_SQUARES, "reduce.wgsl", "sum_squares", [false, true]);
kernel!(REDUCE_AXIS, "reduce_axis.wgsl", "reduce_axis", [false, false, false, true, true]);
kernel!(MAX_ROUTE, "max_route.wgsl", "max_route", [false, false, true]);
kernel!(PERMUTE, "permute.wgsl", "permute", [false, true]);
kernel!(PERMUTE16, "permute16.wgsl", "permute16", [false, true]);
kernel!(RMS_NORM, "norm_rms.wgsl", "rms_norm", [false, false, true, true]);
kernel!(ADD_RMS_NORM, "norm_addrms.wgsl", "add_rms_norm", [false, false, false, true, true, true]);
kernel!(LAYER_NORM, "norm_layer.wgsl", "layer_norm", [false, false, false, true, true, true]);
kernel!(NORM_BACKWARD, "norm_bwd.wgsl", "norm_backward", [false, false, false, false, false, true]);
kernel!(NORM_DW, "norm_dw.wgsl", "norm_dw", [false, false, false, false, true, true]);
kernel!(SOFTMAX, "softmax.wgsl", "softmax", [false, true]);
kernel!(SOFTMAX_BACKWARD, "softmax_bwd.wgsl", "softmax_backward", [false, false, true]);
kernel!(CROSS_ENTROPY, "xent.wgsl", "cross_entropy", [false, false, true, true]);
kernel!(ROPE, "rope.wgsl", "rope", [false, false, false, true]);
kernel!(EMBEDDING, "embedding.wgsl", "embedding", [false, false, true]);
kernel!(EMBEDDING16, "embedding16.wgsl", "embedding16", [false, false, true]);
kernel!(SCATTER_ROWS, "scatter.wgsl", "scatter_rows", [false, false, true]);
kernel!(ATTENTION, "attention.wgsl", "attention", [false, false, false, true, true, true, false]);
kernel!(ATTENTION_KV16, "attention_kv16.wgsl", "attention_kv16", [false, false, false, true, true, true, false]);
kernel!(ATTN_DELTA, "attn_delta.wgsl", "attn_delta", [false, false, true]);
kernel!(ATTN_DSINKS, "attn_dsinks.wgsl", "attn_dsinks", [false, false, false, true]);
kernel!(ATTN_DQ, "attn_dq.wgsl", "attn_dq", [false, false, false, false, false, false, true]);
kernel!(ATTN_DKV, "attn_dkv.wgsl", "attn_dkv", [false, false, false, false, false, false, true, true]);
kernel!(QUANTIZED_MATMUL, "quant.wgsl", "quantized_matmul", [false, false, true]);
kernel!(CAST, "convert.wgsl", "cast_float", [false, true]);

/// The full source of a kernel's module (elementwise kernels share one function library).
pub fn module_source(k: &Kernel) -> String {
    let own = match k.name {
        "elementwise2.wgsl" => include_str!("shaders/elementwise2.wgsl"),
        "inplace.wgsl" => include_str!("shaders/inplace.wgsl"),
        "assign.wgsl" => include_str!("shaders/assign.wgsl"),
        "ternary.wgsl" => include_str!("shaders/ternary.wgsl"),
        "gated.wgsl" => include_str!("shaders/gated.wgsl"),
        _ => "",
    };
    if k.name == "elementwise.wgsl" {
        format!("{PRELUDE}\n{}", k.source)
    } else if !own.is_empty() && k.name != "ternary.wgsl" {
        format!("{PRELUDE}\n{}\n{own}", fn_library())
    } else {
        format!("{PRELUDE}\n{}", k.source)
    }
}

/// The `unop`/`binop` function library of elementwise.wgsl (without its bindings).
fn fn_library() -> &'static str {
    let src = ELEMENTWISE_FNS;
    match src.find("@group(0)") {
        Some(i) => &src[..i],
        None => src,
    }
}
