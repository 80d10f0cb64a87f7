//! Metadata round trips through the test writer (v2 and v3, custom alignment) and the error
//! messages for malformed files.

use super::{write_gguf, RawTensor};
use crate::{Array, GgmlType, GgufError, GgufFile, Value};

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("u8", Value::U8(255)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(65535)),
        ("i16", Value::I16(-32768)),
        ("u32", Value::U32(u32::MAX)),
        ("i32", Value::I32(i32::MIN)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(-5)),
        ("f32", Value::F32(-0.0)),
        ("f64", Value::F64(std::f64::consts::PI)),
        ("bool", Value::Bool(false)),
        ("empty", Value::String(String::new())),
        ("unicode", Value::String("日本語 🦀".into())),
        ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-1, 1]))),
        ("a.u16", Value::Array(Array::U16(vec![1, 2]))),
        ("a.i16", Value::Array(Array::I16(vec![-2, 2]))),
        ("a.u32", Value::Array(Array::U32(vec![7]))),
        ("a.i32", Value::Array(Array::I32(vec![1, 2, 3]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, 0]))),
        ("a.f32", Value::Array(Array::F32(vec![0.5, -1.0]))),
        ("a.f64", Value::Array(Array::F64(vec![1e300]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false]))),
        (
            "a.str",
            Value::Array(Array::String(vec!["x".into(), String::new()])),
        ),
        ("a.empty", Value::Array(Array::U32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::String(vec!["p".into(), "q".into()]),
                Array::Array(vec![Array::I64(vec![9])]),
                Array::Bool(vec![]),
            ])),
        ),
    ]
}

