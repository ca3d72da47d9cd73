// Elementwise, broadcast and in-place ops; `code` (param 0) picks the function.
// Thread i handles element i; 256 threads a workgroup.

fn erf_approx(x: f32) -> f32 {
    // Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7).
    let s = sign(x);
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-a * a);
    return s * y;
}

fn tanh_safe(x: f32) -> f32 {
    if (abs(x) > 15.0) { return sign(x); }
    return tanh(x);
}

fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }

const GELU_K: f32 = 0.7978845608028654;
const GELU_C: f32 = 0.044715;

fn pow_signed(x: f32, p: f32) -> f32 {
    if (p == 0.0) { return 1.0; }
    let r = pow(abs(x), p);
    if (x >= 0.0) { return r; }
    if (floor(p) != p) { return bitcast<f32>(0x7fc00000u); }
    if ((i32(p) & 1) == 1) { return -r; }
    return r;
}

fn unop(code: u32, x: f32, a: f32, b: f32) -> f32 {
    switch code {
        case 0u: { return exp(x); }
        case 1u: { return log(x); }
        case 2u: { return sqrt(x); }
        case 3u: { return -x; }
        case 4u: { return abs(x); }
        case 5u: { return pow_signed(x, a); }
        case 6u: { return min(max(x, a), b); }
        case 7u: { return x + a; }
        case 8u: { return x - a; }
        case 9u: { return x * a; }
        case 10u: { return x / a; }
        case 11u: { return x * sigmoid(x); }
        case 12u: { return max(x, 0.0); }
        case 13u: { return sigmoid(x); }
        case 14u: { return tanh_safe(x); }
        case 15u: { return 0.5 * x * (1.0 + tanh_safe(GELU_K * (x + GELU_C * x * x * x))); }
        case 16u: { return 0.5 * x * (1.0 + erf_approx(x * 0.7071067811865476)); }
        case 17u: { return max(x, log(1.0 + exp(min(x, 88.0)))); }
        case 18u: { return a; }
        default: { return x; }
    }
}

fn binop(code: u32, x: f32, y: f32, c: f32) -> f32 {
    switch code {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { let s = sigmoid(x); return y * s * (1.0 + x * (1.0 - s)); }
        case 5u: { return select(0.0, y, x > 0.0); }
        case 6u: { let s = sigmoid(x); return y * s * (1.0 - s); }
        case 7u: { let t = tanh_safe(x); return y * (1.0 - t * t); }
        case 8u: {
            let t = tanh_safe(GELU_K * (x + GELU_C * x * x * x));
            return y * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x));
        }
        case 9u: {
            return y * (0.5 * (1.0 + erf_approx(x * 0.7071067811865476)) + x * exp(-0.5 * x * x) * 0.3989422804014327);
        }
        case 10u: { return x * sigmoid(x) * y; }
        case 11u: { return x * exp(y); }
        case 12u: { return x + y * c; }
        case 13u: { return unop(15u, x, 0.0, 0.0) * y; }
        case 14u: { return unop(16u, x, 0.0, 0.0) * y; }
        default: { return x; }
    }
}

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// out = unop(a)                         params: code, n, p0, p1
@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    out[off(1u) + i] = unop(pu(0u), a[off(0u) + i], pf(2u), pf(3u));
}
