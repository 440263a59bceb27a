"""Qwen3-Next: three linear-attention layers (Gated DeltaNet, a fixed state per sequence in place of
a KV cache) to every full-attention layer (gated: a second query projection's sigmoid scales the
output; q/k norms; a quarter of each head rotates), and a mixture of experts with a gated shared
expert. Priced; realbench's runtime does not compute it.

Defaults: transformers' Qwen3NextConfig (head_dim 256, full_attention_interval 4, partial_rotary_factor
0.25, linear heads 16 keys / 32 values of 128, conv kernel 4, norm_topk_prob true).
"""

from __future__ import annotations

from realbench.models.families import Config, Family, attention_layers
from realbench.models.families.qwen2 import qwen_moe

DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "max_position_embeddings": 32768, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "decoder_sparse_step": 1, "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "partial_rotary_factor": 0.25, "full_attention_interval": 4}


def read_qwen3_next(cfg: Config) -> dict:
    return {**hybrid_attention(cfg), "moe": qwen_moe(cfg, shared=True)}


def hybrid_attention(cfg: Config) -> dict:
    """Qwen3-Next's and Qwen3.5's attention: linear-attention layers between gated full-attention
    ones (layer_types, or every full_attention_interval-th layer full)."""
    cfg.refuse_true("attention_bias", "biases in the attention are not priced")
    n = cfg.int("num_hidden_layers")
    if "layer_types" in cfg.raw:
        kinds = attention_layers(cfg).get("layer_types", ())
    else:
        every = cfg.int("full_attention_interval")
        kinds = tuple("linear_attention" if (i + 1) % every else "full_attention" for i in range(n))
    return {"qk_norm": True, "attn_output_gate": True, "layer_types": kinds,
            "linear_attention": {"key_heads": cfg.int("linear_num_key_heads"),
                                 "value_heads": cfg.int("linear_num_value_heads"),
                                 "key_head_dim": cfg.int("linear_key_head_dim"),
                                 "value_head_dim": cfg.int("linear_value_head_dim"),
                                 "conv_kernel": cfg.int("linear_conv_kernel_dim")}}


FAMILIES = (
    Family("qwen3_next", ("Qwen3NextForCausalLM", "Qwen3NextForSequenceClassification"), DEFAULTS, read_qwen3_next),
)
