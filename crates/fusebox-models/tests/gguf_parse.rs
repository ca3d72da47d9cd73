//! GGUF parsing of files the test writes itself: every value type, tensors,
//! alignment, versions, and malformed files that must fail with a clear error.

mod common;

use common::gguf_writer::GgufWriter;
use common::{ramp, sample_writer};
use fusebox::{DType, Error};
use fusebox_models::gguf::{Array, GgmlType, GgufFile, Value};

fn parse(w: &GgufWriter) -> Result<GgufFile, Error> {
    GgufFile::from_bytes(w.to_bytes())
}

fn err_text(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(bytes: Vec<u8>, needle: &str) {
    let msg = err_text(bytes);
    assert!(msg.contains("gguf:"), "message should say gguf: {msg}");
    assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
}

#[test]
fn reads_every_value_type_back() {
    let w = sample_writer();
    let f = parse(&w).expect("sample parses");
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata().len(), w.kvs.len());
    for ((k, v), (k2, v2)) in w.kvs.iter().zip(f.metadata().iter()) {
        assert_eq!(k, k2);
        assert_eq!(v, v2, "value of {k}");
    }
    let m = f.metadata();
    assert_eq!(m.require_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u64("t.u32").unwrap(), Some(4_000_000_000));
    assert_eq!(m.get_u32("t.u8").unwrap(), Some(200));
    assert!(m.get_u32("t.u64").is_err(), "u64::MAX does not fit u32");
    assert!(m.get_u64("t.i8").is_err(), "negative is not a u64");
    assert_eq!(m.get_f64("t.f32").unwrap(), Some(1.5));
    assert_eq!(m.get_bool("t.bool").unwrap(), Some(true));
    assert!(m.get_str("t.u8").unwrap_err().to_string().contains("t.u8"));
    assert_eq!(m.get_strings("t.arr.string").unwrap().unwrap(), ["a", "", "ü b"]);
    assert_eq!(m.get_str("absent").unwrap(), None);
    assert!(m.require_u32("absent").unwrap_err().to_string().contains("'absent' is missing"));
    match m.get("t.arr.nested") {
        Some(Value::Array(Array::Array(inner))) => assert_eq!(inner.len(), 3),
        other => panic!("nested array: {other:?}"),
    }
}

#[test]
fn tensors_have_shape_dtype_and_bytes() {
    let w = sample_writer();
    let f = parse(&w).unwrap();
    assert_eq!(f.tensors().len(), w.tensors.len());
    assert_eq!(f.data_offset() % 32, 0);

    let weight = f.tensor("weight").unwrap();
    assert_eq!(weight.dims(), &[3, 4], "GGUF [ne0=4, ne1=3] is row-major [3, 4]");
    assert_eq!(weight.dtype(), DType::F32);
    assert_eq!(weight.to_vec::<f32>().unwrap()[..3], [1.0, -2.5, 3.25]);

    for (name, dims, dtype) in [
        ("norm", vec![8], DType::F16),
        ("q4", vec![2, 32], DType::Q4_0),
        ("q41", vec![32], DType::Q4_1),
        ("q8", vec![64], DType::Q8_0),
        ("q4k", vec![256], DType::Q4K),
        ("q6k", vec![256], DType::Q6K),
        ("q5k", vec![256], DType::Q5K),
        ("bf", vec![2, 1, 1, 2], DType::BF16),
    ] {
        let t = f.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dims(), dims.as_slice(), "{name}");
        assert_eq!(t.dtype(), dtype, "{name}");
        let spec = w.tensors.iter().find(|s| s.name == name).unwrap();
        assert_eq!(f.tensor_bytes(name).unwrap(), spec.data.as_slice(), "{name}");
    }

    // Known to ggml but not to fusebox (IQ2_XXS: 66 bytes per 256): bytes yes, tensor no.
    let iq2 = GgufWriter::default().tensor("iq2", &[256], GgmlType(16), vec![0; 66]);
    let g = parse(&iq2).unwrap();
    assert_eq!(g.tensor_bytes("iq2").unwrap().len(), 66);
    let e = g.tensor("iq2").unwrap_err().to_string();
    assert!(e.contains("'iq2'") && e.contains("IQ2_XXS") && e.contains("IQ4_XS"), "{e}");
    // Unknown type: the file opens, asking for the tensor fails.
    let info = f.tensor_info("mystery").unwrap();
    assert_eq!(info.ggml_type(), GgmlType(99));
    assert_eq!(info.byte_len(), None);
    let e = f.tensor("mystery").unwrap_err().to_string();
    assert!(e.contains("'mystery'") && e.contains("unknown ggml type 99"), "{e}");
    assert!(f.tensor_bytes("mystery").is_err());
    assert!(f.tensor("absent").unwrap_err().to_string().contains("no tensor named 'absent'"));
}

