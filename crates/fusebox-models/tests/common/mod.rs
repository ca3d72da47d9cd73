//! Helpers shared by the integration tests: a GGUF writer and a seeded RNG.

#![allow(dead_code)]

pub mod gguf_writer;
pub mod small_vocab;

/// The workspace's seeded generator, so robustness tests are repeatable.
#[allow(unused_imports)] // not every test binary draws random numbers
pub use fusebox::rng::Rng;

use fusebox_models::gguf::{Array, GgmlType, Value};
use gguf_writer::GgufWriter;

/// Bytes 0, 1, 2, ... of length `n` (wrapping), as tensor data.
pub fn ramp(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

/// A small file using every value type, nested arrays and several tensor types,
/// including an unknown type (99) and one fusebox has no dtype for (Q5_K).
pub fn sample_writer() -> GgufWriter {
    let f32s: Vec<u8> = [1.0f32, -2.5, 3.25, 0.0, 5.5, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    GgufWriter::default()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("t.u8", Value::U8(200))
        .kv("t.i8", Value::I8(-100))
        .kv("t.u16", Value::U16(60000))
        .kv("t.i16", Value::I16(-30000))
        .kv("t.u32", Value::U32(4_000_000_000))
        .kv("t.i32", Value::I32(-2_000_000_000))
        .kv("t.f32", Value::F32(1.5))
        .kv("t.bool", Value::Bool(true))
        .kv("t.string", Value::String("héllo ✓".into()))
        .kv("t.u64", Value::U64(u64::MAX))
        .kv("t.i64", Value::I64(i64::MIN))
        .kv("t.f64", Value::F64(-0.125))
        .kv("t.arr.u8", Value::Array(Array::U8(vec![1, 2, 3])))
        .kv("t.arr.i8", Value::Array(Array::I8(vec![-1, 2])))
        .kv("t.arr.u16", Value::Array(Array::U16(vec![1, 65535])))
        .kv("t.arr.i16", Value::Array(Array::I16(vec![-5])))
        .kv("t.arr.u32", Value::Array(Array::U32(vec![7, 8, 9])))
        .kv("t.arr.i32", Value::Array(Array::I32(vec![-7, 8])))
        .kv("t.arr.f32", Value::Array(Array::F32(vec![0.5, -0.25])))
        .kv("t.arr.bool", Value::Array(Array::Bool(vec![true, false, true])))
        .kv("t.arr.string", Value::Array(Array::String(vec!["a".into(), "".into(), "ü b".into()])))
        .kv("t.arr.u64", Value::Array(Array::U64(vec![1 << 40])))
        .kv("t.arr.i64", Value::Array(Array::I64(vec![-(1 << 40)])))
        .kv("t.arr.f64", Value::Array(Array::F64(vec![1e300])))
        .kv("t.arr.empty", Value::Array(Array::F32(vec![])))
        .kv(
            "t.arr.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::I8(vec![-3]), Array::Array(vec![])]),
            ])),
        )
        .tensor("weight", &[4, 3], GgmlType::F32, f32s)
        .tensor("norm", &[8], GgmlType::F16, ramp(16))
        .tensor("q4", &[32, 2], GgmlType::Q4_0, ramp(2 * 18))
        .tensor("q41", &[32], GgmlType::Q4_1, ramp(20))
        .tensor("q8", &[64], GgmlType::Q8_0, ramp(2 * 34))
        .tensor("q4k", &[256], GgmlType::Q4_K, ramp(144))
        .tensor("q6k", &[256], GgmlType::Q6_K, ramp(210))
        .tensor("bf", &[2, 1, 1, 2], GgmlType::BF16, ramp(8))
        .tensor("q5k", &[256], GgmlType(13), ramp(176))
        .tensor("mystery", &[3], GgmlType(99), ramp(5))
}