fn f32_tensor(name: &str, dims: Vec<u64>, values: &[f32]) -> RawTensor {
    RawTensor {
        name: name.into(),
        dims,
        ggml_type: GgmlType::F32,
        data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    for (version, alignment) in [(2, 32), (3, 32), (3, 64), (3, 1)] {
        let mut kvs = all_values();
        if alignment != 32 {
            kvs.push(("general.alignment", Value::U32(alignment as u32)));
        }
        let tensors = [
            f32_tensor("a", vec![3], &[1.0, 2.0, 3.0]),
            f32_tensor("b", vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            f32_tensor("scalar", vec![], &[7.0]),
        ];
        let bytes = write_gguf(version, alignment, &kvs, &tensors);
        let file = GgufFile::from_bytes(&bytes).unwrap();
        assert_eq!(file.version(), version);
        assert_eq!(file.alignment(), alignment);
        assert_eq!(file.data_offset() % alignment, 0);
        assert_eq!(file.architecture(), Some("llama"));
        let got: Vec<(&str, &Value)> = file
            .metadata()
            .entries()
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let want: Vec<(&str, &Value)> = kvs.iter().map(|(k, v)| (*k, v)).collect();
        assert_eq!(got, want);
        assert_eq!(file.get("u16"), Some(&Value::U16(65535)));

        let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "scalar"]);
        let b = file.tensor("b").unwrap();
        assert_eq!(
            (b.dims.as_slice(), b.shape(), b.n_elements()),
            (&[2u64, 3][..], vec![3, 2], 6)
        );
        assert_eq!(b.size_in_bytes(), 24);
        assert_eq!(
            file.read_f32("b").unwrap(),
            (vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        assert_eq!(file.read_f32("scalar").unwrap(), (vec![], vec![7.0]));
        assert!(matches!(
            file.read_f32("nope"),
            Err(GgufError::TensorNotFound { .. })
        ));
    }
}

/// Replaces the first occurrence of `from` in `bytes` with `to` (same length).
fn patch(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern");
    bytes[at..at + to.len()].copy_from_slice(to);
}

fn err(bytes: &[u8]) -> String {
    GgufFile::from_bytes(bytes).unwrap_err().to_string()
}

fn one_tensor(ty: GgmlType, dims: Vec<u64>, data_len: usize) -> Vec<u8> {
    let t = RawTensor {
        name: "w".into(),
        dims,
        ggml_type: ty,
        data: vec![0; data_len],
    };
    write_gguf(3, 32, &[("k", Value::U32(1))], &[t])
}

#[test]
fn malformed_headers_give_clear_errors() {
    assert!(err(b"GGU").contains("not a GGUF file"));
    assert!(err(b"GGML\x03\0\0\0").contains("not a GGUF file"));
    let good = one_tensor(GgmlType::Q4_0, vec![64], 36);
    GgufFile::from_bytes(&good).unwrap();

    let mut v1 = good.clone();
    v1[4] = 1;
    assert!(err(&v1).contains("unsupported GGUF version 1"));
    let mut be = good.clone();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(&be).contains("big-endian"));
    let e = err(&good[..20]);
    assert!(
        e.contains("metadata entry count") && e.contains("offset 16"),
        "{e}"
    );

    // Unknown ggml type 5 (removed Q4_3): names the tensor and the id.
    let mut bad = good.clone();
    patch(
        &mut bad,
        &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[5, 0, 0, 0],
    );
    let e = err(&bad);
    assert!(
        e.contains("tensor 'w'") && e.contains("unknown ggml type id 5"),
        "{e}"
    );

    // Truncated data section.
    let e = err(&good[..good.len() - 1]);
    assert!(
        e.contains("tensor 'w'") && e.contains("needs 36 bytes"),
        "{e}"
    );

    // Bad shapes.
    let e = err(&one_tensor(GgmlType::Q4_K, vec![100], 0));
    assert!(
        e.contains("not a multiple of the Q4_K block size 256"),
        "{e}"
    );
    let e = err(&one_tensor(GgmlType::F32, vec![1 << 40, 1 << 40], 0));
    assert!(e.contains("overflow"), "{e}");
    // Even an empty tensor must not have dims whose product overflows.
    let e = err(&one_tensor(GgmlType::F32, vec![0, 1 << 40, 1 << 40], 0));
    assert!(e.contains("overflow"), "{e}");
    let e = err(&one_tensor(GgmlType::F32, vec![1; 5], 4));
    assert!(e.contains("5 dimensions"), "{e}");

    // Misaligned offset.
    let mut mis = good.clone();
    mis.extend_from_slice(&[0; 64]);
    patch(
        &mut mis,
        &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[2, 0, 0, 0, 4, 0, 0, 0],
    );
    assert!(err(&mis).contains("not a multiple of the alignment 32"));
}

#[test]
fn malformed_metadata_gives_clear_errors() {
    let dup = write_gguf(3, 32, &[("k", Value::U8(1)), ("k", Value::U8(2))], &[]);
    assert!(err(&dup).contains("duplicate metadata key 'k'"));
    let t = || f32_tensor("t", vec![1], &[0.0]);
    let dup = write_gguf(3, 32, &[], &[t(), t()]);
    assert!(err(&dup).contains("duplicate tensor name 't'"));

    let mut b = write_gguf(3, 32, &[("flag", Value::Bool(true))], &[]);
    patch(&mut b, &[7, 0, 0, 0, 1], &[7, 0, 0, 0, 2]);
    let e = err(&b);
    assert!(
        e.contains("invalid boolean byte 2") && e.contains("'flag'"),
        "{e}"
    );

    for bad in [
        Value::U32(0),
        Value::U32(48),
        Value::String("32".into()),
        Value::I64(-32),
    ] {
        let b = write_gguf(3, 32, &[("general.alignment", bad)], &[]);
        assert!(err(&b).contains("general.alignment"));
    }
    // Any integer type that fits is accepted.
    let b = write_gguf(3, 16, &[("general.alignment", Value::U64(16))], &[]);
    assert_eq!(GgufFile::from_bytes(&b).unwrap().alignment(), 16);

    let mut b = write_gguf(3, 32, &[("x", Value::U32(1))], &[]);
    patch(&mut b, &[4, 0, 0, 0, 1, 0, 0, 0], &[13, 0, 0, 0]);
    let e = err(&b);
    assert!(
        e.contains("unknown metadata value type 13") && e.contains("'x'"),
        "{e}"
    );

    // A huge array count is rejected before allocating.
    let mut b = write_gguf(3, 32, &[("arr", Value::Array(Array::U64(vec![1])))], &[]);
    patch(
        &mut b,
        &[1, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        &(u64::MAX / 2).to_le_bytes(),
    );
    let e = err(&b);
    assert!(e.contains("corrupt count") && e.contains("'arr'"), "{e}");

    // A huge string length is capped by the remaining bytes.
    let mut b = write_gguf(3, 32, &[("s", Value::String("abc".into()))], &[]);
    patch(
        &mut b,
        &[3, 0, 0, 0, 0, 0, 0, 0, b'a'],
        &u64::MAX.to_le_bytes(),
    );
    let e = err(&b);
    assert!(e.contains("truncated") && e.contains("'s'"), "{e}");

    // Deep nesting is bounded.
    let mut deep = Array::U8(vec![]);
    for _ in 0..crate::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    let b = write_gguf(3, 32, &[("deep", Value::Array(deep))], &[]);
    assert!(err(&b).contains("nested deeper"));
}

#[test]
fn open_names_the_path() {
    let dir = std::env::temp_dir().join(format!("rlft-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.gguf");
    let e = GgufFile::open(&missing).unwrap_err().to_string();
    assert!(e.contains("missing.gguf"), "{e}");
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\0\0\0").unwrap();
    let e = GgufFile::open(&corrupt).unwrap_err().to_string();
    assert!(e.contains("corrupt.gguf") && e.contains("truncated"), "{e}");
    let good = dir.join("good.gguf");
    std::fs::write(&good, write_gguf(3, 32, &[("k", Value::U8(1))], &[])).unwrap();
    assert_eq!(GgufFile::open(&good).unwrap().metadata().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn open_header_reads_metadata_without_tensor_data() {
    let dir = std::env::temp_dir().join(format!("rlft-gguf-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A vocabulary of 3 MiB: the header needs more than the first 1 MiB read.
    let vocab: Vec<String> = (0..150_000).map(|i| format!("token{i:014}")).collect();
    let big: Vec<f32> = (0..(1 << 20)).map(|i| i as f32).collect();
    let bytes = write_gguf(
        3,
        32,
        &[
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.tokens", Value::Array(Array::String(vocab))),
        ],
        &[
            f32_tensor("small", vec![4], &[1.0, 2.0, 3.0, 4.0]),
            f32_tensor("big", vec![1 << 20], &big),
        ],
    );
    let path = dir.join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let full = GgufFile::open(&path).unwrap();
    let head = GgufFile::open_header(&path).unwrap();
    assert_eq!(head.metadata().len(), full.metadata().len());
    assert_eq!(
        head.get("tokenizer.ggml.tokens"),
        full.get("tokenizer.ggml.tokens")
    );
    assert_eq!(head.tensors(), full.tensors());
    assert_eq!(head.data_offset(), full.data_offset());
    assert!(head.bytes().len() < bytes.len(), "read the whole file");
    assert!(head.tensor_data("big").is_err());
    // A file smaller than the first read is read whole and parsed as `open` does.
    let small = dir.join("s.gguf");
    std::fs::write(&small, write_gguf(3, 32, &[("k", Value::U8(1))], &[])).unwrap();
    assert_eq!(GgufFile::open_header(&small).unwrap().metadata().len(), 1);
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\0\0\0").unwrap();
    let e = GgufFile::open_header(&corrupt).unwrap_err().to_string();
    assert!(e.contains("corrupt.gguf") && e.contains("truncated"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
