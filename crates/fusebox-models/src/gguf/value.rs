//! GGUF metadata values: the thirteen value types and how they are stored.
//!
//! A value is a `u32` type tag followed by its payload, little-endian:
//!
//! | tag | type   | payload                                                  |
//! |-----|--------|----------------------------------------------------------|
//! | 0   | u8     | 1 byte                                                   |
//! | 1   | i8     | 1 byte                                                   |
//! | 2   | u16    | 2 bytes                                                  |
//! | 3   | i16    | 2 bytes                                                  |
//! | 4   | u32    | 4 bytes                                                  |
//! | 5   | i32    | 4 bytes                                                  |
//! | 6   | f32    | 4 bytes                                                  |
//! | 7   | bool   | 1 byte, 0 or 1                                           |
//! | 8   | string | u64 byte length + UTF-8 bytes                            |
//! | 9   | array  | u32 element tag + u64 count + the elements' payloads     |
//! | 10  | u64    | 8 bytes                                                  |
//! | 11  | i64    | 8 bytes                                                  |
//! | 12  | f64    | 8 bytes                                                  |
//!
//! Arrays hold one element type; arrays of arrays are allowed (each inner array
//! carries its own element tag and count). Arrays are kept typed ([`Array`]) so
//! a large array of numbers costs no more memory than it does on disk.

use std::fmt;

use super::cursor::{Context, Cursor, PResult, ParseError};

/// Deepest nesting of arrays accepted; deeper files are refused rather than
/// recursing without bound on hostile input.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value type tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// Type tag 0: u8.
    U8,
    /// Type tag 1: i8.
    I8,
    /// Type tag 2: u16.
    U16,
    /// Type tag 3: i16.
    I16,
    /// Type tag 4: u32.
    U32,
    /// Type tag 5: i32.
    I32,
    /// Type tag 6: f32.
    F32,
    /// Type tag 7: bool.
    Bool,
    /// Type tag 8: a string.
    String,
    /// Type tag 9: an array.
    Array,
    /// Type tag 10: u64.
    U64,
    /// Type tag 11: i64.
    I64,
    /// Type tag 12: f64.
    F64,
}

impl ValueType {
    /// The type for a tag, if the tag is known.
    pub fn from_tag(tag: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in the file (an empty
    /// string is its 8-byte length; an empty array its 4-byte tag and 8-byte count).
    pub fn min_bytes(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// Lower-case name, as in the GGUF specification.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An unsigned 8-bit integer.
    U8(u8),
    /// A signed 8-bit integer.
    I8(i8),
    /// An unsigned 16-bit integer.
    U16(u16),
    /// A signed 16-bit integer.
    I16(i16),
    /// An unsigned 32-bit integer.
    U32(u32),
    /// A signed 32-bit integer.
    I32(i32),
    /// A 32-bit float.
    F32(f32),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// A typed array.
    Array(Array),
    /// An unsigned 64-bit integer.
    U64(u64),
    /// A signed 64-bit integer.
    I64(i64),
    /// A 64-bit float.
    F64(f64),
}

/// A typed array of metadata values.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Unsigned 8-bit integers.
    U8(Vec<u8>),
    /// Signed 8-bit integers.
    I8(Vec<i8>),
    /// Unsigned 16-bit integers.
    U16(Vec<u16>),
    /// Signed 16-bit integers.
    I16(Vec<i16>),
    /// Unsigned 32-bit integers.
    U32(Vec<u32>),
    /// Signed 32-bit integers.
    I32(Vec<i32>),
    /// 32-bit floats.
    F32(Vec<f32>),
    /// Booleans.
    Bool(Vec<bool>),
    /// UTF-8 strings.
    String(Vec<String>),
    /// Arrays (nested up to `MAX_ARRAY_DEPTH`).
    Array(Vec<Array>),
    /// Unsigned 64-bit integers.
    U64(Vec<u64>),
    /// Signed 64-bit integers.
    I64(Vec<i64>),
    /// 64-bit floats.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value as `u64`, when it is non-negative.
    pub fn to_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value as `i64`, when it fits.
    pub fn to_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.to_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any float or integer value as `f64`.
    pub fn to_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.to_i64().map(|v| v as f64).or_else(|| self.to_u64().map(|v| v as f64)),
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if this is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages and listings: the type, and the
    /// value itself when it is a scalar or short string.
    pub fn describe(&self) -> String {
        match self {
            Value::String(s) if s.chars().count() <= 60 => format!("string {s:?}"),
            Value::String(s) => format!("string of {} bytes", s.len()),
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            Value::Bool(b) => format!("bool {b}"),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            other => format!("{} {}", other.value_type(), other.to_i64().map_or_else(|| "?".into(), |v| v.to_string())),
        }
    }
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The strings, if this is an array of strings.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// Element `i` as `i64`, for arrays of integers.
    pub fn get_i64(&self, i: usize) -> Option<i64> {
        match self {
            Array::U8(v) => v.get(i).map(|&x| x.into()),
            Array::I8(v) => v.get(i).map(|&x| x.into()),
            Array::U16(v) => v.get(i).map(|&x| x.into()),
            Array::I16(v) => v.get(i).map(|&x| x.into()),
            Array::U32(v) => v.get(i).map(|&x| x.into()),
            Array::I32(v) => v.get(i).map(|&x| x.into()),
            Array::U64(v) => v.get(i).and_then(|&x| i64::try_from(x).ok()),
            Array::I64(v) => v.get(i).copied(),
            _ => None,
        }
    }
}

/// Reads a value type tag.
fn read_type(c: &mut Cursor<'_>, what: &str) -> PResult<ValueType> {
    let at = c.pos();
    let tag = c.u32(what)?;
    ValueType::from_tag(tag)
        .ok_or_else(|| ParseError(format!("{what} is {tag} (at offset {at}), not a known value type (0..=12)")))
}

/// Reads a bool byte, which must be 0 or 1.
fn read_bool(c: &mut Cursor<'_>) -> PResult<bool> {
    let at = c.pos();
    match c.u8("bool")? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(ParseError(format!("bool at offset {at} is {b}, expected 0 or 1"))),
    }
}

/// Reads one value: its type tag, then its payload.
pub(crate) fn read_value(c: &mut Cursor<'_>) -> PResult<Value> {
    let ty = read_type(c, "value type")?;
    read_payload(c, ty, 0)
}

/// Walks past one value (type tag and payload) without keeping it, checking it as
/// [`read_value`] does; returns its element count (1 for a scalar or a string).
pub(crate) fn skip_value(c: &mut Cursor<'_>) -> PResult<usize> {
    let ty = read_type(c, "value type")?;
    skip_payload(c, ty, 0)
}

/// Walks past the payload of a value of type `ty` at array nesting `depth`.
fn skip_payload(c: &mut Cursor<'_>, ty: ValueType, depth: usize) -> PResult<usize> {
    match ty {
        ValueType::String => c.str("string").map(|_| 1),
        ValueType::Bool => read_bool(c).map(|_| 1),
        ValueType::Array => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(ParseError(format!(
                    "arrays nested more than {MAX_ARRAY_DEPTH} deep (at offset {})",
                    c.pos()
                )));
            }
            let ty = read_type(c, "array element type")?;
            let n = c.count(ty.min_bytes(), &format!("array count ({ty} elements)"))?;
            match ty {
                ValueType::String | ValueType::Bool | ValueType::Array => {
                    for i in 0..n {
                        skip_payload(c, ty, depth + 1).context_with(|| format!("element {i}"))?;
                    }
                }
                // `n` was checked against the bytes left for elements of this size.
                fixed => {
                    c.take(n * fixed.min_bytes(), &format!("{fixed} array"))?;
                }
            }
            Ok(n)
        }
        fixed => c.take(fixed.min_bytes(), fixed.name()).map(|_| 1),
    }
}

