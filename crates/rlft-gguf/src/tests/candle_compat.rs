//! Bit-exact comparison with candle-core's own dequantisation, through a GGUF file written
//! by candle's `gguf_file::write`.

use std::io::Cursor;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::Rng;
use crate::{GgmlType, GgufFile};

/// Every type both crates support, paired.
const TYPES: [(GgmlDType, GgmlType); 15] = [
    (GgmlDType::F32, GgmlType::F32),
    (GgmlDType::F16, GgmlType::F16),
    (GgmlDType::BF16, GgmlType::BF16),
    (GgmlDType::Q4_0, GgmlType::Q4_0),
    (GgmlDType::Q4_1, GgmlType::Q4_1),
    (GgmlDType::Q5_0, GgmlType::Q5_0),
    (GgmlDType::Q5_1, GgmlType::Q5_1),
    (GgmlDType::Q8_0, GgmlType::Q8_0),
    (GgmlDType::Q8_1, GgmlType::Q8_1),
    (GgmlDType::Q2K, GgmlType::Q2_K),
    (GgmlDType::Q3K, GgmlType::Q3_K),
    (GgmlDType::Q4K, GgmlType::Q4_K),
    (GgmlDType::Q5K, GgmlType::Q5_K),
    (GgmlDType::Q6K, GgmlType::Q6_K),
    (GgmlDType::Q8K, GgmlType::Q8_K),
];

/// Test data with varied blocks: different magnitudes, all-zero, constant, one outlier,
/// all-positive (exercises the mins of Q4_1/Q5_1/Q2_K/Q4_K/Q5_K).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let scale = [1e-3f32, 0.02, 1.0, 40.0][rng.below(4) as usize];
        let mode = rng.below(10);
        for i in 0..32 {
            let x = match mode {
                0 => 0.0,
                1 => scale,
                2 if i == 7 => 100.0 * scale,
                3 => (rng.unit() + 1.5) * scale,
                _ => rng.unit() * scale,
            };
            out.push(x);
        }
    }
    out.truncate(n);
    out
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn dequantisation_is_bit_identical_to_candle() -> candle_core::Result<()> {
    // Small (serial path), 3-D (shape order) and large (parallel path) tensors.
    let shapes: [&[usize]; 3] = [&[4, 512], &[2, 3, 256], &[40, 4096]];
    for (seed, (cdtype, ty)) in TYPES.iter().enumerate() {
        let mut qtensors = Vec::new();
        for (i, shape) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let src = Tensor::from_vec(data(n, (seed * 10 + i) as u64), *shape, &Device::Cpu)?;
            qtensors.push((format!("t{i}"), QTensor::quantize(&src, *cdtype)?));
        }
        let arch = gguf_file::Value::String("test".into());
        let metadata = [("general.architecture", &arch)];
        let tensors: Vec<(&str, &QTensor)> =
            qtensors.iter().map(|(n, q)| (n.as_str(), q)).collect();
        let mut buf = Cursor::new(Vec::new());
        gguf_file::write(&mut buf, &metadata, &tensors)?;

        let file = GgufFile::from_vec(buf.into_inner()).expect("parse candle-written GGUF");
        assert_eq!(file.version(), 2);
        assert_eq!(file.architecture(), Some("test"));
        for (name, qt) in &qtensors {
            let info = file.tensor(name).expect("tensor present");
            assert_eq!(info.ggml_type, *ty);
            assert_eq!(info.shape(), qt.shape().dims());
            let (shape, got) = file.read_f32(name).expect("dequantise");
            assert_eq!(shape, qt.shape().dims());
            let want = qt
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            assert!(
                bits(&got) == bits(&want),
                "{ty} tensor {name} {shape:?}: first mismatch at {:?}",
                got.iter()
                    .zip(&want)
                    .position(|(a, b)| a.to_bits() != b.to_bits())
            );
        }
    }
    Ok(())
}

