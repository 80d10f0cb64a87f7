//! Byte-level BPE tokenizers built from the arrays a GGUF file stores (`tokenizer.ggml.tokens`,
//! `.merges`, `.token_type`, `.pre`), the way llama.cpp and transformers' GGUF loader read them.
//!
//! The GGUF parsing itself lives elsewhere (rlft-model); this module is a pure function of the
//! arrays. Only byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are supported:
//! SmolLM, Qwen2/2.5, Llama 3 and the other GPT-2-style families.

use crate::error::{Result, TextError};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp defines them.
pub mod token_type {
    /// An ordinary vocabulary token.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control (special) token such as `<|im_start|>`: matched whole, skipped when decoding
    /// with `skip_special_tokens`.
    pub const CONTROL: i32 = 3;
    /// A user-defined added token such as `<think>`: matched whole, but not special.
    pub const USER_DEFINED: i32 = 4;
    /// An unused slot.
    pub const UNUSED: i32 = 5;
    /// A raw byte token `<0xAB>` (sentencepiece vocabularies only).
    pub const BYTE: i32 = 6;
}

/// The split regex of Llama 3 (`tokenizer.ggml.pre = "llama-bpe"`), from its tokenizer.json.
pub const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of Qwen2 / Qwen2.5 / Qwen3 (`tokenizer.ggml.pre = "qwen2"`), from its tokenizer.json.
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is cut into chunks before BPE merges, chosen by `tokenizer.ggml.pre`.
///
/// BPE only merges within a chunk, so this decides the ids as much as the merges do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex (`ByteLevel(use_regex=true)`): `pre` absent, `"gpt2"` or `"default"`.
    Gpt2,
    /// Every digit its own chunk, then GPT-2's regex: `"smollm"` and the other StarCoder-style
    /// vocabularies (`"starcoder"`, `"refact"`, `"codeshell"`, `"exaone"`, `"minerva-7b"`).
    /// This is SmolLM2's own tokenizer.json: `Sequence[Digits(individual_digits=true),
    /// ByteLevel(add_prefix_space=false, use_regex=true)]`, and llama.cpp's split. (transformers
    /// 5.x's GGUF loader leaves the digit split out, so a tokenizer.json it converts from the
    /// GGUF gives other ids where a whitespace run precedes a digit, e.g. `"a  2"`, `"\n\n3"`.)
    DigitsGpt2,
    /// Qwen2's split regex, NFC normalization, then `ByteLevel(use_regex=false)`: `"qwen2"`,
    /// `"deepseek-r1-qwen"`. NFC is what Qwen's own tokenizer.json does (llama.cpp skips it,
    /// which only matters for text that is not already NFC).
    Qwen2,
    /// Llama 3's split regex, then `ByteLevel(use_regex=false)`, with `ignore_merges` (a chunk
    /// that is itself a token is kept whole, as Llama 3's tokenizer.json and llama.cpp do):
    /// `"llama-bpe"`, `"llama3"`, `"llama-v3"`, `"smaug-bpe"`, `"dbrx"`, `"falcon3"`.
    Llama3,
}

const PRE_NAMES: &[(&str, PreTokenizerKind)] = &[
    ("gpt2", PreTokenizerKind::Gpt2),
    ("default", PreTokenizerKind::Gpt2),
    ("smollm", PreTokenizerKind::DigitsGpt2),
    ("starcoder", PreTokenizerKind::DigitsGpt2),
    ("refact", PreTokenizerKind::DigitsGpt2),
    ("codeshell", PreTokenizerKind::DigitsGpt2),
    ("exaone", PreTokenizerKind::DigitsGpt2),
    ("minerva-7b", PreTokenizerKind::DigitsGpt2),
    ("qwen2", PreTokenizerKind::Qwen2),
    ("deepseek-r1-qwen", PreTokenizerKind::Qwen2),
    ("llama-bpe", PreTokenizerKind::Llama3),
    ("llama3", PreTokenizerKind::Llama3),
    ("llama-v3", PreTokenizerKind::Llama3),
    ("smaug-bpe", PreTokenizerKind::Llama3),
    ("dbrx", PreTokenizerKind::Llama3),
    ("falcon3", PreTokenizerKind::Llama3),
];

