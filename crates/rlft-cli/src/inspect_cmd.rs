//! `rlft inspect`, `rlft tokenize`, `rlft logprobs`, `rlft convert`: the tools users reach for
//! when a reward or a template misbehaves.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use rlft_model::config::RopeScaling;
use rlft_model::decoder::Batch;
use rlft_model::export::save_hf_dir;
use rlft_model::trainable::{
    backward, make_trainable, masked_mean_nll, next_token_batch, sequence_logprobs,
};
use rlft_model::LoadedModel;
use rlft_text::Message;
use serde_json::json;

use crate::common::{chat_prompt_ids, load, ExportArgs, ModelArgs};

/// `rlft inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// HF model directory, .gguf file, or a built-in name (`default`, `qwen2.5-coder-0.5b`:
    /// `rlft fetch-model --list`).
    #[arg(required_unless_present = "runtime")]
    pub path: Option<String>,
    /// Print the CPU kernels' runtime instead: the Tuning switches in force (RLFT_SPIN,
    /// RLFT_MALLOC_TUNE, RLFT_AVX512, RLFT_OP_TIMES), the SIMD level the kernels use, threads.
    /// With a model path too, the model follows.
    #[arg(long)]
    pub runtime: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The kernels' runtime as `rlft inspect --runtime --json` prints it.
pub fn runtime_info() -> serde_json::Value {
    serde_json::to_value(rlft_kernels::runtime::Runtime::current()).unwrap_or_default()
}