#[test]
fn candle_metadata_round_trips() -> candle_core::Result<()> {
    use gguf_file::Value as C;
    let values = [
        ("u8", C::U8(200)),
        ("i8", C::I8(-100)),
        ("u16", C::U16(60000)),
        ("i16", C::I16(-30000)),
        ("u32", C::U32(4_000_000_000)),
        ("i32", C::I32(-2_000_000_000)),
        ("u64", C::U64(u64::MAX)),
        ("i64", C::I64(i64::MIN)),
        ("f32", C::F32(1.5e-7)),
        ("f64", C::F64(-2.25e300)),
        ("bool", C::Bool(true)),
        ("str", C::String("héllo <|im_start|>".into())),
        (
            "arr",
            C::Array(vec![C::String("a".into()), C::String("b".into())]),
        ),
        ("ints", C::Array(vec![C::I32(1), C::I32(-3)])),
        (
            "nested",
            C::Array(vec![C::Array(vec![C::U8(1)]), C::Array(vec![C::F32(2.0)])]),
        ),
    ];
    let kvs: Vec<(&str, &C)> = values.iter().map(|(k, v)| (*k, v)).collect();
    let mut buf = Cursor::new(Vec::new());
    gguf_file::write(&mut buf, &kvs, &[])?;
    let file = GgufFile::from_vec(buf.into_inner()).expect("parse");
    let m = file.metadata();
    let keys: Vec<&str> = m.entries().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, values.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    assert_eq!(m.get_u32("u8").unwrap(), 200);
    assert_eq!(m.get_i32("i8").unwrap(), -100);
    assert_eq!(m.get_u32("u16").unwrap(), 60000);
    assert_eq!(m.get_i32("i16").unwrap(), -30000);
    assert_eq!(m.get_u32("u32").unwrap(), 4_000_000_000);
    assert_eq!(m.get_i32("i32").unwrap(), -2_000_000_000);
    assert_eq!(m.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(m.get_i64("i64").unwrap(), i64::MIN);
    assert_eq!(m.get_f32("f32").unwrap(), 1.5e-7);
    assert_eq!(m.get_f64("f64").unwrap(), -2.25e300);
    assert!(m.get_bool("bool").unwrap());
    assert_eq!(m.get_str("str").unwrap(), "héllo <|im_start|>");
    assert_eq!(m.get_string_array("arr").unwrap(), ["a", "b"]);
    assert_eq!(m.get_i32_array("ints").unwrap(), [1, -3]);
    let nested = m.get_array("nested").unwrap();
    assert_eq!(
        *nested,
        crate::Array::Array(vec![
            crate::Array::U8(vec![1]),
            crate::Array::F32(vec![2.0])
        ])
    );
    Ok(())
}

/// The default model (SmolLM2-135M-Instruct Q4_1): every tensor must dequantise
/// bit-identically to candle and the metadata must agree. The model is `RLFT_GGUF_MODEL` when
/// set, else the default model as every test finds it (`tests/fixtures.rs`: `RLFT_DEFAULT_MODEL`,
/// the fetch script's cache, or fetched).
#[test]
fn default_model_matches_candle() -> candle_core::Result<()> {
    let path = match std::env::var_os("RLFT_GGUF_MODEL") {
        Some(p) => {
            let p = std::path::PathBuf::from(p);
            assert!(
                p.is_file(),
                "RLFT_GGUF_MODEL={} does not exist",
                p.display()
            );
            p
        }
        None => super::fixtures::default_model(),
    };
    let file = GgufFile::open(&path).expect("open default model");
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path)?);
    let content = gguf_file::Content::read(&mut reader)?;
    assert_eq!(file.metadata().len(), content.metadata.len());
    for (key, value) in file.metadata().entries() {
        let theirs = &content.metadata[key];
        match value {
            crate::Value::String(s) => assert_eq!(
                Some(s.as_str()),
                theirs.to_string().ok().map(|s| s.as_str())
            ),
            crate::Value::U32(v) => assert_eq!(*v, theirs.to_u32()?),
            crate::Value::F32(v) => assert_eq!(*v, theirs.to_f32()?),
            crate::Value::Array(a) => assert_eq!(a.len(), theirs.to_vec()?.len()),
            _ => {}
        }
    }
    let tokens = file
        .metadata()
        .get_string_array("tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1], "<|im_start|>");
    assert!(file
        .metadata()
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));
    assert_eq!(file.tensors().len(), content.tensor_infos.len());
    for info in file.tensors() {
        let (shape, got) = file.read_f32(&info.name).expect("dequantise");
        let want = content.tensor(&mut reader, &info.name, &Device::Cpu)?;
        assert_eq!(shape, want.shape().dims(), "{}", info.name);
        let want = want
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert!(
            bits(&got) == bits(&want),
            "{} differs from candle",
            info.name
        );
    }
    Ok(())
}