impl PreTokenizerKind {
    /// The kind for a `tokenizer.ggml.pre` value (`None` when the key is absent -> GPT-2).
    pub fn from_gguf_pre(pre: Option<&str>) -> Result<Self> {
        let Some(name) = pre else {
            return Ok(PreTokenizerKind::Gpt2);
        };
        PRE_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| TextError::UnsupportedPreTokenizer {
                name: name.to_string(),
                supported: PRE_NAMES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let split = |regex: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TextError::tokenizer("compiling the pre-tokenizer regex", e))?;
            Ok(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into())
        };
        match self {
            PreTokenizerKind::Gpt2 => Ok(ByteLevel::new(false, true, true).into()),
            PreTokenizerKind::DigitsGpt2 => Ok(Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into()),
            PreTokenizerKind::Qwen2 => split(QWEN2_SPLIT_REGEX),
            PreTokenizerKind::Llama3 => split(LLAMA3_SPLIT_REGEX),
        }
    }
}

/// The tokenizer arrays of a GGUF file (keys `tokenizer.ggml.*`).
#[derive(Debug, Clone, Default)]
pub struct BpeSpec {
    /// `tokenizer.ggml.model`; `None` or `"gpt2"` (byte-level BPE) are supported.
    pub model: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, index = token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (see [`token_type`]); may be empty.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.pre`, which selects the pre-tokenizer (see [`PreTokenizerKind`]).
    pub pre: Option<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: when true, `encode(text, add_special_tokens=true)`
    /// prepends the BOS token (Llama 3); SmolLM2 and Qwen2 set it false.
    pub add_bos: bool,
}

impl BpeSpec {
    /// The token string of an id, if the id is in range.
    pub fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }
}

fn invalid(reason: impl Into<String>, fix: impl Into<String>) -> TextError {
    TextError::InvalidVocab {
        reason: reason.into(),
        fix: fix.into(),
    }
}

/// GPT-2's byte -> printable character table (`bytes_to_unicode` in transformers/tiktoken).
pub(crate) fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid code point")
        };
    }
    table
}

/// Builds the `tokenizers::Tokenizer` a GGUF byte-level BPE vocabulary describes.
///
/// - Model: BPE over `tokens`/`merges`, no unknown token (every byte is in the vocabulary), no
///   dropout. A token not written in GPT-2's byte alphabet (llama.cpp stores a few raw) is
///   respelled into it, as transformers does, so the merges that name it still resolve.
/// - Pre-tokenizer: by `pre` (see [`PreTokenizerKind`]); decoder: ByteLevel.
/// - Post-processor: prepends BOS when `add_bos` (and `bos_id`) are set, otherwise adds nothing.
/// - Token type 3 (control) becomes a special added token, type 4 (user-defined) a non-special
///   added token (as in transformers' GGUF loader and the models' own tokenizer.json), so both are
///   matched whole in text (`<|im_start|>` is one id) and only type 3 is dropped by
///   `decode(ids, skip_special_tokens=true)`.
pub fn build_bpe_tokenizer(spec: &BpeSpec) -> Result<Tokenizer> {
    match spec.model.as_deref() {
        None | Some("gpt2") => {}
        Some(other) => {
            return Err(invalid(
                format!("tokenizer.ggml.model = {other:?} is not a byte-level BPE vocabulary"),
                "only `gpt2` vocabularies (SmolLM, Qwen2, Llama 3...) can be built from GGUF \
                 arrays; load this model from its Hugging Face directory (tokenizer.json) instead",
            ))
        }
    }
    if spec.tokens.is_empty() {
        return Err(invalid(
            "the vocabulary (tokenizer.ggml.tokens) is empty",
            "pass the GGUF's tokenizer.ggml.tokens array",
        ));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != spec.tokens.len() {
        return Err(invalid(
            format!(
                "{} token types for {} tokens",
                spec.token_types.len(),
                spec.tokens.len()
            ),
            "pass tokenizer.ggml.token_type unchanged (one entry per token), or an empty list",
        ));
    }
    for (role, id) in [
        ("bos", spec.bos_id),
        ("eos", spec.eos_id),
        ("unk", spec.unk_id),
        ("pad", spec.pad_id),
    ] {
        if let Some(id) = id {
            if id as usize >= spec.tokens.len() {
                return Err(invalid(
                    format!(
                        "{role} token id {id} is out of range (vocabulary has {} tokens)",
                        spec.tokens.len()
                    ),
                    format!("check tokenizer.ggml.{role}_token_id, or leave it unset"),
                ));
            }
        }
    }
    let kind = PreTokenizerKind::from_gguf_pre(spec.pre.as_deref())?;

    let spelling = bytes_to_unicode();
    let alphabet: std::collections::HashSet<char> = spelling.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab = Vocab::default();
    for (id, token) in spec.tokens.iter().enumerate() {
        let key = if in_alphabet(token) {
            token.clone()
        } else {
            token.bytes().map(|b| spelling[b as usize]).collect()
        };
        vocab.insert(key, id as u32);
    }
    let mut merges = Vec::with_capacity(spec.merges.len());
    for (i, merge) in spec.merges.iter().enumerate() {
        let mut parts = merge.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                merges.push((a.to_string(), b.to_string()))
            }
            _ => {
                return Err(invalid(
                    format!("merge #{i} {merge:?} is not two tokens separated by one space"),
                    "pass tokenizer.ggml.merges unchanged",
                ))
            }
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(kind == PreTokenizerKind::Llama3)
        .build()
        .map_err(|e| {
            invalid(
                format!("the BPE model could not be built: {e}"),
                "the merges must only name tokens of the vocabulary; pass the GGUF arrays unchanged",
            )
        })?;

    let mut tokenizer = Tokenizer::new(bpe);
    if kind == PreTokenizerKind::Qwen2 {
        tokenizer
            .with_normalizer(Some(NFC))
            .map_err(|e| TextError::tokenizer("setting the NFC normalizer", e))?;
    }
    tokenizer.with_pre_tokenizer(Some(kind.pre_tokenizer()?));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    if let (true, Some(bos)) = (spec.add_bos, spec.token(spec.bos_id)) {
        let processor = TemplateProcessing::builder()
            .try_single(format!("{bos} $A"))
            .and_then(|b| b.try_pair(format!("{bos} $A $B:1")))
            .map_err(|e| TextError::tokenizer("building the BOS post-processor", e))?
            .special_tokens(vec![(bos.to_string(), spec.bos_id.unwrap_or_default())])
            .build()
            .map_err(|e| TextError::tokenizer("building the BOS post-processor", e))?;
        tokenizer.with_post_processor(Some(processor));
    }

    let typed = |wanted: i32| {
        spec.tokens
            .iter()
            .zip(&spec.token_types)
            .filter(move |(t, ty)| **ty == wanted && in_alphabet(t))
            .map(|(t, _)| t.clone())
    };
    let control: Vec<AddedToken> = typed(token_type::CONTROL)
        .map(|t| AddedToken::from(t, true).normalized(false))
        .collect();
    let user: Vec<AddedToken> = typed(token_type::USER_DEFINED)
        .map(|t| AddedToken::from(t, false).normalized(false))
        .collect();
    tokenizer
        .add_special_tokens(control)
        .map_err(|e| TextError::tokenizer("adding control tokens", e))?;
    tokenizer
        .add_tokens(user)
        .map_err(|e| TextError::tokenizer("adding user-defined tokens", e))?;
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny byte-level vocabulary: all 256 byte tokens, a few merges, ChatML specials.
    pub(crate) fn tiny_spec(pre: &str) -> BpeSpec {
        let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
        let mut types = vec![token_type::CONTROL; 3];
        tokens.extend(bytes_to_unicode().iter().map(|c| c.to_string()));
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2",
        ];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("<think>".into());
        types.resize(tokens.len() - 1, token_type::NORMAL);
        types.push(token_type::USER_DEFINED);
        BpeSpec {
            model: Some("gpt2".into()),
            tokens,
            merges: merges.iter().map(|m| m.to_string()).collect(),
            token_types: types,
            pre: Some(pre.into()),
            bos_id: Some(1),
            eos_id: Some(2),
            unk_id: Some(0),
            pad_id: Some(2),
            add_bos: false,
        }
    }

    fn ids_to_tokens(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|i| tok.id_to_token(*i).unwrap()).collect()
    }

    #[test]
    fn merges_specials_and_round_trip() {
        let tok = build_bpe_tokenizer(&tiny_spec("smollm")).unwrap();
        let text = "<|im_start|>user\nhello world<|im_end|>";
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(
            ids_to_tokens(&tok, enc.get_ids()),
            [
                "<|im_start|>",
                "u",
                "s",
                "e",
                "r",
                "Ċ",
                "hello",
                "Ġworld",
                "<|im_end|>"
            ]
        );
        assert_eq!(enc.get_ids()[0], 1);
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        assert_eq!(
            tok.decode(enc.get_ids(), true).unwrap(),
            "user\nhello world"
        );
        // No BOS is added by the post-processor.
        assert_eq!(tok.encode("hello", true).unwrap().get_ids().len(), 1);
    }

    #[test]
    fn digits_are_split_individually_for_smollm_but_not_gpt2() {
        let smol = build_bpe_tokenizer(&tiny_spec("smollm")).unwrap();
        let ids = smol.encode("x 12", false).unwrap().get_ids().to_vec();
        assert_eq!(ids_to_tokens(&smol, &ids), ["x", "Ġ", "1", "2"]);
        let gpt2 = build_bpe_tokenizer(&tiny_spec("gpt2")).unwrap();
        let ids = gpt2.encode("x 12", false).unwrap().get_ids().to_vec();
        assert_eq!(ids_to_tokens(&gpt2, &ids), ["x", "Ġ", "12"]);
    }

    #[test]
    fn unicode_round_trips_through_bytes() {
        for pre in ["smollm", "qwen2", "llama-bpe", "gpt2"] {
            let tok = build_bpe_tokenizer(&tiny_spec(pre)).unwrap();
            let text = "Héllo wörld! 日本語 🤗\ttabs\n\n  end ";
            let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre={pre}");
        }
    }

    #[test]
    fn user_defined_tokens_are_whole_but_not_special() {
        let tok = build_bpe_tokenizer(&tiny_spec("qwen2")).unwrap();
        let ids = tok.encode("a<think>b", false).unwrap().get_ids().to_vec();
        assert_eq!(ids_to_tokens(&tok, &ids), ["a", "<think>", "b"]);
        assert_eq!(tok.decode(&ids, true).unwrap(), "a<think>b");
    }

    #[test]
    fn add_bos_prepends_bos() {
        let mut spec = tiny_spec("llama-bpe");
        spec.add_bos = true;
        let tok = build_bpe_tokenizer(&spec).unwrap();
        assert_eq!(
            tok.encode("hello", true).unwrap().get_ids(),
            [1, tok.token_to_id("hello").unwrap()]
        );
        assert_eq!(tok.encode("hello", false).unwrap().get_ids().len(), 1);
    }

    #[test]
    fn errors_are_explained() {
        let mut spec = tiny_spec("mystery");
        let err = build_bpe_tokenizer(&spec).unwrap_err().to_string();
        assert!(err.contains("mystery") && err.contains("smollm"), "{err}");
        spec.pre = None;
        spec.merges.push("nope".into());
        let err = build_bpe_tokenizer(&spec).unwrap_err().to_string();
        assert!(err.contains("merge #10"), "{err}");
        spec.merges.pop();
        spec.merges.push("zz qq".into());
        assert!(build_bpe_tokenizer(&spec).is_err());
        spec.merges.pop();
        spec.model = Some("llama".into());
        let err = build_bpe_tokenizer(&spec).unwrap_err().to_string();
        assert!(err.contains("Hugging Face directory"), "{err}");
        spec.model = None;
        spec.eos_id = Some(100_000);
        assert!(build_bpe_tokenizer(&spec)
            .unwrap_err()
            .to_string()
            .contains("eos"));
    }
}