/// Runs `rlft inspect`.
pub fn run_inspect(a: InspectArgs) -> Result<()> {
    if a.runtime {
        if a.json {
            println!("{}", serde_json::to_string_pretty(&runtime_info())?);
        } else {
            print!("{}", rlft_kernels::runtime::Runtime::current());
        }
    }
    let Some(path) = a.path.clone() else {
        return Ok(());
    };
    let m = load(&ModelArgs {
        model: path,
        base: None,
        dtype: "f32".into(),
        device: "cpu".into(),
    })?;
    let c = &m.model.config;
    let rope = match &c.rope.scaling {
        RopeScaling::Default => "default".to_string(),
        RopeScaling::Linear { factor } => format!("linear x{factor}"),
        RopeScaling::Llama3 {
            factor,
            original_max_position_embeddings,
            ..
        } => {
            format!("llama3 x{factor} (original context {original_max_position_embeddings})")
        }
        RopeScaling::Factors(f) => format!("per-frequency factors ({} values, from GGUF)", f.len()),
    };
    let special = |name: &str, tok: &Option<String>| json!({"role": name, "token": tok, "id": tok.as_deref().and_then(|t| m.text.token_id(t))});
    let sp = &m.text.special;
    let info = json!({
        "source": m.source.display().to_string(),
        "format": format!("{:?}", m.kind),
        "architecture": c.family.architecture(),
        "parameters": c.num_parameters(),
        "source_tensor_types": m.source_dtypes.iter().map(|(k, n)| json!({"type": k, "tensors": n})).collect::<Vec<_>>(),
        "loaded_dtype": format!("{:?}", m.model.dtype()),
        "vocab_size": c.vocab_size,
        "tokenizer_vocab_size": m.text.tokenizer.get_vocab_size(true),
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "layers": c.num_hidden_layers,
        "attention_heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rope_theta": c.rope.theta,
        "rope_scaling": rope,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
        "special_tokens": [special("bos", &sp.bos), special("eos", &sp.eos), special("pad", &sp.pad), special("unk", &sp.unk)],
        "generation_eos_token_ids": m.generation.eos_token_ids,
        "chat_template": m.text.chat_template,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let o = info.as_object().expect("object");
    for (k, v) in o {
        match k.as_str() {
            "chat_template" | "special_tokens" | "source_tensor_types" => continue,
            _ => println!(
                "{k:<26} {}",
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            ),
        }
    }
    let types: Vec<String> = m
        .source_dtypes
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    println!("{:<26} {}", "source_tensor_types", types.join(", "));
    for s in info["special_tokens"].as_array().expect("array") {
        println!(
            "{:<26} {} (id {})",
            format!("{}_token", s["role"].as_str().unwrap_or("")),
            s["token"],
            s["id"]
        );
    }
    match &m.text.chat_template {
        Some(t) => println!("chat_template:\n{t}"),
        None => println!("chat_template              (none)"),
    }
    Ok(())
}

/// `rlft tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to tokenize.
    pub text: String,
    /// Wrap the text as a user message in the chat template first.
    #[arg(long)]
    pub chat: bool,
    /// Add the tokenizer's special tokens (e.g. BOS) as `encode(add_special_tokens=True)`.
    #[arg(long)]
    pub add_special_tokens: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn input_ids(
    m: &rlft_model::LoadedModel,
    text: &str,
    chat: bool,
    special: bool,
) -> Result<Vec<u32>> {
    if chat {
        chat_prompt_ids(m, &[Message::user(text)])
    } else {
        Ok(m.text.encode(text, special)?)
    }
}

fn piece(m: &rlft_model::LoadedModel, id: u32) -> String {
    m.text.decode(&[id], false).unwrap_or_default()
}

/// Runs `rlft tokenize`.
pub fn run_tokenize(a: TokenizeArgs) -> Result<()> {
    let m = load(&a.model)?;
    let ids = input_ids(&m, &a.text, a.chat, a.add_special_tokens)?;
    if a.json {
        let pieces: Vec<String> = ids.iter().map(|&i| piece(&m, i)).collect();
        println!("{}", json!({"ids": ids, "pieces": pieces}));
        return Ok(());
    }
    println!("{} tokens", ids.len());
    for (i, &id) in ids.iter().enumerate() {
        println!("{i:>5} {id:>7} {:?}", piece(&m, id));
    }
    Ok(())
}

/// `rlft logprobs`.
#[derive(Args, Debug)]
pub struct LogprobsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to score (each token given the ones before it).
    #[arg(long)]
    pub text: String,
    /// Wrap the text as a user message in the chat template first.
    #[arg(long)]
    pub chat: bool,
    /// Also show the k most likely tokens at each position.
    #[arg(long, default_value_t = 0)]
    pub top: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write the gradient of the text's mean negative log-likelihood with respect to every
    /// weight to this safetensors file, under the weights' HF names (to check a device's
    /// backward pass against PyTorch's, as scripts/gpu-check.sh does).
    #[arg(long, value_name = "FILE")]
    pub grads: Option<PathBuf>,
}

/// Writes d(mean NLL of `ids`)/d(weight) for every weight of `m` to `path` (safetensors, f32,
/// HF names; written atomically); returns the loss.
fn write_grads(m: &mut LoadedModel, ids: &[u32], path: &Path) -> Result<f32> {
    let vars = make_trainable(&mut m.model, |_| true)?;
    let dev = m.model.device().clone();
    let nt = next_token_batch(&[ids.to_vec()], &[1], 0, &dev)?;
    let lp = sequence_logprobs(&m.model, &nt.batch, &nt.targets, true)?;
    let loss = masked_mean_nll(&lp, &nt.mask)?;
    let grads = backward(&loss, &vars)?;
    let mut out = Vec::new();
    for (name, var) in &vars {
        let Some(g) = grads.get(var.as_tensor()) else {
            bail!("weight {name} got no gradient");
        };
        out.push((
            name.clone(),
            g.to_dtype(DType::F32)?.to_device(&Device::Cpu)?,
        ));
    }
    rlft_model::safetensors_io::write_file(path, &out)?;
    Ok(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?)
}

/// Runs `rlft logprobs`.
pub fn run_logprobs(a: LogprobsArgs) -> Result<()> {
    let mut m = load(&a.model)?;
    let ids = input_ids(&m, &a.text, a.chat, false)?;
    if ids.len() < 2 {
        bail!(
            "the text has {} token(s); log-probs need at least 2",
            ids.len()
        );
    }
    let model = &m.model;
    let dev = model.device().clone();
    let batch = Batch::left_padded(std::slice::from_ref(&ids), &[0], 0, 0, &dev)?;
    let hidden = model.forward(&batch, None, false)?.squeeze(0)?;
    let n = ids.len() - 1;
    let rows = hidden.narrow(0, 0, n)?;
    let lp: Vec<f32> = model
        .target_logprobs(&rows, &Tensor::new(&ids[1..], &dev)?, 64)?
        .to_vec1()?;
    let top: Vec<Vec<(u32, f32)>> = if a.top > 0 {
        let logits = model.logits(&rows)?;
        let lsm = candle_nn_log_softmax(&logits)?;
        lsm.to_vec2::<f32>()?
            .into_iter()
            .map(|row| {
                let mut idx: Vec<usize> = (0..row.len()).collect();
                idx.select_nth_unstable_by(a.top - 1, |&x, &y| row[y].total_cmp(&row[x]));
                idx.truncate(a.top);
                idx.sort_by(|&x, &y| row[y].total_cmp(&row[x]));
                idx.into_iter().map(|i| (i as u32, row[i])).collect()
            })
            .collect()
    } else {
        vec![Vec::new(); n]
    };
    let total: f64 = lp.iter().map(|&x| x as f64).sum();
    let mean = total / n as f64;
    if let Some(path) = &a.grads {
        let loss = write_grads(&mut m, &ids, path)?;
        eprintln!(
            "wrote gradients of the mean NLL {loss:.6} to {}",
            path.display()
        );
    }
    if a.json {
        let tokens: Vec<_> = (0..ids.len())
            .map(|i| {
                let mut v = json!({"index": i, "id": ids[i], "piece": piece(&m, ids[i]),
                    "logprob": if i == 0 { None } else { Some(lp[i - 1]) }});
                if i > 0 && a.top > 0 {
                    v["top"] = json!(top[i - 1]
                        .iter()
                        .map(|(id, l)| json!({"id": id, "piece": piece(&m, *id), "logprob": l}))
                        .collect::<Vec<_>>());
                }
                v
            })
            .collect();
        println!(
            "{}",
            json!({"tokens": tokens, "sum_logprob": total, "mean_logprob": mean, "perplexity": (-mean).exp()})
        );
        return Ok(());
    }
    println!("{:>5} {:>7} {:>10}  piece", "index", "id", "logprob");
    for i in 0..ids.len() {
        let l = if i == 0 {
            "-".to_string()
        } else {
            format!("{:.4}", lp[i - 1])
        };
        let mut line = format!("{i:>5} {:>7} {l:>10}  {:?}", ids[i], piece(&m, ids[i]));
        if i > 0 && a.top > 0 {
            let alts: Vec<String> = top[i - 1]
                .iter()
                .map(|(id, l)| format!("{:?} {l:.2}", piece(&m, *id)))
                .collect();
            line.push_str(&format!("   top: {}", alts.join(", ")));
        }
        println!("{line}");
    }
    println!(
        "sum {total:.4}  mean {mean:.4}  perplexity {:.3}",
        (-mean).exp()
    );
    Ok(())
}

fn candle_nn_log_softmax(x: &Tensor) -> Result<Tensor> {
    let lse = x.log_sum_exp(candle_core::D::Minus1)?.unsqueeze(1)?;
    Ok(x.broadcast_sub(&lse)?)
}

/// `rlft convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub export: ExportArgs,
}

/// Runs `rlft convert`.
pub fn run_convert(a: ConvertArgs) -> Result<()> {
    let m = load(&a.model)?;
    let opts = a.export.options()?;
    save_hf_dir(&m.model, &m.text, &m.generation, &a.export.output, &opts)?;
    eprintln!("wrote {}", a.export.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `inspect --runtime --json` names every switch, the SIMD level and the threads.
    #[test]
    fn runtime_info_lists_switches_simd_and_threads() {
        let r = super::runtime_info();
        for k in ["spin", "malloc_tune", "avx512", "op_times"] {
            assert!(r["tuning"][k].is_boolean(), "tuning.{k}: {r}");
        }
        let simd = r["simd"].as_str().unwrap();
        assert!(["baseline", "avx2+fma", "avx512"].contains(&simd), "{simd}");
        assert!(r["threads"].as_u64().unwrap() >= 1);
    }
}
