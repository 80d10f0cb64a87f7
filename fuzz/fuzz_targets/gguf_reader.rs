//! Feeds arbitrary bytes to the GGUF reader and, when they parse, dequantises every tensor
//! and exercises the metadata getters. Any panic, out-of-bounds access or abort is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlft_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else {
        return;
    };
    let m = file.metadata();
    for (key, _) in m.entries() {
        let _ = (m.get_str(key), m.get_u32(key), m.get_f32(key));
        let _ = (m.get_string_array(key), m.get_i32_array(key));
    }
    for info in file.tensors() {
        let _ = (info.shape(), info.n_elements(), info.size_in_bytes());
        if let Ok((shape, values)) = file.read_f32(&info.name) {
            assert_eq!(shape.iter().product::<usize>(), values.len());
        }
    }
});
