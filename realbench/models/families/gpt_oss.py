"""gpt-oss (20B, 120B): attention with biases and a learnt sink logit per head, alternating over a
128-token window and the whole context; a mixture of experts with biases in every layer (top-k of
the router's scores, softmax over the picked ones), whose SwiGLU clamps its inputs
(swiglu_limit) and scales the gate's sigmoid (swiglu_alpha): the same shapes and FLOPs as
SwiGLU's. Priced in bf16 (the hub's experts are MXFP4; RL trainers train them in bf16); realbench's
runtime does not compute it.

Defaults: transformers' GptOssConfig (head_dim 64, sliding_window 128, even layers sliding,
attention_bias true, 4 experts a token).
"""

from __future__ import annotations

from realbench.models.families import Config, Family, attention_layers

DEFAULTS = {"rms_norm_eps": 1e-5, "rope_theta": 150000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "max_position_embeddings": 131072, "head_dim": 64, "sliding_window": 128, "num_experts_per_tok": 4,
            "output_router_logits": False, "router_aux_loss_coef": 0.001, "attention_bias": True}


def read_gpt_oss(cfg: Config) -> dict:
    n = cfg.int("num_hidden_layers")
    layers = attention_layers(cfg) if "layer_types" in cfg.raw else {
        "layer_types": tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)),
        "sliding_window": cfg.int("sliding_window")}
    bias = cfg.flag("attention_bias")
    aux = cfg.number("router_aux_loss_coef") if cfg.flag("output_router_logits") else 0.0
    return {**layers, "qkv_bias": bias, "o_bias": bias, "attention_sinks": True,
            "moe": {"experts": cfg.int("num_local_experts"), "top_k": cfg.int("num_experts_per_tok"),
                    "expert_ffn": cfg.int("intermediate_size"), "norm_topk_prob": True, "router_bias": True,
                    "expert_bias": True, "aux_loss_coef": aux}}


FAMILIES = (
    Family("gpt_oss", ("GptOssForCausalLM", "GptOssForSequenceClassification"), DEFAULTS, read_gpt_oss),
)
