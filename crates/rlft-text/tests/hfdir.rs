//! Reading and writing Hugging Face tokenizer directories.

use rlft_text::{
    load_tokenizer_dir, save_tokenizer_dir, token_type, BpeSpec, Message, TextBundle, TextError,
};
use serde_json::json;
use std::path::Path;

const TEMPLATE: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's byte alphabet: the characters byte-level vocabularies are written in.
fn byte_alphabet() -> Vec<String> {
    let mut n = 0;
    (0..=255u32)
        .map(|b| {
            let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

fn tiny_bundle() -> TextBundle {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    tokens.extend(byte_alphabet());
    let merges = ["h i", "Ġ t", "h e", "Ġt he"];
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    let mut types = vec![token_type::CONTROL; 3];
    types.resize(tokens.len(), token_type::NORMAL);
    let spec = BpeSpec {
        model: Some("gpt2".into()),
        tokens,
        merges: merges.map(String::from).to_vec(),
        token_types: types,
        pre: Some("smollm".into()),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        pad_id: Some(2),
        add_bos: false,
    };
    TextBundle::from_bpe_spec(&spec, Some(TEMPLATE.into())).unwrap()
}

fn write(path: &Path, value: &serde_json::Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

#[test]
fn save_then_load_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let mut bundle = tiny_bundle();
    bundle.model_max_length = Some(8192);
    save_tokenizer_dir(dir.path(), &bundle).unwrap();
    let loaded = load_tokenizer_dir(dir.path()).unwrap();
    assert_eq!(loaded.special, bundle.special);
    assert_eq!(loaded.chat_template.as_deref(), Some(TEMPLATE));
    assert_eq!(loaded.add_bos_token, Some(false));
    assert_eq!(loaded.model_max_length, Some(8192));
    assert_eq!(
        (loaded.bos_id(), loaded.eos_id(), loaded.pad_id()),
        (Some(1), Some(2), Some(2))
    );
    let text = "<|im_start|>hi the 12<|im_end|>";
    assert_eq!(
        loaded.encode(text, true).unwrap(),
        bundle.encode(text, true).unwrap()
    );
    assert_eq!(
        loaded.encode(text, false).unwrap()[..2],
        [1, loaded.token_id("hi").unwrap()]
    );

    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(
        config["added_tokens_decoder"]["1"]["content"],
        "<|im_start|>"
    );
    assert_eq!(config["added_tokens_decoder"]["1"]["special"], true);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("chat_template.jinja")).unwrap(),
        TEMPLATE
    );

    // The template renders with the bundle's special tokens.
    let chat = loaded.compile_chat_template().unwrap();
    let prompt = chat
        .render(&[Message::user("hi")], &loaded.render_options(true))
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn reads_transformers_config_variants() {
    let dir = tempfile::tempdir().unwrap();
    save_tokenizer_dir(dir.path(), &tiny_bundle()).unwrap();
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    let added = |content: &str| {
        json!({"__type": "AddedToken", "content": content, "lstrip": false, "normalized": false,
               "rstrip": false, "single_word": false})
    };
    write(
        &dir.path().join("tokenizer_config.json"),
        &json!({
            "bos_token": added("<|im_start|>"),
            "eos_token": added("<|im_end|>"),
            "pad_token": null,
            "add_bos_token": true,
            "model_max_length": 1e30,
            "chat_template": [
                {"name": "default", "template": "DEFAULT"},
                {"name": "tool_use", "template": "TOOLS"}
            ]
        }),
    );
    write(
        &dir.path().join("special_tokens_map.json"),
        &json!({"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
    );
    let b = load_tokenizer_dir(dir.path()).unwrap();
    assert_eq!(b.special.bos.as_deref(), Some("<|im_start|>"));
    assert_eq!(
        b.special.eos.as_deref(),
        Some("<|im_end|>"),
        "config wins over the map"
    );
    assert_eq!(
        b.special.unk.as_deref(),
        Some("<|endoftext|>"),
        "map fills the gaps"
    );
    assert_eq!(b.special.pad, None);
    assert_eq!(b.add_bos_token, Some(true));
    assert_eq!(b.model_max_length, None);
    assert_eq!(b.chat_template.as_deref(), Some("DEFAULT"));
    assert_eq!(b.named_chat_templates["tool_use"], "TOOLS");

    // transformers 5 layout: chat_template.jinja wins; additional templates by file name.
    std::fs::write(dir.path().join("chat_template.jinja"), "FROM JINJA").unwrap();
    std::fs::create_dir(dir.path().join("additional_chat_templates")).unwrap();
    std::fs::write(
        dir.path().join("additional_chat_templates/rag.jinja"),
        "RAG",
    )
    .unwrap();
    let b = load_tokenizer_dir(dir.path()).unwrap();
    assert_eq!(b.chat_template.as_deref(), Some("FROM JINJA"));
    assert_eq!(b.named_chat_templates["rag"], "RAG");

    // Saving named templates uses the list form and no chat_template.jinja.
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("chat_template.jinja"), "STALE").unwrap();
    save_tokenizer_dir(out.path(), &b).unwrap();
    assert!(!out.path().join("chat_template.jinja").exists());
    let again = load_tokenizer_dir(out.path()).unwrap();
    assert_eq!(again.chat_template.as_deref(), Some("FROM JINJA"));
    assert_eq!(again.named_chat_templates, b.named_chat_templates);
}

#[test]
fn errors_name_the_problem_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_tokenizer_dir(dir.path()).unwrap_err();
    assert!(matches!(err, TextError::MissingTokenizerJson { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.path().display().to_string()) && msg.contains("save_pretrained"),
        "{msg}"
    );

    save_tokenizer_dir(dir.path(), &tiny_bundle()).unwrap();
    write(
        &dir.path().join("tokenizer_config.json"),
        &json!({"eos_token": "<|not_there|>"}),
    );
    let msg = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("<|not_there|>") && msg.contains("eos_token"),
        "{msg}"
    );

    std::fs::write(dir.path().join("tokenizer_config.json"), "{ not json").unwrap();
    let msg = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("tokenizer_config.json") && msg.contains("not valid JSON"),
        "{msg}"
    );

    write(
        &dir.path().join("tokenizer_config.json"),
        &json!({"bos_token": 3}),
    );
    let msg = load_tokenizer_dir(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("bos_token"), "{msg}");

    let mut no_template = tiny_bundle();
    no_template.chat_template = None;
    assert!(matches!(
        no_template.compile_chat_template(),
        Err(TextError::NoChatTemplate)
    ));
}
