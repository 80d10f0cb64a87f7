//! A tokenizer with its special tokens and chat template ([`TextBundle`]), read from and written to
//! a Hugging Face model directory, or built from GGUF arrays.
//!
//! Files read: `tokenizer.json` (required), `tokenizer_config.json` (special tokens as strings or
//! `AddedToken` dicts, `chat_template` as a string or a list of named templates, `add_bos_token`,
//! `model_max_length`), `special_tokens_map.json` (older layouts), `chat_template.jinja` (written
//! by transformers 5; it wins over tokenizer_config's template) and
//! `additional_chat_templates/*.jinja`.

use crate::bpe::{build_bpe_tokenizer, BpeSpec};
use crate::chat::{ChatTemplate, RenderOptions, SpecialTokens};
use crate::error::{Result, TextError};
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;
use std::path::Path;
use tokenizers::Tokenizer;

/// Token ids with each token's byte range in the encoded text.
pub type IdsWithOffsets = (Vec<u32>, Vec<(usize, usize)>);

/// A tokenizer and what travels with it.
#[derive(Clone)]
pub struct TextBundle {
    /// The `tokenizers` tokenizer (model, pre-tokenizer, added tokens, decoder...).
    pub tokenizer: Tokenizer,
    /// The named special tokens (strings; look ids up with [`TextBundle::token_id`]).
    pub special: SpecialTokens,
    /// The default chat template, if any.
    pub chat_template: Option<String>,
    /// Other named chat templates (`tool_use`, `rag`...), by name.
    pub named_chat_templates: BTreeMap<String, String>,
    /// `add_bos_token` from tokenizer_config.json, when stated. Informational: BOS insertion is
    /// done (or not) by tokenizer.json's post-processor when encoding with special tokens.
    pub add_bos_token: Option<bool>,
    /// `model_max_length` from tokenizer_config.json, when a sensible integer.
    pub model_max_length: Option<u64>,
}

impl std::fmt::Debug for TextBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextBundle")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("special", &self.special)
            .field(
                "chat_template",
                &self.chat_template.as_ref().map(|t| t.len()),
            )
            .field("add_bos_token", &self.add_bos_token)
            .field("model_max_length", &self.model_max_length)
            .finish()
    }
}

fn io_err(action: &'static str, path: &Path, source: std::io::Error) -> TextError {
    TextError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn read_json(path: &Path) -> Result<Option<Map<String, Json>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", path, e)),
    };
    match serde_json::from_str(&text) {
        Ok(Json::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(TextError::InvalidConfig {
            path: path.to_path_buf(),
            reason: "the top level is not a JSON object".into(),
            fix: "regenerate it with transformers' save_pretrained".into(),
        }),
        Err(e) => Err(TextError::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!("not valid JSON ({e})"),
            fix: "regenerate it with transformers' save_pretrained".into(),
        }),
    }
}

fn read_optional_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path, e)),
    }
}

/// A special token as tokenizer_config.json writes it: a string, null, or an AddedToken dict.
fn token_string(value: Option<&Json>, key: &str, path: &Path) -> Result<Option<String>> {
    match value {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Object(m)) => match m.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(TextError::InvalidConfig {
                path: path.to_path_buf(),
                reason: format!("`{key}` is a dict without a string `content`"),
                fix: format!("write `{key}` as a string such as \"<|im_end|>\""),
            }),
        },
        Some(other) => Err(TextError::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!("`{key}` is {other}, expected a string"),
            fix: format!("write `{key}` as a string such as \"<|im_end|>\""),
        }),
    }
}

/// `chat_template` as a string, or `[{"name": ..., "template": ...}, ...]`.
fn chat_templates(
    value: Option<&Json>,
    path: &Path,
) -> Result<(Option<String>, BTreeMap<String, String>)> {
    let mut named = BTreeMap::new();
    match value {
        None | Some(Json::Null) => Ok((None, named)),
        Some(Json::String(s)) => Ok((Some(s.clone()), named)),
        Some(Json::Array(items)) => {
            for item in items {
                match (item.get("name"), item.get("template")) {
                    (Some(Json::String(n)), Some(Json::String(t))) => {
                        named.insert(n.clone(), t.clone());
                    }
                    _ => {
                        return Err(TextError::InvalidConfig {
                            path: path.to_path_buf(),
                            reason: "a `chat_template` list entry lacks string `name`/`template`"
                                .into(),
                            fix:
                                "write each entry as {\"name\": \"default\", \"template\": \"...\"}"
                                    .into(),
                        })
                    }
                }
            }
            Ok((named.remove("default"), named))
        }
        Some(other) => Err(TextError::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!("`chat_template` is {other}"),
            fix: "write `chat_template` as a string".into(),
        }),
    }
}

