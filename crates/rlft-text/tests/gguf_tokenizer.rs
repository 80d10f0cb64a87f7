//! Dev check (skipped unless its inputs exist): `build_bpe_tokenizer` on a real GGUF vocabulary
//! gives the ids transformers gives.
//!
//! Inputs, by environment variable:
//! - `RLFT_GGUF_TOKENIZER_DUMP`: the arrays of a GGUF, dumped by
//!   `scripts/reference/dump_gguf_tokenizer.py MODEL.gguf OUT.json` (required, else skipped);
//! - `RLFT_HF_TOKENIZER_DIR`: the same model's Hugging Face tokenizer directory (tokenizer.json),
//!   default `~/.cache/rlft/reference/smollm2-135m-instruct-hf` (made by
//!   `bash bench/reference/setup.sh`; compared when present);
//! - `RLFT_TOKENIZE_GOLDEN`: a golden.json with `tokenize` cases made by transformers, default
//!   tests/fixtures/smollm2/golden.json;
//! - `RLFT_GGUF_PRE`: overrides the dump's `tokenizer.ggml.pre` (to check the other
//!   pre-tokenizers against a reference built for that name);
//! - `RLFT_SAVE_TOKENIZER_TO`: when set, the GGUF-built bundle is also written there with
//!   `save_tokenizer_dir` (check it loads in transformers with
//!   `scripts/reference/check_saved_tokenizer.py`).
//!
//! SmolLM2: `python scripts/reference/dump_gguf_tokenizer.py
//! "$(./scripts/fetch-default-model.sh)" /tmp/smollm2_vocab.json
//! && RLFT_GGUF_TOKENIZER_DUMP=/tmp/smollm2_vocab.json cargo test --release -p rlft-text --test
//! gguf_tokenizer -- --nocapture`

use rlft_text::{load_tokenizer_dir, save_tokenizer_dir, BpeSpec, PreTokenizerKind, TextBundle};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

fn env_path(var: &str, default: Option<PathBuf>) -> Option<PathBuf> {
    std::env::var_os(var).map(PathBuf::from).or(default)
}

fn spec_from_dump(dump: &Value) -> BpeSpec {
    let strings = |key: &str| -> Vec<String> {
        dump[key]
            .as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let id = |key: &str| dump[key].as_u64().map(|v| v as u32);
    BpeSpec {
        model: dump["tokenizer.ggml.model"].as_str().map(str::to_string),
        tokens: strings("tokenizer.ggml.tokens"),
        merges: strings("tokenizer.ggml.merges"),
        token_types: dump["tokenizer.ggml.token_type"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_i64().unwrap() as i32).collect())
            .unwrap_or_default(),
        pre: dump["tokenizer.ggml.pre"].as_str().map(str::to_string),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: dump["tokenizer.ggml.add_bos_token"]
            .as_bool()
            .unwrap_or(false),
    }
}

