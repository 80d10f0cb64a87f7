//! Prints a GGUF file's metadata and tensor table, then dequantises every tensor and reports
//! the time taken.
//!
//! `cargo run --release -p rlft-gguf --example gguf_inspect -- model.gguf`

use std::time::Instant;

use rlft_gguf::{GgufFile, Value};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf_inspect FILE.gguf");
        std::process::exit(2);
    };
    let t0 = Instant::now();
    let file = match GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "GGUF v{} ({} bytes), {} metadata entries, {} tensors, alignment {}, data at {}; opened in {:.1} ms",
        file.version(),
        file.bytes().len(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment(),
        file.data_offset(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    for (key, value) in file.metadata().entries() {
        let shown = match value {
            Value::String(s) if s.len() > 80 => format!("string of {} bytes", s.len()),
            Value::Array(a) => format!("{} (first: {:?})", value.describe(), first(a)),
            _ => value.describe(),
        };
        println!("  {key}: {shown}");
    }
    let mut counts = std::collections::BTreeMap::new();
    for t in file.tensors() {
        *counts.entry(t.ggml_type.name()).or_insert(0usize) += 1;
    }
    println!("tensor types: {counts:?}");
    for t in file.tensors().iter().take(12) {
        println!("  {} {} {:?}", t.name, t.ggml_type, t.shape());
    }
    let mut elements = 0usize;
    let mut sum = 0f64;
    let mut dt = 0f64;
    for t in file.tensors() {
        let t0 = Instant::now();
        let result = file.read_f32(&t.name);
        dt += t0.elapsed().as_secs_f64();
        match result {
            Ok((_, data)) => {
                elements += data.len();
                sum += data.iter().map(|&x| f64::from(x)).sum::<f64>();
            }
            Err(e) => println!("  {e}"),
        }
    }
    println!(
        "dequantised {elements} elements in {:.1} ms ({:.0} M elements/s); checksum {sum:.6e}",
        dt * 1e3,
        elements as f64 / dt / 1e6
    );
}

fn first(a: &rlft_gguf::Array) -> String {
    use rlft_gguf::Array::*;
    match a {
        String(v) => format!("{:?}", v.iter().take(3).collect::<Vec<_>>()),
        I32(v) => format!("{:?}", v.iter().take(3).collect::<Vec<_>>()),
        F32(v) => format!("{:?}", v.iter().take(3).collect::<Vec<_>>()),
        other => format!("{:?}", other.element_type()),
    }
}
