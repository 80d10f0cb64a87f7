//! The shape of a run: the model's dimensions, what trains, the trainer's shapes, and the
//! tensors they make. Everything the memory of a run depends on besides [`super::Environment`].

use serde::Serialize;

use rlft_model::ModelConfig;

use super::activations::{head_kernel, HeadKernel, Kernels, Pass};
use super::critic::CriticShape;
use super::preference::{self, DpoShape, RewardModelShape};
use super::reward::ModelRewardShape;

/// The dimensions of a decoder-only model that memory depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelDims {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size `h`.
    pub hidden: usize,
    /// MLP intermediate size.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// LM head tied to the embeddings (no `lm_head.weight`).
    pub tied_embeddings: bool,
    /// q/k/v biases (Qwen2).
    pub qkv_bias: bool,
    /// o_proj bias.
    pub o_bias: bool,
    /// MLP biases.
    pub mlp_bias: bool,
    /// q/k norms (Qwen3).
    pub qk_norm: bool,
}

impl ModelDims {
    /// The dimensions of `c`.
    pub fn from_config(c: &ModelConfig) -> Self {
        ModelDims {
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            tied_embeddings: c.tie_word_embeddings,
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias && c.family != rlft_model::Family::Qwen2,
            mlp_bias: c.mlp_bias,
            qk_norm: c.family.has_qk_norm(),
        }
    }

    /// `heads x head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// `kv_heads x head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `(module, out, in)` of one layer's linear layers, in [`rlft_model::lora::LORA_MODULES`]
    /// order.
    pub fn linears(&self) -> [(&'static str, usize, usize); 7] {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        [
            ("self_attn.q_proj", q, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, q),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ]
    }

    /// Parameters of one decoder layer: linear weights and biases, norms.
    pub fn layer_params(&self) -> usize {
        let (h, i, q, kv) = (self.hidden, self.intermediate, self.q_dim(), self.kv_dim());
        let weights: usize = self.linears().iter().map(|(_, o, i)| o * i).sum();
        let mut biases = 0;
        if self.qkv_bias {
            biases += q + 2 * kv;
        }
        if self.o_bias {
            biases += h;
        }
        if self.mlp_bias {
            biases += 2 * i + h;
        }
        let norms = 2 * h + if self.qk_norm { 2 * self.head_dim } else { 0 };
        weights + biases + norms
    }

    /// Every parameter `P` (a tied head counted once), as `CausalLm::named_weights` holds them.
    pub fn num_parameters(&self) -> usize {
        let embed = self.vocab * self.hidden;
        let head = if self.tied_embeddings { 0 } else { embed };
        embed + head + self.layers * self.layer_params() + self.hidden
    }

    /// Elements of the largest weight tensor (the embedding, or a large MLP matrix).
    pub fn largest_tensor(&self) -> usize {
        (self.vocab * self.hidden).max(self.intermediate * self.hidden)
    }
}

/// LoRA adapters: rank and the modules they sit on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraShape {
    /// Rank `r`.
    pub r: usize,
    /// Adapted modules, entries of [`rlft_model::lora::LORA_MODULES`].
    pub modules: Vec<&'static str>,
    /// `lora_dropout > 0` (the fused op then keeps a mask per adapted module).
    pub dropout: bool,
}

/// What trains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tuning {
    /// Every weight (trainable copies of all `P`).
    Full,
    /// LoRA adapters over frozen weights.
    Lora(LoraShape),
}

impl Tuning {
    /// Trainable parameters `T`.
    pub fn trainable_params(&self, dims: &ModelDims) -> usize {
        match self {
            Tuning::Full => dims.num_parameters(),
            Tuning::Lora(l) => {
                let per_layer: usize = dims
                    .linears()
                    .iter()
                    .filter(|(m, _, _)| l.modules.contains(m))
                    .map(|(_, o, i)| l.r * (o + i))
                    .sum();
                dims.layers * per_layer
            }
        }
    }

    /// Parameters of the weights an adapter changes (what merging copies).
    pub fn merged_params(&self, dims: &ModelDims) -> usize {
        match self {
            Tuning::Full => 0,
            Tuning::Lora(l) => {
                let per_layer: usize = dims
                    .linears()
                    .iter()
                    .filter(|(m, _, _)| l.modules.contains(m))
                    .map(|(_, o, i)| o * i)
                    .sum();
                dims.layers * per_layer
            }
        }
    }
}

/// A GRPO run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrpoShape {
    /// Completions per prompt `G`.
    pub num_generations: usize,
    /// Prompts per rollout.
    pub rollout_prompts: usize,
    /// Completions per rollout.
    pub rollout_completions: usize,
    /// Prompt tokens (the longest prompt of the dataset, or `max_prompt_length`).
    pub prompt_tokens: usize,
    /// `max_completion_length`.
    pub completion_tokens: usize,
    /// `beta > 0`: a reference log-prob pass (and with full fine-tuning a reference copy).
    pub reference: bool,
    /// More than one optimiser step per rollout: an old-policy log-prob pass.
    pub old_logprobs: bool,
    /// One prompt pass per distinct prompt of a micro-batch.
    pub share_prompts: bool,
    /// `temperature != 1`: the head's input rows are scaled.
    pub temperature_scaled: bool,
    /// Eval generation, when the run has eval prompts.
    pub eval: Option<EvalPrompts>,
    /// PPO's critic (`advantage_estimator = "gae"`, `value_model`).
    pub critic: Option<CriticShape>,
    /// `[[rewards]] type = "model"`: reward models scoring each rollout.
    pub reward_models: Vec<ModelRewardShape>,
    /// Online DPO (`OnlineDpoConfig::online`): groups of two completions, and the config's
    /// `per_device_train_batch_size` counts prompts (half the completions of a micro-batch).
    pub online_dpo: bool,
}