/// Reads a tokenizer directory written by transformers (`save_pretrained`) or downloaded from
/// the Hub. Only `tokenizer.json` is required.
pub fn load_tokenizer_dir(dir: impl AsRef<Path>) -> Result<TextBundle> {
    let dir = dir.as_ref();
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(TextError::MissingTokenizerJson {
            dir: dir.to_path_buf(),
        });
    }
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| TextError::tokenizer(format!("reading {}", tokenizer_path.display()), e))?;

    let config_path = dir.join("tokenizer_config.json");
    let config = read_json(&config_path)?.unwrap_or_default();
    let map_path = dir.join("special_tokens_map.json");
    let legacy_map = read_json(&map_path)?.unwrap_or_default();
    let special_token = |key: &str| -> Result<Option<String>> {
        match token_string(config.get(key), key, &config_path)? {
            Some(t) => Ok(Some(t)),
            None => token_string(legacy_map.get(key), key, &map_path),
        }
    };
    let special = SpecialTokens {
        bos: special_token("bos_token")?,
        eos: special_token("eos_token")?,
        unk: special_token("unk_token")?,
        pad: special_token("pad_token")?,
    };

    let (mut chat_template, mut named) = chat_templates(config.get("chat_template"), &config_path)?;
    if let Some(t) = read_optional_text(&dir.join("chat_template.jinja"))? {
        chat_template = Some(t);
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir).map_err(|e| io_err("list", &extra_dir, e))?;
        for entry in entries {
            let path = entry.map_err(|e| io_err("list", &extra_dir, e))?.path();
            if path.extension().is_some_and(|e| e == "jinja") {
                if let (Some(name), Some(text)) = (
                    path.file_stem().and_then(|s| s.to_str()),
                    read_optional_text(&path)?,
                ) {
                    named.insert(name.to_string(), text);
                }
            }
        }
    }

    let bundle = TextBundle {
        tokenizer,
        special,
        chat_template,
        named_chat_templates: named,
        add_bos_token: config.get("add_bos_token").and_then(Json::as_bool),
        model_max_length: config
            .get("model_max_length")
            .and_then(Json::as_u64)
            .filter(|n| *n < 1 << 40),
    };
    bundle.check_special_tokens()?;
    Ok(bundle)
}

