//! From configs (and their datasets) to what the memory plan (`rlft_plan`) reads: the model's
//! dimensions, the lengths a run will see, and the value and reward models' shapes.

use rlft_model::ModelConfig;
use rlft_plan::ModelDims;

/// The dimensions of `c` that memory depends on.
pub fn model_dims(c: &ModelConfig) -> ModelDims {
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