#[test]
fn version_2_and_custom_alignment() {
    let mut w = GgufWriter::default()
        .kv("general.alignment", Value::U32(64))
        .tensor("a", &[3], GgmlType::F32, ramp(12))
        .tensor("b", &[5], GgmlType::F32, ramp(20));
    w.version = 2;
    w.alignment = 64;
    let f = parse(&w).unwrap();
    assert_eq!((f.version(), f.alignment()), (2, 64));
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor_info("b").unwrap().offset(), 64);
    assert_eq!(f.tensor_bytes("b").unwrap(), ramp(20).as_slice());
}

#[test]
fn empty_file_and_no_tensors() {
    let f = parse(&GgufWriter::default()).unwrap();
    assert!(f.metadata().is_empty() && f.tensors().is_empty());
    assert_eq!(f.file_len(), 32, "24-byte header padded to the alignment");
    assert_eq!(GgufFile::from_bytes(header(0, 0)).unwrap().data_offset(), 32, "data section may be absent");
}

#[test]
fn open_reads_from_disk() {
    let dir = std::env::temp_dir().join(format!("fusebox-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    std::fs::write(&path, sample_writer().to_bytes()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("weight").unwrap().dims(), &[3, 4]);
    std::fs::write(&path, b"GGUF\x03\0\0\0").unwrap();
    let e = GgufFile::open(&path).err().unwrap().to_string();
    assert!(e.contains("sample.gguf") && e.contains("truncated"), "{e}");
    assert!(GgufFile::open(dir.join("missing.gguf")).err().unwrap().to_string().contains("cannot open"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_opened_without_its_vocabulary_keeps_the_rest_and_the_token_count() {
    let dir = std::env::temp_dir().join(format!("fusebox-gguf-vocab-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vocab.gguf");
    let tokens = Array::String(vec!["a".into(), "bc".into(), "ü".into()]);
    let w = sample_writer()
        .kv("tokenizer.ggml.tokens", Value::Array(tokens))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.5, 1.0, 2.0])))
        .kv("tokenizer.ggml.merges", Value::Array(Array::String(vec!["a b".into()])))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let whole = GgufFile::open(&path).unwrap();
    let lean = GgufFile::open_without_vocabulary(&path).unwrap();
    assert_eq!((whole.vocabulary_len(), lean.vocabulary_len()), (Some(3), Some(3)));
    assert_eq!(whole.metadata().len(), lean.metadata().len() + 3);
    assert!(lean.metadata().get("tokenizer.ggml.tokens").is_none());
    assert!(lean.metadata().get("tokenizer.ggml.merges").is_none());
    assert_eq!(lean.metadata().get_u32("tokenizer.ggml.bos_token_id").unwrap(), Some(1));
    assert_eq!(lean.metadata().get_strings("t.arr.string").unwrap().unwrap(), ["a", "", "ü b"]);
    assert_eq!(lean.tensor("weight").unwrap().dims(), &[3, 4]);
    // Skipped arrays are still checked: a bad string in one is refused the same way.
    let mut bytes = w.to_bytes();
    let at = bytes.windows(3).rposition(|x| x == "a b".as_bytes()).unwrap();
    bytes[at] = 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let e = GgufFile::open_without_vocabulary(&path).err().unwrap().to_string();
    assert!(e.contains("tokenizer.ggml.merges") && e.contains("UTF-8"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The header of a file with `tensors` tensors and `kvs` entries, version 3.
fn header(tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&kvs.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

#[test]
fn bad_magic_and_versions() {
    assert_err(b"GGML\x03\0\0\0".to_vec(), "not a GGUF file");
    assert_err(b"GG".to_vec(), "truncated");
    assert_err(Vec::new(), "truncated");
    let mut v1 = header(0, 0);
    v1[4] = 1;
    assert_err(v1, "version 1 is not supported");
    let mut be = header(0, 0);
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_err(be, "big-endian");
    let mut v9 = header(0, 0);
    v9[4] = 9;
    assert_err(v9, "version 9");
}

#[test]
fn bogus_counts_are_refused_before_allocating() {
    assert_err(header(u64::MAX, 0), "tensor count");
    assert_err(header(0, 1 << 60), "metadata count");
    // An array claiming 2^40 strings in a tiny file.
    let mut b = header(0, 1);
    put_str(&mut b, b"k");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 40).to_le_bytes());
    assert_err(b, "array count");
    // A string claiming 2^62 bytes.
    let mut b = header(0, 1);
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert_err(b, "metadata key length");
}

#[test]
fn malformed_values() {
    let kv = |key: &[u8], tag: u32, payload: &[u8]| {
        let mut b = header(0, 1);
        put_str(&mut b, key);
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(payload);
        b
    };
    assert_err(kv(b"k", 13, &[]), "not a known value type");
    assert_err(kv(b"k", 7, &[2]), "expected 0 or 1");
    assert_err(kv(b"k", 4, &[1, 2]), "metadata 'k'");
    assert_err(kv(b"\xff\xfe", 4, &[0; 4]), "not valid UTF-8");
    let mut bad_str = 2u64.to_le_bytes().to_vec();
    bad_str.extend_from_slice(&[0xC3, 0x28]);
    assert_err(kv(b"k", 8, &bad_str), "not valid UTF-8");
    // Arrays nested deeper than allowed: each level is tag 9 with one element.
    let mut deep = Vec::new();
    for _ in 0..20 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    assert_err(kv(b"k", 9, &deep), "nested more than");
    // Duplicate keys.
    let w = GgufWriter::default().kv("a", Value::U8(1)).kv("a", Value::U8(2));
    assert_err(w.to_bytes(), "'a' appears twice");
    // Alignment must be a u32 power of two.
    let w = GgufWriter::default().kv("general.alignment", Value::U32(24));
    assert_err(w.to_bytes(), "power of two");
    let w = GgufWriter::default().kv("general.alignment", Value::U64(32));
    assert_err(w.to_bytes(), "expected a u32");
    let w = GgufWriter::default().kv("general.alignment", Value::U32(0));
    assert_err(w.to_bytes(), "power of two");
}

#[test]
fn malformed_tensor_infos() {
    let one =
        |dims: &[u64], ty: GgmlType, data: Vec<u8>| GgufWriter::default().tensor("blk.0.attn_q.weight", dims, ty, data);

    // Data past the end of the file: drop the last bytes.
    let mut b = one(&[1024], GgmlType::F32, vec![0; 4096]).to_bytes();
    b.truncate(b.len() - 100);
    let msg = err_text(b);
    assert!(
        msg.contains("tensor 'blk.0.attn_q.weight' data [offset")
            && msg.contains("4096 bytes] extends past end of file"),
        "{msg}"
    );

    assert_err(one(&[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]).to_bytes(), "5 dimensions");
    assert_err(one(&[1 << 40, 1 << 40], GgmlType::F32, vec![]).to_bytes(), "overflow");
    // Zero elements, but the other dimensions multiply past u64 (found by cargo fuzz).
    assert_err(one(&[1 << 40, 1 << 40, 0], GgmlType::F32, vec![]).to_bytes(), "overflow");
    let empty = parse(&one(&[0, 5], GgmlType::F32, vec![])).unwrap();
    assert_eq!(empty.tensor("blk.0.attn_q.weight").unwrap().dims(), &[5, 0]);
    assert_err(one(&[33], GgmlType::Q4_0, vec![0; 18]).to_bytes(), "not a multiple of the Q4_0 block size 32");

    let w =
        GgufWriter::default().tensor("x", &[1], GgmlType::F32, vec![0; 4]).tensor("x", &[1], GgmlType::F32, vec![0; 4]);
    assert_err(w.to_bytes(), "'x' appears twice");

    // A misaligned offset: patch the stored offset (the last 8 bytes of the info) to 4.
    let w = one(&[1], GgmlType::F32, vec![0; 4]);
    let mut b = w.to_bytes();
    let info_end = 24 + 8 + "blk.0.attn_q.weight".len() + 4 + 8 + 4 + 8;
    b[info_end - 8..info_end].copy_from_slice(&4u64.to_le_bytes());
    assert_err(b, "not a multiple of the alignment 32");
    // An offset near u64::MAX must not overflow.
    let mut b = w.to_bytes();
    b[info_end - 8..info_end].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert_err(b, "extends past end of file");
}