/// Writes `tokenizer.json`, `tokenizer_config.json` and (when there is a template)
/// `chat_template.jinja` so that `transformers.AutoTokenizer.from_pretrained(dir)` loads the
/// same tokenizer (a `PreTrainedTokenizerFast`) and `apply_chat_template` uses the same template.
pub fn save_tokenizer_dir(dir: impl AsRef<Path>, bundle: &TextBundle) -> Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| io_err("create", dir, e))?;
    let tokenizer_path = dir.join("tokenizer.json");
    bundle
        .tokenizer
        .save(&tokenizer_path, true)
        .map_err(|e| TextError::tokenizer(format!("writing {}", tokenizer_path.display()), e))?;

    let mut added: Vec<_> = bundle
        .tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .collect();
    added.sort_by_key(|(id, _)| *id);
    let added_tokens_decoder: Map<String, Json> = added
        .into_iter()
        .map(|(id, t)| {
            let entry = json!({
                "content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special,
            });
            (id.to_string(), entry)
        })
        .collect();
    let mut config = Map::new();
    if let Some(add_bos) = bundle.add_bos_token {
        config.insert("add_bos_token".into(), add_bos.into());
    }
    config.insert("added_tokens_decoder".into(), added_tokens_decoder.into());
    for (key, token) in [
        ("bos_token", &bundle.special.bos),
        ("eos_token", &bundle.special.eos),
        ("pad_token", &bundle.special.pad),
        ("unk_token", &bundle.special.unk),
    ] {
        config.insert(key.into(), token.clone().map_or(Json::Null, Json::String));
    }
    if let Some(template) = &bundle.chat_template {
        let value = if bundle.named_chat_templates.is_empty() {
            Json::String(template.clone())
        } else {
            let mut list = vec![json!({"name": "default", "template": template})];
            list.extend(
                bundle
                    .named_chat_templates
                    .iter()
                    .map(|(n, t)| json!({"name": n, "template": t})),
            );
            Json::Array(list)
        };
        config.insert("chat_template".into(), value);
    }
    config.insert("clean_up_tokenization_spaces".into(), false.into());
    if let Some(n) = bundle.model_max_length {
        config.insert("model_max_length".into(), n.into());
    }
    config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
    let config_path = dir.join("tokenizer_config.json");
    let text = serde_json::to_string_pretty(&Json::Object(config)).expect("JSON of JSON values");
    std::fs::write(&config_path, text + "\n").map_err(|e| io_err("write", &config_path, e))?;

    // transformers 5 reads chat_template.jinja first: keep it in step with tokenizer_config.json.
    let jinja_path = dir.join("chat_template.jinja");
    match (
        &bundle.chat_template,
        bundle.named_chat_templates.is_empty(),
    ) {
        (Some(template), true) => {
            std::fs::write(&jinja_path, template).map_err(|e| io_err("write", &jinja_path, e))?
        }
        _ if jinja_path.exists() => {
            std::fs::remove_file(&jinja_path).map_err(|e| io_err("remove", &jinja_path, e))?
        }
        _ => {}
    }
    Ok(())
}

impl TextBundle {
    /// A bundle from GGUF arrays (see [`build_bpe_tokenizer`]) and the GGUF's
    /// `tokenizer.chat_template`.
    pub fn from_bpe_spec(spec: &BpeSpec, chat_template: Option<String>) -> Result<Self> {
        let tokenizer = build_bpe_tokenizer(spec)?;
        let name = |id| spec.token(id).map(str::to_string);
        Ok(TextBundle {
            tokenizer,
            special: SpecialTokens {
                bos: name(spec.bos_id),
                eos: name(spec.eos_id),
                unk: name(spec.unk_id),
                pad: name(spec.pad_id),
            },
            chat_template,
            named_chat_templates: BTreeMap::new(),
            add_bos_token: Some(spec.add_bos),
            model_max_length: None,
        })
    }

    fn check_special_tokens(&self) -> Result<()> {
        for (role, token) in [
            ("bos", &self.special.bos),
            ("eos", &self.special.eos),
            ("pad", &self.special.pad),
        ] {
            if let Some(token) = token {
                if self.tokenizer.token_to_id(token).is_none() {
                    return Err(TextError::UnknownSpecialToken {
                        role,
                        token: token.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The id of a token string (vocabulary or added token).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The BOS token id.
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos.as_deref().and_then(|t| self.token_id(t))
    }

    /// The EOS token id (generation stops on it).
    pub fn eos_id(&self) -> Option<u32> {
        self.special.eos.as_deref().and_then(|t| self.token_id(t))
    }

    /// The padding token id.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad.as_deref().and_then(|t| self.token_id(t))
    }

    /// Token ids of `text`. Use `add_special_tokens = false` for text rendered by a chat template
    /// (it already holds its special tokens; transformers does the same).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::tokenizer("encoding", e))
    }

    /// Token ids of `text` (no special tokens added) with each token's byte range in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> Result<IdsWithOffsets> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| TextError::tokenizer("encoding", e))?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Text of `ids`; `skip_special_tokens` drops control tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::tokenizer("decoding", e))
    }

    /// Compiles the default chat template (compile once and keep the result).
    pub fn compile_chat_template(&self) -> Result<ChatTemplate> {
        ChatTemplate::new(
            self.chat_template
                .clone()
                .ok_or(TextError::NoChatTemplate)?,
        )
    }

    /// Render options carrying this tokenizer's special tokens, as `apply_chat_template` passes
    /// them.
    pub fn render_options(&self, add_generation_prompt: bool) -> RenderOptions {
        RenderOptions {
            add_generation_prompt,
            special_tokens: self.special.clone(),
            ..Default::default()
        }
    }
}