/// Reads the payload of a value of type `ty` at array nesting `depth`.
fn read_payload(c: &mut Cursor<'_>, ty: ValueType, depth: usize) -> PResult<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(c.u8("u8")?),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array("i8")?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array("u16")?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array("i16")?)),
        ValueType::U32 => Value::U32(c.u32("u32")?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array("i32")?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array("f32")?)),
        ValueType::Bool => Value::Bool(read_bool(c)?),
        ValueType::String => Value::String(c.string("string")?),
        ValueType::Array => Value::Array(read_array(c, depth)?),
        ValueType::U64 => Value::U64(c.u64("u64")?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array("i64")?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array("f64")?)),
    })
}

/// Reads `n` elements with `f`, naming the failing element in the error.
fn elems<T>(n: usize, mut f: impl FnMut(usize) -> PResult<T>) -> PResult<Vec<T>> {
    // `n` was checked against the bytes left, so this allocation is bounded by the file size.
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(f(i).context_with(|| format!("element {i}"))?);
    }
    Ok(out)
}

/// Reads an array payload: element type tag, u64 count, then the elements.
fn read_array(c: &mut Cursor<'_>, depth: usize) -> PResult<Array> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(ParseError(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep (at offset {})", c.pos())));
    }
    let ty = read_type(c, "array element type")?;
    let n = c.count(ty.min_bytes(), &format!("array count ({ty} elements)"))?;
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(n, "u8 array")?.to_vec()),
        ValueType::I8 => Array::I8(c.take(n, "i8 array")?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => Array::U16(elems(n, |_| Ok(u16::from_le_bytes(c.array("u16")?)))?),
        ValueType::I16 => Array::I16(elems(n, |_| Ok(i16::from_le_bytes(c.array("i16")?)))?),
        ValueType::U32 => Array::U32(elems(n, |_| c.u32("u32"))?),
        ValueType::I32 => Array::I32(elems(n, |_| Ok(i32::from_le_bytes(c.array("i32")?)))?),
        ValueType::F32 => Array::F32(elems(n, |_| Ok(f32::from_le_bytes(c.array("f32")?)))?),
        ValueType::Bool => Array::Bool(elems(n, |_| read_bool(c))?),
        ValueType::String => Array::String(elems(n, |_| c.string("string"))?),
        ValueType::Array => Array::Array(elems(n, |_| read_array(c, depth + 1))?),
        ValueType::U64 => Array::U64(elems(n, |_| c.u64("u64"))?),
        ValueType::I64 => Array::I64(elems(n, |_| Ok(i64::from_le_bytes(c.array("i64")?)))?),
        ValueType::F64 => Array::F64(elems(n, |_| Ok(f64::from_le_bytes(c.array("f64")?)))?),
    })
}
