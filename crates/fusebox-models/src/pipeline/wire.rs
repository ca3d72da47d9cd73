//! The messages between pipeline stages, as bytes: a 24-byte header (kind, flags, a
//! row count, the position) and a payload — the hidden state in the wire's dtype, the
//! logits in f32, or the stages' counters at the end.

use fusebox::{Error, Result, Tensor};
use half::{bf16, f16};

/// The dtype the hidden state travels in between stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// Exact: the receiving stage computes the bits one process would.
    #[default]
    F32,
    /// Half the bytes; each value rounded to f16 (to nearest, ties to even).
    F16,
    /// Half the bytes; each value rounded to bf16 (to nearest, ties to even).
    BF16,
}

impl Wire {
    /// Parses `f32`, `f16` or `bf16` (`--wire`).
    pub fn parse(text: &str) -> Result<Wire> {
        match text.to_ascii_lowercase().as_str() {
            "f32" => Ok(Wire::F32),
            "f16" => Ok(Wire::F16),
            "bf16" => Ok(Wire::BF16),
            _ => Err(Error::value("--wire", "dtype", "f32, f16 or bf16", text)),
        }
    }

    /// `f32`, `f16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Wire::F32 => "f32",
            Wire::F16 => "f16",
            Wire::BF16 => "bf16",
        }
    }

    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::F16 | Wire::BF16 => 2,
        }
    }

    fn push(self, out: &mut Vec<u8>, values: &[f32]) {
        match self {
            Wire::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Wire::F16 => values.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
            Wire::BF16 => values.iter().for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        }
    }

    fn read(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Wire::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Wire::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Wire::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }
}

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Run `rows` new positions at `pos`: `x` then `h`, `[1, rows, D]` each, in the wire's dtype.
    Step = 1,
    /// The last stage's logits, `[rows, V]` f32.
    Logits = 2,
    /// The end of the run; the payload is the counters of the stages it has passed.
    End = 3,
    /// A server's step over `rows` sequences, each in its own cache slot: a table of
    /// `rows` entries ([`Entry`]), then `x` and `h` `[Σ len, D]` in the wire's dtype. Its
    /// logits are each sequence's last position's, `[rows, V]`.
    Batch = 4,
}

/// One sequence of a [`Kind::Batch`] step: its cache slot, its first new position and
/// its count of new positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub slot: usize,
    pub pos: usize,
    pub len: usize,
}

/// Bytes of one table entry.
const ENTRY: usize = 12;

/// Appends a batch's table.
pub(super) fn push_table(out: &mut Vec<u8>, entries: &[Entry]) {
    for e in entries {
        for v in [e.slot, e.pos, e.len] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
    }
}

/// A batch's table of `rows` entries from rank `from`, and the payload after it.
pub(super) fn read_table(payload: &[u8], rows: usize, from: usize) -> Result<(Vec<Entry>, &[u8])> {
    let bytes = rows.checked_mul(ENTRY).filter(|&n| n <= payload.len()).ok_or_else(|| {
        Error::Io(format!("pipeline: a batch from rank {from} of {rows} sequences has only {} bytes", payload.len()))
    })?;
    let u32_at = |i: usize| u32::from_le_bytes([payload[i], payload[i + 1], payload[i + 2], payload[i + 3]]) as usize;
    let entries =
        (0..rows).map(|r| Entry { slot: u32_at(r * ENTRY), pos: u32_at(r * ENTRY + 4), len: u32_at(r * ENTRY + 8) });
    Ok((entries.collect(), &payload[bytes..]))
}

/// A message's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub kind: Kind,
    /// Bit 0: the logits of every new position are wanted, not only the last's.
    pub flags: u32,
    pub rows: u64,
    pub pos: u64,
}

/// Bytes of a header.
const HEADER: usize = 24;

/// Flag: the logits of every new position.
pub(super) const ALL_LOGITS: u32 = 1;

/// A message: `header` then `payload`.
pub(super) fn message(header: Header, payload: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER);
    out.extend_from_slice(&(header.kind as u32).to_le_bytes());
    out.extend_from_slice(&header.flags.to_le_bytes());
    out.extend_from_slice(&header.rows.to_le_bytes());
    out.extend_from_slice(&header.pos.to_le_bytes());
    payload(&mut out);
    out
}

