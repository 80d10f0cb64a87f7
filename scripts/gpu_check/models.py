"""Random models for the GPU check, written with PyTorch and transformers as HF directories that
rlft loads too: a byte-level tokenizer (259 tokens: <unk> <s> </s> and the 256 bytes, no merges)
with a small chat template, and a model of random weights (transformers' own initialiser, seeded).

Tiny models mirror rlft's `tiny_config` (crates/rlft-model/src/tiny.rs): vocab 320, hidden 64,
2 layers, GQA 4/2; Llama with Llama-3 rope scaling and an untied head, Qwen2 tied with q/k/v
biases, Qwen3 with q/k norms and head_dim 32 != 64/4. `qwen25_3b` is Qwen2.5-3B-Instruct's shape
(config.json of the Hub model: 36 layers, hidden 2048, MLP 11008, 16/2 heads, vocab 151936,
tied embeddings) with random weights; `qwen25_3b_tiny` is the same family at tiny size, for
--device cpu runs of the same code path.
"""

import os

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>"]


def tokenizer():
    """A byte-level BPE tokenizer without merges: every byte is a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def config(name):
    """The transformers config of a named model (see the module doc)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if name == "llama":
        return LlamaConfig(**common, head_dim=16, tie_word_embeddings=False, rope_theta=10000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64})
    if name == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
    if name == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=False, rope_theta=1e6)
    if name == "qwen25_3b_tiny":
        return Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
    if name == "qwen25_3b":
        return Qwen2Config(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                           num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                           max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                           tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                           pad_token_id=2)
    raise ValueError(f"unknown model {name}")


def write(name, out_dir, dtype, device, seed=0):
    """Writes model `name` with random weights (dtype "float32" or "bfloat16", made on `device`)
    and the byte tokenizer to `out_dir`; returns out_dir."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = config(name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    if name != "qwen25_3b":
        # Larger weights than transformers' std 0.02, so log-probs are far from uniform and a
        # wrong op shows.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer().save_pretrained(out_dir)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out_dir