/// Eval prompts of a GRPO run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EvalPrompts {
    /// Prompts (a run generates for up to 16 at once).
    pub prompts: usize,
    /// Tokens of the longest.
    pub prompt_tokens: usize,
}

/// An SFT run's shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SftShape {
    /// Tokens of the longest example (or `max_length`); a micro-batch feeds one fewer.
    pub example_tokens: usize,
    /// Eval loss passes run (before and after training).
    pub eval: bool,
}

/// The trainer and its shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// `rlft grpo`.
    Grpo(GrpoShape),
    /// `rlft sft`.
    Sft(SftShape),
    /// `rlft dpo`.
    Dpo(DpoShape),
    /// `rlft reward-model`.
    RewardModel(RewardModelShape),
}

/// Everything about a run that its memory depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunShape {
    /// bf16 weights and activations (else f32).
    pub bf16: bool,
    /// Full fine-tuning or LoRA.
    pub tuning: Tuning,
    /// `per_device_train_batch_size`.
    pub micro_batch: usize,
    /// `gradient_accumulation_steps`.
    pub accumulation: usize,
    /// `gradient_checkpointing`: layer inputs kept, layers recomputed in the backward.
    pub gradient_checkpointing: bool,
    /// The trainer and its shapes.
    pub workload: Workload,
}

impl RunShape {
    /// Bytes per weight.
    pub fn weight_bytes(&self) -> u64 {
        if self.bf16 {
            2
        } else {
            4
        }
    }

    /// The training kernels (CPU): fused for f32, candle's composites for bf16.
    pub fn kernels(&self) -> Kernels {
        if self.bf16 {
            Kernels::Composite
        } else {
            Kernels::Fused
        }
    }

    /// The head the update reads: the LM head for the kernels, the score head for the reward
    /// model.
    pub fn head(&self) -> HeadKernel {
        match self.workload {
            Workload::RewardModel(_) => HeadKernel::Score,
            _ => head_kernel(self.kernels()),
        }
    }

    /// Distinct prompts in the worst micro-batch of a rollout (groups of `G` completions are
    /// contiguous; micro-batches are consecutive runs of `micro_batch` completions).
    pub fn prompts_per_micro_batch(&self) -> usize {
        let Workload::Grpo(g) = &self.workload else {
            return self.micro_batch;
        };
        let (b, gsz) = (self.micro_batch.max(1), g.num_generations.max(1));
        (0..g.rollout_completions.max(b))
            .step_by(b)
            .map(|s| (s + b - 1) / gsz - s / gsz + 1)
            .max()
            .unwrap_or(1)
    }

    /// The forward passes of one micro-batch, the head's rows and the shared-prompt gather.
    pub fn micro_batch_passes(&self) -> (Vec<Pass>, usize, Option<(usize, usize)>) {
        let b = self.micro_batch;
        match &self.workload {
            Workload::Grpo(g) => {
                let (p, c) = (g.prompt_tokens, g.completion_tokens);
                if g.share_prompts {
                    let ts = c.saturating_sub(1).max(1);
                    let passes = vec![
                        Pass {
                            name: "prompt pass (one per distinct prompt)",
                            rows: self.prompts_per_micro_batch(),
                            tokens: p,
                            keys: p,
                        },
                        Pass {
                            name: "completion pass",
                            rows: b,
                            tokens: ts,
                            keys: p + ts,
                        },
                    ];
                    (passes, b * c, Some((b, p)))
                } else {
                    let t = p + c - 1;
                    let passes = vec![Pass {
                        name: "prompt + completion rows",
                        rows: b,
                        tokens: t,
                        keys: t,
                    }];
                    (passes, b * c, None)
                }
            }
            Workload::Sft(s) => {
                let t = s.example_tokens.saturating_sub(1).max(1);
                let passes = vec![Pass {
                    name: "example rows",
                    rows: b,
                    tokens: t,
                    keys: t,
                }];
                (passes, b * t, None)
            }
            Workload::Dpo(d) => preference::dpo_passes(b, d),
            Workload::RewardModel(r) => {
                let (passes, rows) = preference::reward_model_passes(b, r);
                (passes, rows, None)
            }
        }
    }
}

/// Elements of every weight tensor (`CausalLm::named_weights`: a tied head once).
pub fn weight_tensors(dims: &ModelDims) -> Vec<u64> {
    let (h, v) = (dims.hidden as u64, dims.vocab as u64);
    let mut out = vec![v * h];
    if !dims.tied_embeddings {
        out.push(v * h);
    }
    let (q, kv, i) = (
        dims.q_dim() as u64,
        dims.kv_dim() as u64,
        dims.intermediate as u64,
    );
    for _ in 0..dims.layers {
        out.extend(dims.linears().iter().map(|(_, o, i)| (o * i) as u64));
        out.extend([h, h]);
        if dims.qk_norm {
            out.extend([dims.head_dim as u64; 2]);
        }
        if dims.qkv_bias {
            out.extend([q, kv, kv]);
        }
        if dims.o_bias {
            out.push(h);
        }
        if dims.mlp_bias {
            out.extend([i, i, h]);
        }
    }
    out.push(h);
    out
}

/// Elements of every trainable tensor.
pub fn trainable_tensors(dims: &ModelDims, tuning: &Tuning) -> Vec<u64> {
    match tuning {
        Tuning::Full => weight_tensors(dims),
        Tuning::Lora(l) => {
            let mut out = Vec::new();
            for _ in 0..dims.layers {
                for (m, o, i) in dims.linears() {
                    if l.modules.contains(&m) {
                        out.push((l.r * i) as u64);
                        out.push((o * l.r) as u64);
                    }
                }
            }
            out
        }
    }
}