/// The header and payload of a message from rank `from`.
pub(super) fn parse(bytes: &[u8], from: usize) -> Result<(Header, &[u8])> {
    let bad = |why: String| Error::Io(format!("pipeline: a message from rank {from}: {why}"));
    if bytes.len() < HEADER {
        return Err(bad(format!("{} bytes, shorter than a header ({HEADER})", bytes.len())));
    }
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
    let kind = match u32_at(0) {
        1 => Kind::Step,
        2 => Kind::Logits,
        3 => Kind::End,
        4 => Kind::Batch,
        k => return Err(bad(format!("unknown kind {k}"))),
    };
    Ok((Header { kind, flags: u32_at(4), rows: u64_at(8), pos: u64_at(16) }, &bytes[HEADER..]))
}

/// Appends `x` and `h` (host f32) to a message in the wire's dtype.
pub(super) fn push_hidden(out: &mut Vec<u8>, wire: Wire, x: &Tensor, h: &Tensor) -> Result<()> {
    out.reserve((x.elem_count() + h.elem_count()) * wire.bytes());
    wire.push(out, x.as_slice::<f32>()?);
    wire.push(out, h.as_slice::<f32>()?);
    Ok(())
}

/// `x` and `h` `[1, rows, d]` (f32) from a step's payload.
pub(super) fn read_hidden(payload: &[u8], wire: Wire, rows: usize, d: usize, from: usize) -> Result<(Tensor, Tensor)> {
    let n = rows * d;
    if payload.len() != 2 * n * wire.bytes() {
        return Err(Error::Io(format!(
            "pipeline: a step from rank {from}: {} bytes of hidden state, expected {} (2 × {rows} × {d} × {} bytes, \
             --wire {}): do all ranks run the same model and --wire?",
            payload.len(),
            2 * n * wire.bytes(),
            wire.bytes(),
            wire.name()
        )));
    }
    let values = wire.read(payload);
    let (x, h) = values.split_at(n);
    Ok((Tensor::from_vec(x.to_vec(), [1, rows, d])?, Tensor::from_vec(h.to_vec(), [1, rows, d])?))
}

/// f32 values from little-endian bytes.
pub(super) fn f32s(bytes: &[u8]) -> Vec<f32> {
    Wire::F32.read(bytes)
}

/// f32 values as little-endian bytes, appended.
pub(super) fn push_f32s(out: &mut Vec<u8>, values: &[f32]) {
    Wire::F32.push(out, values);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_bytes_are_errors() {
        let x = Tensor::from_vec(vec![1.0f32, -2.5, 3.25, 1e-3], [1, 2, 2]).unwrap();
        let h = Tensor::from_vec(vec![0.5f32, 0.25, -8.0, 65504.0], [1, 2, 2]).unwrap();
        for wire in [Wire::F32, Wire::F16, Wire::BF16] {
            let header = Header { kind: Kind::Step, flags: ALL_LOGITS, rows: 2, pos: 7 };
            let m = message(header, |o| push_hidden(o, wire, &x, &h).unwrap());
            let (back, payload) = parse(&m, 0).unwrap();
            assert_eq!(back, header);
            let (x2, h2) = read_hidden(payload, wire, 2, 2, 0).unwrap();
            let (x2, h2) = (x2.to_vec::<f32>().unwrap(), h2.to_vec::<f32>().unwrap());
            if wire == Wire::F32 {
                assert_eq!(x2, x.to_vec::<f32>().unwrap());
                assert_eq!(h2, h.to_vec::<f32>().unwrap());
            } else {
                // Rounded to 8 (bf16) or 11 (f16) significant bits.
                let tol = if wire == Wire::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
                for (a, b) in x2.iter().zip(x.to_vec::<f32>().unwrap()) {
                    assert!((a - b).abs() <= tol * b.abs(), "{wire:?}: {a} vs {b}");
                }
            }
            let e = read_hidden(payload, wire, 3, 2, 1).unwrap_err().to_string();
            assert!(e.contains("rank 1") && e.contains("--wire"), "{e}");
        }
        assert!(parse(&[0; 10], 2).unwrap_err().to_string().contains("rank 2"));
        let mut m = message(Header { kind: Kind::End, flags: 0, rows: 0, pos: 0 }, |_| ());
        m[0] = 9;
        assert!(parse(&m, 0).unwrap_err().to_string().contains("unknown kind 9"));
        assert_eq!(Wire::parse("BF16").unwrap(), Wire::BF16);
        assert!(Wire::parse("f8").unwrap_err().to_string().contains("f32, f16 or bf16"));
        let mut o = Vec::new();
        push_f32s(&mut o, &[1.5, -2.0]);
        assert_eq!(f32s(&o), [1.5, -2.0]);
    }
}
