"""Qwen2 and Qwen2.5 (LLaMA's computation with biases on q, k and v), and Qwen2-MoE (Qwen1.5-MoE,
Qwen2-57B-A14B: a mixture of experts with a shared expert whose output a sigmoid gate scales).

Defaults: transformers' Qwen2Config and Qwen2MoeConfig (rms_norm_eps 1e-6, no sliding window unless
use_sliding_window, then from layer max_window_layers on; Qwen2-MoE's norm_topk_prob false).
"""

from __future__ import annotations

from realbench.models.families import DENSE_LAYER, Config, Family, qwen_window_layers, refuse_foreign_keys

QWEN2_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
                  "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
                  "max_window_layers": 28}
QWEN2_MOE_DEFAULTS = {**QWEN2_DEFAULTS, "decoder_sparse_step": 1, "num_experts": 60, "norm_topk_prob": False,
                      "output_router_logits": False, "router_aux_loss_coef": 0.001, "qkv_bias": True}


def read_qwen2(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Qwen2", window=True)
    return {"qkv_bias": True, **qwen_window_layers(cfg)}


def sparse_layers(cfg: Config) -> tuple[int, ...]:
    """The dense layers of a Qwen MoE: those in mlp_only_layers and those off the decoder_sparse_step
    (transformers' Qwen2MoeDecoderLayer: a layer is sparse unless listed or (i + 1) % step != 0)."""
    n, step = cfg.int("num_hidden_layers"), cfg.int("decoder_sparse_step")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(not isinstance(i, int) for i in only):
        raise cfg.error("mlp_only_layers", f"{only!r} is not a list of layer numbers")
    return tuple(i for i in range(n) if i in only or (i + 1) % step)


def qwen_moe(cfg: Config, shared: bool) -> dict:
    """A Qwen mixture of experts (Qwen2-MoE, Qwen3-MoE, Qwen3-Next): softmax routing over num_experts,
    num_experts_per_tok picked, renormalized with norm_topk_prob; the load-balancing loss where
    output_router_logits turns it on."""
    aux = cfg.number("router_aux_loss_coef") if cfg.flag("output_router_logits") else 0.0
    # (transformers 5 writes num_experts as num_local_experts)
    experts = cfg.int("num_experts" if "num_experts" in cfg or "num_local_experts" not in cfg else "num_local_experts")
    return {"experts": experts, "top_k": cfg.int("num_experts_per_tok"),
            "expert_ffn": cfg.int("moe_intermediate_size"), "norm_topk_prob": cfg.flag("norm_topk_prob"),
            "aux_loss_coef": aux, "dense_layers": sparse_layers(cfg),
            **({"shared_ffn": cfg.int("shared_expert_intermediate_size"), "shared_gate": True} if shared else {})}


def read_qwen2_moe(cfg: Config) -> dict:
    return {"qkv_bias": cfg.flag("qkv_bias"), **qwen_window_layers(cfg), "moe": qwen_moe(cfg, shared=True)}


FAMILIES = (
    Family("qwen2", ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"), QWEN2_DEFAULTS, read_qwen2, runs=True,
           layer_tensors=DENSE_LAYER),
    Family("qwen2_moe", ("Qwen2MoeForCausalLM", "Qwen2MoeForSequenceClassification"), QWEN2_MOE_DEFAULTS,
           read_qwen2_moe),
)
