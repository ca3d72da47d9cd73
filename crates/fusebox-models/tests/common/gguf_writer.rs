//! A minimal GGUF writer for tests: metadata of every type and tensors with
//! arbitrary bytes, laid out as the format requires (see `gguf::GgufFile`).

use fusebox_models::gguf::{Array, GgmlType, Value, ValueType};

/// A tensor to write: name, ggml dims (fastest first), type and raw bytes.
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

/// Builds a GGUF file in memory.
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
}

fn tag(t: ValueType) -> u32 {
    use ValueType::*;
    match t {
        U8 => 0,
        I8 => 1,
        U16 => 2,
        I16 => 3,
        U32 => 4,
        I32 => 5,
        F32 => 6,
        Bool => 7,
        String => 8,
        Array => 9,
        U64 => 10,
        I64 => 11,
        F64 => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&tag(a.element_type()).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { version: 3, alignment: 32, kvs: Vec::new(), tensors: Vec::new() }
    }
}

impl GgufWriter {
    pub fn kv(mut self, key: &str, v: Value) -> Self {
        self.kvs.push((key.to_owned(), v));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push(TensorSpec { name: name.to_owned(), dims: dims.to_vec(), ggml_type, data });
        self
    }

    /// The offsets each tensor gets in the data section.
    pub fn offsets(&self) -> Vec<u64> {
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for t in &self.tensors {
            offsets.push(at);
            at = (at + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        offsets
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&tag(v.value_type()).to_le_bytes());
            put_payload(&mut out, v);
        }
        let offsets = self.offsets();
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        let data_start = (out.len() as u64).next_multiple_of(self.alignment) as usize;
        out.resize(data_start, 0);
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + *off as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}