/// Texts that stress pre-tokenization: digits, whitespace runs, CRLF, unicode, code, specials.
fn corpus() -> Vec<String> {
    let mut texts: Vec<String> = [
        "",
        " ",
        "   leading and trailing   ",
        "12345 + 678 = 13023; 3.14159; 1,000,000; -42; 0x1F; 2024-07-26",
        "x1 y22 z333 v4444 a 1 b  2 c\t3\n4",
        "line one\r\nline two\r\n\r\n\n\n   indented\n\t\ttabbed",
        "def f(x):\n    return x**2  # comment\n\nprint(f(3))",
        "Don't you'll we've I'M THEY'RE it's",
        "Héllo wörld! Ünïcödé: 日本語, 中文, 한국어, العربية, עברית, ελληνικά, русский",
        "emoji 🤗👍🏽👨‍👩‍👧 and symbols ©®™ ∑∫√ → ← ≠ ≤",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more<|im_end|><|im_start|><repo_name>x<file_sep>",
        "\\boxed{26} $\\frac{1}{2}$ ((10 - 3) + 13) * 2 / 7 % 3",
        "URL https://example.com/a?b=c&d=e#f and email a.b@c.de",
        "    \n    \n",
        "a\u{00a0}b\u{2003}c\u{200b}d",
        "e\u{301} vs é (combining accent vs precomposed)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let chat = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_golden.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(chat).unwrap()).unwrap();
    for case in golden["cases"].as_array().unwrap() {
        if let Some(text) = case["text"].as_str() {
            texts.push(text.to_string());
        }
    }
    for doc in ["src/chat.rs", "src/bpe.rs"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
        texts.push(std::fs::read_to_string(path).unwrap());
    }
    texts
}

#[test]
#[ignore = "dev check against a Python dump: set RLFT_GGUF_TOKENIZER_DUMP and run with --ignored"]
fn gguf_built_tokenizer_matches_transformers() {
    let dump_path = env_path("RLFT_GGUF_TOKENIZER_DUMP", None)
        .filter(|p| p.is_file())
        .expect("set RLFT_GGUF_TOKENIZER_DUMP (see the doc comment of this test)");
    let dump: Value = serde_json::from_str(&std::fs::read_to_string(&dump_path).unwrap()).unwrap();
    let mut spec = spec_from_dump(&dump);
    if let Ok(pre) = std::env::var("RLFT_GGUF_PRE") {
        spec.pre = Some(pre);
    }
    let digit_split = PreTokenizerKind::from_gguf_pre(spec.pre.as_deref()).unwrap()
        == PreTokenizerKind::DigitsGpt2;
    let template = dump["tokenizer.chat_template"].as_str().map(str::to_string);
    let bundle = TextBundle::from_bpe_spec(&spec, template).unwrap();
    eprintln!("built from {}: {bundle:?}", dump_path.display());

    let path = env_path("RLFT_TOKENIZE_GOLDEN", None)
        .unwrap_or_else(|| fixtures::fixture(fixtures::SMOLLM2_GOLDEN));
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = golden["tokenize"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            bundle.encode(text, true).unwrap(),
            want,
            "golden ids of {text:?}"
        );
        assert_eq!(
            bundle.decode(&want, false).unwrap(),
            text,
            "decode of {text:?}"
        );
    }
    eprintln!(
        "{} golden tokenize cases of {} match",
        cases.len(),
        path.display()
    );

    let hf_dir = env_path(
        "RLFT_HF_TOKENIZER_DIR",
        Some(fixtures::cache_root().join("reference/smollm2-135m-instruct-hf")),
    )
    .filter(|d| d.join("tokenizer.json").is_file());
    if let Some(dir) = hf_dir {
        // transformers 5.x's GGUF loader builds a plain GPT-2 ByteLevel pre-tokenizer for the
        // StarCoder-style `pre` names (`smollm`...), without the individual-digit split that
        // llama.cpp and the models' own tokenizer.json apply. A tokenizer.json it wrote as is
        // therefore differs from ours where a whitespace run precedes a digit (the reference's
        // directory does not: bench/reference/convert_gguf.py restores the split). Compare both
        // ways: where ours differs, the GPT-2 variant of our builder must match it exactly; the
        // differences of the real builder are counted and shown.
        let reference = load_tokenizer_dir(&dir).unwrap();
        let gpt2_variant = TextBundle::from_bpe_spec(
            &BpeSpec {
                pre: Some("gpt2".into()),
                ..spec.clone()
            },
            None,
        )
        .unwrap();
        let texts = corpus();
        let (mut total, mut differing) = (0, Vec::new());
        for text in &texts {
            for special in [false, true] {
                let want = reference.encode(text, special).unwrap();
                let ours = bundle.encode(text, special).unwrap();
                if ours != want {
                    assert!(
                        digit_split,
                        "ids of {text:?}: ours {ours:?} != reference {want:?}"
                    );
                    assert_eq!(
                        gpt2_variant.encode(text, special).unwrap(),
                        want,
                        "ids of {text:?} (add_special_tokens={special})"
                    );
                    if !special {
                        differing.push(text.clone());
                    }
                }
                total += want.len();
            }
            let ids = reference.encode(text, false).unwrap();
            for skip in [false, true] {
                assert_eq!(
                    bundle.decode(&ids, skip).unwrap(),
                    reference.decode(&ids, skip).unwrap()
                );
            }
        }
        if reference.special != Default::default() {
            assert_eq!(bundle.special, reference.special, "special tokens");
        }
        eprintln!(
            "{} texts ({total} tokens) vs {}: {} encode identically; {} differ only by the \
             individual-digit split (the GPT-2 variant matches them all)",
            texts.len(),
            dir.display(),
            texts.len() - differing.len(),
            differing.len()
        );
        for text in differing.iter().take(5) {
            let short: String = text.chars().take(60).collect();
            eprintln!("  differs: {short:?}");
        }
    }

    if let Some(out) = env_path("RLFT_SAVE_TOKENIZER_TO", None) {
        save_tokenizer_dir(&out, &bundle).unwrap();
        let reloaded = load_tokenizer_dir(&out).unwrap();
        for text in corpus() {
            assert_eq!(
                reloaded.encode(&text, true).unwrap(),
                bundle.encode(&text, true).unwrap()
            );
        }
        eprintln!("saved to {} and reloaded", out.display());
    }
}
