"""LLaMA (Llama 2, 3, 3.1, 3.2, 3.3) and Mistral: grouped-query attention, SwiGLU, RMSNorm.

Defaults: transformers' LlamaConfig (rms_norm_eps 1e-6, rope_theta 10^4, untied) and MistralConfig
(sliding_window 4096 where the key is left out: Mistral-7B-v0.1's window; v0.2 on write null).
Llama 3.1+ stretch the rotary embedding with rope_type llama3 (factor 8, low_freq_factor 1,
high_freq_factor 4 over 8,192 original positions), which the runtime computes. `attention_bias`
puts biases on q, k, v and o (priced; the runtime computes q, k, v biases only, Qwen2's).
"""

from __future__ import annotations

from realbench.models.families import DENSE_LAYER, Config, Family, attention_layers, refuse_foreign_keys

LLAMA_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
                  "max_position_embeddings": 2048}
MISTRAL_DEFAULTS = {**LLAMA_DEFAULTS, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                    "sliding_window": 4096}


def read_llama(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "LLaMA")
    cfg.refuse_true("mlp_bias", "biases in the MLP are not priced")
    bias = cfg.flag("attention_bias")
    return {"qkv_bias": bias, "o_bias": bias}


def read_mistral(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Mistral", window=True)
    return attention_layers(cfg, default_kind="sliding_attention")


FAMILIES = (
    Family("llama", ("LlamaForCausalLM", "LlamaForSequenceClassification"), LLAMA_DEFAULTS, read_llama, runs=True,
           layer_tensors=DENSE_LAYER),
    Family("mistral", ("MistralForCausalLM", "MistralForSequenceClassification"), MISTRAL_DEFAULTS, read_mistral,
           runs=True, layer_tensors=DENSE_LAYER),
)
