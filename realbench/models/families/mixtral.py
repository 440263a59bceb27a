"""Mixtral (8x7B, 8x22B): Mistral's attention and a mixture of num_local_experts SwiGLU experts in
every layer (softmax over the router's scores, top num_experts_per_tok renormalized to 1, always).

Defaults: transformers' MixtralConfig (rms_norm_eps 1e-5, rope_theta 10^6, no sliding window,
router_aux_loss_coef 0.001 applied only with output_router_logits). The hub's tensors:
block_sparse_moe.gate (the router) and block_sparse_moe.experts.<j>.w1 (gate), w3 (up), w2 (down).
A router_jitter_noise above 0 multiplies the router's input by noise in training: refused.
"""

from __future__ import annotations

from realbench.models.families import DENSE_LAYER, Config, Family, attention_layers

MIXTRAL_DEFAULTS = {"rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": False, "hidden_act": "silu",
                    "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "sliding_window": None,
                    "num_experts_per_tok": 2, "num_local_experts": 8, "output_router_logits": False,
                    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0}
MIXTRAL_LAYER = {**{k: v for k, v in DENSE_LAYER.items() if k.startswith(("input", "post", "self_attn"))
                    and "bias" not in k}, "block_sparse_moe.gate.weight": "moe.router.weight"}
MIXTRAL_EXPERT = {"w1.weight": "w_gate.weight", "w3.weight": "w_up.weight", "w2.weight": "w_down.weight"}


def read_mixtral(cfg: Config) -> dict:
    cfg.refuse_true("router_jitter_noise", "noise on the router's input in training is not computed")
    aux = cfg.number("router_aux_loss_coef") if cfg.flag("output_router_logits") else 0.0
    return {**attention_layers(cfg, default_kind="sliding_attention"),
            "moe": {"experts": cfg.int("num_local_experts"), "top_k": cfg.int("num_experts_per_tok"),
                    "expert_ffn": cfg.int("intermediate_size"), "norm_topk_prob": True, "aux_loss_coef": aux}}


FAMILIES = (
    Family("mixtral", ("MixtralForCausalLM", "MixtralForSequenceClassification"), MIXTRAL_DEFAULTS, read_mixtral,
           runs=True, layer_tensors=MIXTRAL_LAYER, expert_prefix="block_sparse_moe.experts",
           expert_tensors=MIXTRAL_EXPERT),
)
